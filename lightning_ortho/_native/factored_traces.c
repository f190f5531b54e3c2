/* The factored traces of RFLO (Murray 2019) and SnAp-1 (Menick et al. 2021) on the tanh cell
 * h' = tanh(W_h h + W_x x + b), each step and each summed estimate in one call.
 *
 * Both keep, per stream, one row per unit over W = [W_h W_x b]: a trace (B, H, H + I + 1) whose entry (i, j) is the
 * influence of W[i, j] on unit i alone. With a = [h; x; 1] and d = 1 - h'^2:
 *     RFLO:    E'[i, j] = decay E[i, j] + (rate d_i) a_j                  (decay = 1 - 1/tau, rate = 1/tau)
 *     SnAp-1:  m'[i, j] = d_i (W_h[i, i] m[i, j] + a_j)                   (J[i, i] = d_i W_h[i, i], the one entry of
 *                                                                          the recurrent Jacobian the pattern reads)
 * and the estimate of both, summed over the streams, is sum_b diag(g_b) E_b, written straight into the parameters'
 * flat layout [vec(W_h), vec(W_x), b] (each row-major).
 *
 * Every step writes h' and the new trace into fresh arrays (the state passed in is read only) and returns the sum of
 * x, h' and the new trace; the gradient returns the sum of grad_h and the estimate. No fast-math: a NaN or inf
 * anywhere makes the returned sum NaN or inf, which the callers take as the step's (the gradient's) NaN/inf verdict.
 * A sum of finite entries may also overflow (the callers' careful checks then look entry by entry). All arrays are
 * C-contiguous.
 */
#include <math.h>

#include "tanh_cell.h"
#include "vector_clones.h"

/* What a step reads besides the state and x, set by the caller once and again whenever a parameter moves: passed as
 * one pointer, it saves the call the conversion of seven arguments (about half a microsecond at every step). */
typedef struct {
    const void *w_hh, *w_ih, *bias; /* (H, H), (H, I), (H,) of the step's type */
    long hidden, inputs;            /* H, I */
    double decay, rate;             /* RFLO's 1 - 1/tau and 1/tau (SnAp-1 reads neither) */
} factored_setup;

/* A step's and a gradient's own arguments, packed by the caller in one buffer (one ctypes argument instead of six:
 * ctypes converts each argument in Python). Native sizes and alignment: Python's struct "@5Pl". */
typedef struct {
    const void *x, *h, *trace; /* (B, I), (B, H), (B, H, H + I + 1) */
    void *h_new, *trace_new;   /* outputs, of the shapes of h and trace */
    long batch;                /* B */
} factored_step_arguments;

typedef struct {
    const void *trace, *grad_h;    /* (B, H, H + I + 1), (B, H) */
    void *out_hh, *out_ih, *out_b; /* (H, H), (H, I), (H,) */
    long batch;                    /* B */
} factored_gradient_arguments;

#define INLINE_BODY static inline __attribute__((always_inline))

#define DEFINE_KERNELS(T, SUFFIX, TANH)                                                                               \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                 \
                                                                                                                      \
    /* The sum of v (n,) in double, for a verdict: in 16 lanes, which the loop keeps in independent vector registers  \
     * (one accumulator would wait on its own adds: the sum would take as long as the rest of a step). */            \
    static inline double sum_##SUFFIX(const T *restrict v, long n) {                                                  \
        T lanes[16] = {0};                                                                                            \
        long k = 0;                                                                                                   \
        for (; k + 16 <= n; k += 16) {                                                                                \
            _Pragma("omp simd") for (long l = 0; l < 16; ++l) lanes[l] += v[k + l];                                   \
        }                                                                                                             \
        T rest = 0;                                                                                                   \
        for (; k < n; ++k) rest += v[k];                                                                              \
        double total = rest;                                                                                          \
        for (long l = 0; l < 16; ++l) total += lanes[l];                                                              \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* RFLO's step: h_new (B, H) and trace_new (B, H, H + I + 1) from trace (B, H, H + I + 1). Returns the sum of x,  \
     * h_new and trace_new. */                                                                                        \
    INLINE_BODY                                                                                                       \
    double rflo_tanh_step_body_##SUFFIX(const factored_setup *setup, const T *restrict x, const T *restrict h,             \
                                   const T *restrict trace, long batch, T *restrict h_new, T *restrict trace_new) {   \
        const long hidden = setup->hidden, inputs = setup->inputs, columns = hidden + inputs + 1;                     \
        const T decay = (T)setup->decay, rate = (T)setup->rate; /* as PyTorch takes a Python float: in T */           \
        tanh_cell_##SUFFIX(setup->w_hh, setup->w_ih, setup->bias, x, h, batch, hidden, inputs, h_new);                \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict hb = h + b * hidden;                                                                    \
            const T *restrict xb = x + b * inputs;                                                                    \
            const T *restrict yb = h_new + b * hidden;                                                                \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T *restrict old = trace + (b * hidden + i) * columns;                                           \
                T *restrict row = trace_new + (b * hidden + i) * columns;                                             \
                const T scale = rate * (1 - yb[i] * yb[i]); /* (1/tau) d_i */                                         \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row[j] = decay * old[j] + scale * hb[j];        \
                _Pragma("omp simd") for (long j = 0; j < inputs; ++j) {                                               \
                    row[hidden + j] = decay * old[hidden + j] + scale * xb[j];                                        \
                }                                                                                                     \
                row[hidden + inputs] = decay * old[hidden + inputs] + scale;                                          \
            }                                                                                                         \
        }                                                                                                             \
        return sum_##SUFFIX(x, batch * inputs) + sum_##SUFFIX(h_new, batch * hidden) +                                \
               sum_##SUFFIX(trace_new, batch * hidden * columns);                                                     \
    }                                                                                                                 \
                                                                                                                      \
    /* SnAp-1's step: h_new (B, H) and influence_new (B, H, H + I + 1) from influence (B, H, H + I + 1). Returns the  \
     * sum of x, h_new and influence_new. */                                                                          \
    INLINE_BODY                                                                                                       \
    double snap1_tanh_step_body_##SUFFIX(const factored_setup *setup, const T *restrict x, const T *restrict h,            \
                                    const T *restrict influence, long batch, T *restrict h_new,                       \
                                    T *restrict influence_new) {                                                      \
        const long hidden = setup->hidden, inputs = setup->inputs, columns = hidden + inputs + 1;                     \
        const T *restrict w_hh = setup->w_hh;                                                                         \
        tanh_cell_##SUFFIX(w_hh, setup->w_ih, setup->bias, x, h, batch, hidden, inputs, h_new);                       \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict hb = h + b * hidden;                                                                    \
            const T *restrict xb = x + b * inputs;                                                                    \
            const T *restrict yb = h_new + b * hidden;                                                                \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T *restrict old = influence + (b * hidden + i) * columns;                                       \
                T *restrict row = influence_new + (b * hidden + i) * columns;                                         \
                const T slope = 1 - yb[i] * yb[i]; /* d_i */                                                          \
                const T self_loop = w_hh[i * hidden + i];                                                             \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row[j] = slope * (self_loop * old[j] + hb[j]);  \
                _Pragma("omp simd") for (long j = 0; j < inputs; ++j) {                                               \
                    row[hidden + j] = slope * (self_loop * old[hidden + j] + xb[j]);                                  \
                }                                                                                                     \
                row[hidden + inputs] = slope * (self_loop * old[hidden + inputs] + 1);                                \
            }                                                                                                         \
        }                                                                                                             \
        return sum_##SUFFIX(x, batch * inputs) + sum_##SUFFIX(h_new, batch * hidden) +                                \
               sum_##SUFFIX(influence_new, batch * hidden * columns);                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* The summed estimate sum_b diag(grad_h_b) trace_b of a trace (B, H, H + I + 1), by parameter: W_h into out_hh   \
     * (H, H), W_x into out_ih (H, I), b into out_b (H,) (three allocations, or the parts of one (P,) laid out as     \
     * [vec(W_h), vec(W_x), b]). Returns the sum of grad_h and of the estimate. */                                    \
    INLINE_BODY                                                                                                       \
    double factored_gradient_body_##SUFFIX(const factored_setup *setup, const T *restrict trace,                          \
                                      const T *restrict grad_h, long batch, T *restrict out_hh,                       \
                                      T *restrict out_ih, T *restrict out_b) {                                        \
        const long hidden = setup->hidden, inputs = setup->inputs, columns = hidden + inputs + 1;                     \
        for (long i = 0; i < hidden; ++i) {                                                                           \
            T *restrict row_hh = out_hh + i * hidden;                                                                 \
            T *restrict row_ih = out_ih + i * inputs;                                                                 \
            const T *restrict row = trace + i * columns;                                                              \
            const T g = grad_h[i];                                                                                    \
            _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row_hh[j] = g * row[j];                             \
            _Pragma("omp simd") for (long j = 0; j < inputs; ++j) row_ih[j] = g * row[hidden + j];                    \
            out_b[i] = g * row[hidden + inputs];                                                                      \
            for (long b = 1; b < batch; ++b) {                                                                        \
                const T *restrict other = trace + (b * hidden + i) * columns;                                         \
                const T gb = grad_h[b * hidden + i];                                                                  \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row_hh[j] += gb * other[j];                     \
                _Pragma("omp simd") for (long j = 0; j < inputs; ++j) row_ih[j] += gb * other[hidden + j];            \
                out_b[i] += gb * other[hidden + inputs];                                                              \
            }                                                                                                         \
        }                                                                                                             \
        return sum_##SUFFIX(grad_h, batch * hidden) + sum_##SUFFIX(out_hh, hidden * hidden) +                         \
               sum_##SUFFIX(out_ih, hidden * inputs) + sum_##SUFFIX(out_b, hidden);                                   \
    }

/* The exported kernels: the bodies above with their arguments unpacked (each cloned for AVX2 and the baseline). */
#define DEFINE_ENTRIES(T, SUFFIX)                                                                                     \
    VECTOR_CLONES                                                                                                     \
    double rflo_tanh_step_##SUFFIX(const factored_setup *setup, const factored_step_arguments *a) {                   \
        return rflo_tanh_step_body_##SUFFIX(setup, a->x, a->h, a->trace, a->batch, a->h_new, a->trace_new);           \
    }                                                                                                                 \
    VECTOR_CLONES                                                                                                     \
    double snap1_tanh_step_##SUFFIX(const factored_setup *setup, const factored_step_arguments *a) {                  \
        return snap1_tanh_step_body_##SUFFIX(setup, a->x, a->h, a->trace, a->batch, a->h_new, a->trace_new);          \
    }                                                                                                                 \
    VECTOR_CLONES                                                                                                     \
    double factored_gradient_##SUFFIX(const factored_setup *setup, const factored_gradient_arguments *a) {            \
        return factored_gradient_body_##SUFFIX(setup, a->trace, a->grad_h, a->batch, a->out_hh, a->out_ih, a->out_b);  \
    }

DEFINE_KERNELS(float, float32, tanh_cell_tanhf)
DEFINE_KERNELS(double, float64, tanh)
DEFINE_ENTRIES(float, float32)
DEFINE_ENTRIES(double, float64)
