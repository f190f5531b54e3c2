/* Truncated BPTT (lightning_ortho.online.TruncatedBPTT) on the tanh cell h' = tanh(W_h h + W_x x + b): its step
 * and its summed gradient through the window, each in one call.
 *
 * The window of a stream holds its last n <= k steps, oldest first: inputs (n, I), starts (n, H) (the state each
 * step started from) and cut (n,) (no gradient flows into starts[j]: the stream was reset before step j). The
 * gradient replays the window from starts[0] with the current parameters (entering starts[j] wherever cut[j]) and
 * backpropagates g = dL/dh_t through it, from the newest step, with d = 1 - h_out^2:
 *     dz = delta * d,   grad_W_h += dz h_in^T,   grad_W_x += dz x^T,   grad_b += dz,   delta = W_h^T dz
 * stopping at the oldest step or at a cut. A stream reset since its last step (cut_next) holds a constant state:
 * no gradient.
 *
 * The replay costs as much as the reverse pass (a tanh per state entry, and libm's tanh is slow), and where the
 * window's steps were all taken with the current parameters it recomputes states the window already holds: the
 * state after step j is starts[j + 1] (where no reset came between them) and after the last step h. So the step
 * keeps a snapshot of the parameters it used, [vec(W_h), vec(W_x), b, fresh] (P + 1 values): fresh counts the
 * steps taken with exactly these parameters (compared bit for bit), each from the state the one before returned
 * (`continuing`, which the caller knows); the gradient, on the state the last step returned, takes the stored
 * states when the parameters are still those bits and fresh covers the window, and replays otherwise (after an
 * optimiser update, a reset, a loaded state). Both give the same numbers to rounding.
 *
 * Arrays are C-contiguous; bool arrays are one byte per entry (torch.bool). No fast-math, so a NaN or inf in an
 * input reaches the returned sums, which the callers check. */
#include <math.h>
#include <string.h>

#include "tanh_cell.h"
#include "vector_clones.h"

/* Values of the gradient's scratch that live on its stack (32 KiB of doubles) where they fit; more come from the
 * caller. */
#define SMALL_SCRATCH 4096

#define DEFINE_KERNELS(T, SUFFIX, TANH)                                                                               \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                 \
                                                                                                                      \
    /* Whether the parameters are bit for bit the first P values of snapshot. */                                      \
    static inline int same_parameters_##SUFFIX(const T *restrict w_hh, const T *restrict w_ih,                        \
                                               const T *restrict bias, const T *restrict snapshot, long hidden,       \
                                               long n_inputs) {                                                       \
        const long hh = hidden * hidden, ih = hidden * n_inputs;                                                      \
        return !memcmp(snapshot, w_hh, hh * sizeof(T)) && !memcmp(snapshot + hh, w_ih, ih * sizeof(T)) &&             \
               !memcmp(snapshot + hh + ih, bias, hidden * sizeof(T));                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* The step of every stream: h_new = tanh(W_h h + W_x x + b), and the window (inputs, starts, cut: n steps)       \
     * shifted by one step into (new_inputs, new_starts, new_cut: keep + 1 steps), its last `keep` old steps          \
     * first (keep = n below k, k - 1 once full), then (x, h, cut_next). The snapshot (P + 1,) counts this step       \
     * (fresh + 1, at most k) when `continuing` and the parameters are its bits, else takes them (fresh = 1).         \
     * Returns the sum of x, h_new, new_inputs and new_starts in double (NaN/inf when one of them is not finite, or   \
     * the sum overflowed). */                                                                                        \
    VECTOR_CLONES                                                                                                     \
    double tbptt_tanh_step_##SUFFIX(const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias,           \
                                    const T *restrict x, const T *restrict h, const T *restrict inputs,               \
                                    const T *restrict starts, const unsigned char *restrict cut,                      \
                                    const unsigned char *restrict cut_next, long batch, long hidden, long n_inputs,   \
                                    long window, long keep, long k, int continuing, T *restrict snapshot,             \
                                    T *restrict h_new, T *restrict new_inputs, T *restrict new_starts,                \
                                    unsigned char *restrict new_cut) {                                                \
        tanh_cell_##SUFFIX(w_hh, w_ih, bias, x, h, batch, hidden, n_inputs, h_new);                                   \
        const long hh = hidden * hidden, ih = hidden * n_inputs, size = hh + ih + hidden;                             \
        if (continuing && same_parameters_##SUFFIX(w_hh, w_ih, bias, snapshot, hidden, n_inputs)) {                   \
            snapshot[size] = snapshot[size] < k ? snapshot[size] + 1 : (T)k;                                          \
        } else {                                                                                                      \
            memcpy(snapshot, w_hh, hh * sizeof(T));                                                                   \
            memcpy(snapshot + hh, w_ih, ih * sizeof(T));                                                              \
            memcpy(snapshot + hh + ih, bias, hidden * sizeof(T));                                                     \
            snapshot[size] = 1;                                                                                       \
        }                                                                                                             \
        const long kept = window - keep; /* the first old step kept */                                                \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const long in_size = keep * n_inputs, start_size = keep * hidden;                                         \
            T *restrict inputs_out = new_inputs + b * (keep + 1) * n_inputs;                                          \
            T *restrict starts_out = new_starts + b * (keep + 1) * hidden;                                            \
            if (keep) {                                                                                               \
                memcpy(inputs_out, inputs + (b * window + kept) * n_inputs, in_size * sizeof(T));                     \
                memcpy(starts_out, starts + (b * window + kept) * hidden, start_size * sizeof(T));                    \
                memcpy(new_cut + b * (keep + 1), cut + b * window + kept, keep);                                      \
            }                                                                                                         \
            memcpy(inputs_out + in_size, x + b * n_inputs, n_inputs * sizeof(T));                                     \
            memcpy(starts_out + start_size, h + b * hidden, hidden * sizeof(T));                                      \
            new_cut[b * (keep + 1) + keep] = cut_next[b];                                                             \
            /* x is in the new window too: its sum is the sum of x and of the window's inputs. */                     \
            T row = 0;                                                                                                \
            _Pragma("omp simd reduction(+ : row)") for (long j = 0; j < in_size + n_inputs; ++j) row +=               \
                inputs_out[j];                                                                                        \
            T states = 0;                                                                                             \
            _Pragma("omp simd reduction(+ : states)") for (long j = 0; j < start_size + hidden; ++j) states +=        \
                starts_out[j];                                                                                        \
            T fresh = 0;                                                                                              \
            _Pragma("omp simd reduction(+ : fresh)") for (long j = 0; j < hidden; ++j) fresh +=                       \
                h_new[b * hidden + j];                                                                                \
            total += (double)row + (double)states + (double)fresh;                                                    \
        }                                                                                                             \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* The summed gradient into out (P,) = [vec(W_h) (H H), vec(W_x) (H I), b (H)] from the windows: inputs           \
     * (B, n, I), starts (B, n, H), cut (B, n), cut_next (B,), the state h (B, H) and grad_h (B, H); the snapshot     \
     * as the step that made the window left it, read where `continuing` (the window and h are what that step         \
     * returned); scratch holds n (B + 1) H + B (H + I) + H values, or is NULL where they fit in SMALL_SCRATCH        \
     * (then on the stack: no allocation for the caller). Returns the sum of grad_h and of out in double              \
     * (NaN/inf when one of them is not finite).                                                                      \
     * The replay steps all streams at once, window step by window step: the cell's step takes a runtime batch (where \
     * GCC 12 sees a batch of 1 it leaves the cell's dot products scalar). The reverse pass goes stream by stream:    \
     * dz at every step it reaches, then the outer products added row by row (each row of out read and written once   \
     * per stream, not once per step). */                                                                             \
    VECTOR_CLONES                                                                                                     \
    double tbptt_tanh_gradient_##SUFFIX(const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias,       \
                                        const T *restrict inputs, const T *restrict starts,                           \
                                        const unsigned char *restrict cut, const unsigned char *restrict cut_next,    \
                                        const T *restrict h, const T *restrict grad_h, long batch, long hidden,       \
                                        long n_inputs, long window, int continuing, const T *restrict snapshot,       \
                                        T *restrict scratch, T *restrict out) {                                       \
        const long size = hidden * (hidden + n_inputs + 1);                                                           \
        T *restrict out_hh = out;                                                                                     \
        T *restrict out_ih = out + hidden * hidden;                                                                   \
        T *restrict out_b = out_ih + hidden * n_inputs;                                                               \
        T local[SMALL_SCRATCH]; /* (unused where the caller gives scratch) */                                         \
        T *restrict states = scratch ? scratch : local; /* (n, B, H): the replayed state after each step */           \
        T *restrict dz = states + window * batch * hidden; /* (n, H): dL/dz at each step of one stream */             \
        T *restrict entering = dz + window * hidden;      /* (B, H): the states entering a replayed step */           \
        T *restrict step_inputs = entering + batch * hidden; /* (B, I): its inputs */                                 \
        T *restrict delta = step_inputs + batch * n_inputs;  /* (H,): dL/dh_out of the step backpropagated */         \
        /* Every step of the window was taken with these parameters (bit for bit): its states are the replay's. */    \
        const int stored = continuing && snapshot[size] >= window &&                                                  \
                           same_parameters_##SUFFIX(w_hh, w_ih, bias, snapshot, hidden, n_inputs);                    \
        for (long p = 0; p < size; ++p) out[p] = 0;                                                                   \
        /* The replay (unless stored): the state entering step j is starts[j] at j = 0 and at a cut, else the state   \
         * after step j - 1. */                                                                                       \
        for (long j = 0; j < window && !stored; ++j) {                                                                \
            for (long b = 0; b < batch; ++b) {                                                                        \
                const long at = b * window + j;                                                                       \
                const T *restrict source =                                                                            \
                    (j == 0 || cut[at]) ? starts + at * hidden : states + ((j - 1) * batch + b) * hidden;             \
                memcpy(entering + b * hidden, source, hidden * sizeof(T));                                            \
                memcpy(step_inputs + b * n_inputs, inputs + at * n_inputs, n_inputs * sizeof(T));                     \
            }                                                                                                         \
            tanh_cell_##SUFFIX(w_hh, w_ih, bias, step_inputs, entering, batch, hidden, n_inputs,                      \
                               states + j * batch * hidden);                                                          \
        }                                                                                                             \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict g = grad_h + b * hidden;                                                                \
            T g_sum = 0;                                                                                              \
            _Pragma("omp simd reduction(+ : g_sum)") for (long i = 0; i < hidden; ++i) g_sum += g[i];                 \
            total += (double)g_sum;                                                                                   \
            if (cut_next[b] || window == 0) continue; /* reset since its last step (a constant state), or no steps */ \
            const T *restrict xs = inputs + b * window * n_inputs;                                                    \
            const T *restrict hs = starts + b * window * hidden;                                                      \
            const unsigned char *restrict cuts = cut + b * window;                                                    \
            for (long i = 0; i < hidden; ++i) delta[i] = g[i];                                                        \
            long first = 0; /* the oldest step the pass reaches */                                                    \
            for (long j = window - 1; j >= 0; --j) {                                                                  \
                const T *restrict h_out = !stored ? states + (j * batch + b) * hidden                                 \
                                          : j == window - 1 ? h + b * hidden                                          \
                                                            : hs + (j + 1) * hidden;                                  \
                T *restrict dz_j = dz + j * hidden;                                                                   \
                for (long i = 0; i < hidden; ++i) dz_j[i] = delta[i] * (1 - h_out[i] * h_out[i]);                     \
                if (j == 0 || cuts[j]) { /* no gradient flows into a constant: the pass ends here */                  \
                    first = j;                                                                                        \
                    break;                                                                                            \
                }                                                                                                     \
                for (long m = 0; m < hidden; ++m) delta[m] = 0;                                                       \
                for (long i = 0; i < hidden; ++i) {                                                                   \
                    const T *restrict row = w_hh + i * hidden;                                                        \
                    const T d = dz_j[i];                                                                              \
                    _Pragma("omp simd") for (long m = 0; m < hidden; ++m) delta[m] += row[m] * d;                     \
                }                                                                                                     \
            }                                                                                                         \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                T *restrict row_hh = out_hh + i * hidden;                                                             \
                T *restrict row_ih = out_ih + i * n_inputs;                                                           \
                T row_b = 0;                                                                                          \
                for (long j = first; j < window; ++j) {                                                               \
                    const T d = dz[j * hidden + i];                                                                   \
                    const T *restrict h_in = stored || j == 0 || cuts[j] ? hs + j * hidden                            \
                                                                          : states + ((j - 1) * batch + b) * hidden;  \
                    const T *restrict x = xs + j * n_inputs;                                                          \
                    _Pragma("omp simd") for (long m = 0; m < hidden; ++m) row_hh[m] += d * h_in[m];                   \
                    _Pragma("omp simd") for (long m = 0; m < n_inputs; ++m) row_ih[m] += d * x[m];                    \
                    row_b += d;                                                                                       \
                }                                                                                                     \
                out_b[i] += row_b;                                                                                    \
            }                                                                                                         \
        }                                                                                                             \
        T out_sum = 0;                                                                                                \
        _Pragma("omp simd reduction(+ : out_sum)") for (long p = 0; p < size; ++p) out_sum += out[p];                 \
        return total + (double)out_sum;                                                                               \
    }

DEFINE_KERNELS(float, float32, tanh_cell_tanhf)
DEFINE_KERNELS(double, float64, tanh)
