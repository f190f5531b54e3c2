/* UORO's kernels (Tallec & Ollivier 2017), around what PyTorch does faster (GEMMs, the vectorised tanh).
 *
 * On the tanh cell h' = tanh(W_h h + W_x x + b), with greedy iterative rescaling: the row work of one step and the
 * update of w_tilde. Per stream, with d = 1 - h'^2, prop = W_h h_tilde, m = nu * d, a = [h; x; 1] and
 * (psi, g) = (nu, m) at the cut h or (m, nu) at z:
 *     gamma = sqrt((||w_tilde|| + eps) / (||d * prop|| + eps)),   beta = sqrt((||g|| ||a|| + eps) / (||psi|| + eps))
 *     h_tilde' = gamma (d * prop) + beta tau psi,                  w_tilde' = w_tilde / gamma + (tau / beta) g a^T
 * For any cell: the summed estimate sum_b (dL/dh_b . h_tilde_b) w_tilde_b, written into one output per parameter.
 *
 * At small sizes the whole GIR step is one call (uoro_tanh_gir_step): the cell's step, W_h h_tilde, the norms,
 * gamma and beta, h_tilde' and w_tilde' into fresh outputs; at larger ones PyTorch's GEMMs do the products and the
 * row passes below the rest (gir_rows, then commit in place after the checks).
 *
 * All arrays are C-contiguous; no fast-math, so a NaN or inf anywhere reaches the returned sums (through ||a||, d or
 * gamma in the step), which the callers check.
 */
#include <math.h>
#include <stdlib.h>

#include "tanh_cell.h"
#include "vector_clones.h"

/* Scratch of up to this many entries lives on the stack (g of a step, the per-stream scales of the estimate);
 * above it, one malloc per call. */
#define UORO_STACK_ENTRIES 512

/* The arguments of the one-call GIR step and of the summed estimate, packed by the binding into one buffer
 * (struct.Struct, native layout): one ctypes argument instead of seventeen, which ctypes would convert one by one in
 * Python (a few microseconds of a step that takes tens at one stream). */
typedef struct {
    const void *w_hh, *w_ih, *bias, *x, *h, *h_tilde, *w_tilde, *nu, *bits;
    void *h_new, *h_tilde_new, *w_tilde_new;
    long batch, hidden, inputs, state_cut;
    double eps;
} uoro_step_arguments;

/* One output of the summed estimate: `length` consecutive entries of the flat layout (a parameter's), written to
 * `out`. */
typedef struct {
    long length;
    void *out;
} uoro_gradient_part;

typedef struct {
    const void *w_tilde, *grad_h, *h_tilde;
    long batch, hidden, size, parts;
    uoro_gradient_part part[]; /* `parts` of them, in the layout's order; their lengths sum to `size` */
} uoro_gradient_arguments;

#define DEFINE_KERNELS(T, SUFFIX, SQRT, TANH, LANES)                                                                  \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                 \
                                                                                                                      \
    /* Sums over n entries in LANES independent partial sums (a single running sum waits an add's latency on every    \
     * vector; LANES = four vectors of AVX2), added in order at the end: of the squares (sum_squares) or the values   \
     * (sum_values). */                                                                                               \
    static inline T sum_squares_##SUFFIX(const T *restrict v, long n) {                                               \
        T lanes[LANES] = {0};                                                                                         \
        long p = 0;                                                                                                   \
        for (; p + LANES <= n; p += LANES) {                                                                          \
            _Pragma("omp simd") for (long j = 0; j < LANES; ++j) lanes[j] += v[p + j] * v[p + j];                     \
        }                                                                                                             \
        T s = 0;                                                                                                      \
        for (long j = 0; j < LANES; ++j) s += lanes[j];                                                               \
        for (; p < n; ++p) s += v[p] * v[p];                                                                          \
        return s;                                                                                                     \
    }                                                                                                                 \
    static inline T sum_values_##SUFFIX(const T *restrict v, long n) {                                                \
        T lanes[LANES] = {0};                                                                                         \
        long p = 0;                                                                                                   \
        for (; p + LANES <= n; p += LANES) {                                                                          \
            _Pragma("omp simd") for (long j = 0; j < LANES; ++j) lanes[j] += v[p + j];                                \
        }                                                                                                             \
        T s = 0;                                                                                                      \
        for (long j = 0; j < LANES; ++j) s += lanes[j];                                                               \
        for (; p < n; ++p) s += v[p];                                                                                 \
        return s;                                                                                                     \
    }                                                                                                                 \
    /* out = W v for W (rows, cols) row-major: four rows at a time, four sums that do not wait on each other. */      \
    static inline void matvec_##SUFFIX(const T *restrict w, const T *restrict v, long rows, long cols,                \
                                       T *restrict out) {                                                             \
        long i = 0;                                                                                                   \
        for (; i + 4 <= rows; i += 4) {                                                                               \
            const T *restrict r0 = w + i * cols, *restrict r1 = r0 + cols, *restrict r2 = r1 + cols;                  \
            const T *restrict r3 = r2 + cols;                                                                         \
            T s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                                         \
            _Pragma("omp simd reduction(+ : s0, s1, s2, s3)") for (long j = 0; j < cols; ++j) {                       \
                s0 += r0[j] * v[j];                                                                                   \
                s1 += r1[j] * v[j];                                                                                   \
                s2 += r2[j] * v[j];                                                                                   \
                s3 += r3[j] * v[j];                                                                                   \
            }                                                                                                         \
            out[i] = s0;                                                                                              \
            out[i + 1] = s1;                                                                                          \
            out[i + 2] = s2;                                                                                          \
            out[i + 3] = s3;                                                                                          \
        }                                                                                                             \
        for (; i < rows; ++i) {                                                                                       \
            const T *restrict r = w + i * cols;                                                                       \
            T s = 0;                                                                                                  \
            _Pragma("omp simd reduction(+ : s)") for (long j = 0; j < cols; ++j) s += r[j] * v[j];                    \
            out[i] = s;                                                                                               \
        }                                                                                                             \
    }                                                                                                                 \
    /* Returns the sum of h_tilde' (NaN/inf when the step is not finite). */                                          \
    VECTOR_CLONES                                                                                                     \
    double uoro_tanh_gir_rows_##SUFFIX(const T *restrict h_new, const T *restrict prop, const T *restrict nu,         \
                                       const T *restrict tau, const T *restrict h, const T *restrict x,               \
                                       const T *restrict w_norm, long batch, long hidden, long inputs, T eps,         \
                                       int state_cut, T *restrict h_tilde_new, T *restrict inverse_gamma,             \
                                       T *restrict g_scaled) {                                                        \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const long row = b * hidden;                                                                              \
            T a2 = 1, prop2 = 0, nu2 = 0, m2 = 0;                                                                     \
            for (long k = 0; k < inputs; ++k) a2 += x[b * inputs + k] * x[b * inputs + k];                            \
            for (long k = 0; k < hidden; ++k) {                                                                       \
                const T hk = h[row + k];                                                                              \
                const T y = h_new[row + k];                                                                           \
                const T slope = 1 - y * y;                                                                            \
                const T propagated = prop[row + k] * slope;                                                           \
                const T m = nu[row + k] * slope;                                                                      \
                h_tilde_new[row + k] = propagated; /* scaled below */                                                 \
                g_scaled[row + k] = m;             /* m; replaced below at the cut z */                               \
                a2 += hk * hk;                                                                                        \
                prop2 += propagated * propagated;                                                                     \
                nu2 += nu[row + k] * nu[row + k];                                                                     \
                m2 += m * m;                                                                                          \
            }                                                                                                         \
            const T g_norm = SQRT(state_cut ? m2 : nu2), psi_norm = SQRT(state_cut ? nu2 : m2);                       \
            const T gamma = SQRT((w_norm[b] + eps) / (SQRT(prop2) + eps));                                            \
            const T beta = SQRT((g_norm * SQRT(a2) + eps) / (psi_norm + eps));                                        \
            const T beta_tau = beta * tau[b], tau_over_beta = tau[b] / beta;                                          \
            double row_total = 0;                                                                                     \
            for (long k = 0; k < hidden; ++k) {                                                                       \
                const T m = g_scaled[row + k];                                                                        \
                const T psi = state_cut ? nu[row + k] : m, g = state_cut ? m : nu[row + k];                           \
                const T value = gamma * h_tilde_new[row + k] + beta_tau * psi;                                        \
                h_tilde_new[row + k] = value;                                                                         \
                g_scaled[row + k] = g * tau_over_beta;                                                                \
                row_total += value;                                                                                   \
            }                                                                                                         \
            inverse_gamma[b] = 1 / gamma;                                                                             \
            total += row_total;                                                                                       \
        }                                                                                                             \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* w_tilde (batch, P) with P = H H + H I + H laid out as [vec(W_h), vec(W_x), b]: w <- w / gamma + g a^T in       \
     * one pass, and each stream's new norm into norms, summed on the way. uoro_tanh_norms below sums the norms of    \
     * a given w_tilde with loops of the same shape, in the same order, so that norms taken afresh (after a           \
     * checkpoint is loaded) equal the ones taken here bit for bit, and a resumed run steps on exactly. */            \
    VECTOR_CLONES                                                                                                     \
    void uoro_tanh_commit_##SUFFIX(T *restrict w_tilde, const T *restrict inverse_gamma, const T *restrict g,         \
                                   const T *restrict h, const T *restrict x, long batch, long hidden, long inputs,    \
                                   T *restrict norms) {                                                               \
        const long size = hidden * (hidden + inputs + 1);                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            T *restrict w = w_tilde + b * size;                                                                       \
            const T *restrict gb = g + b * hidden;                                                                    \
            const T *restrict hb = h + b * hidden;                                                                    \
            const T *restrict xb = x + b * inputs;                                                                    \
            T *restrict w_ih = w + hidden * hidden;                                                                   \
            T *restrict w_b = w_ih + hidden * inputs;                                                                 \
            const T scale = inverse_gamma[b];                                                                         \
            T norm2 = 0;                                                                                              \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T gi = gb[i];                                                                                   \
                T *restrict w_row = w + i * hidden;                                                                   \
                _Pragma("omp simd reduction(+ : norm2)") for (long j = 0; j < hidden; ++j) {                          \
                    const T value = w_row[j] * scale + gi * hb[j];                                                    \
                    w_row[j] = value;                                                                                 \
                    norm2 += value * value;                                                                           \
                }                                                                                                     \
                T *restrict w_ih_row = w_ih + i * inputs;                                                             \
                _Pragma("omp simd reduction(+ : norm2)") for (long j = 0; j < inputs; ++j) {                          \
                    const T value = w_ih_row[j] * scale + gi * xb[j];                                                 \
                    w_ih_row[j] = value;                                                                              \
                    norm2 += value * value;                                                                           \
                }                                                                                                     \
                const T value = w_b[i] * scale + gi;                                                                  \
                w_b[i] = value;                                                                                       \
                norm2 += value * value;                                                                               \
            }                                                                                                         \
            norms[b] = SQRT(norm2);                                                                                   \
        }                                                                                                             \
    }                                                                                                                 \
                                                                                                                      \
    /* Each stream's norm of w_tilde (laid out as above) into norms, summed as uoro_tanh_commit sums it. */           \
    VECTOR_CLONES                                                                                                     \
    void uoro_tanh_norms_##SUFFIX(const T *restrict w_tilde, long batch, long hidden, long inputs, T *restrict norms) {\
        const long size = hidden * (hidden + inputs + 1);                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict w = w_tilde + b * size;                                                                 \
            const T *restrict w_ih = w + hidden * hidden;                                                             \
            const T *restrict w_b = w_ih + hidden * inputs;                                                           \
            T norm2 = 0;                                                                                              \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T *restrict w_row = w + i * hidden;                                                             \
                _Pragma("omp simd reduction(+ : norm2)") for (long j = 0; j < hidden; ++j) {                          \
                    const T value = w_row[j];                                                                         \
                    norm2 += value * value;                                                                           \
                }                                                                                                     \
                const T *restrict w_ih_row = w_ih + i * inputs;                                                       \
                _Pragma("omp simd reduction(+ : norm2)") for (long j = 0; j < inputs; ++j) {                          \
                    const T value = w_ih_row[j];                                                                      \
                    norm2 += value * value;                                                                           \
                }                                                                                                     \
                const T value = w_b[i];                                                                               \
                norm2 += value * value;                                                                               \
            }                                                                                                         \
            norms[b] = SQRT(norm2);                                                                                   \
        }                                                                                                             \
    }                                                                                                                 \
                                                                                                                      \
    /* The whole GIR step of the tanh cell for `batch` streams, w_tilde read only: h' (tanh_cell), then per stream    \
     * ||w_tilde|| (one pass; taken afresh at every step, so a loaded checkpoint steps on exactly), prop = W_h        \
     * h_tilde, gamma, beta, h_tilde' and w_tilde' = w_tilde / gamma + (tau / beta) g a^T into w_tilde_new (the       \
     * expressions of uoro_tanh_gir_rows and uoro_tanh_commit). The noise is the generator's draw as drawn: nu        \
     * (B, H) and the bits (B,) in {0, 1} of the signs tau = 2 bit - 1. Returns the sum of x, h' and h_tilde'         \
     * (NaN/inf when the step is not finite: a NaN/inf in x                                                           \
     * reaches h_tilde' through ||a|| and beta, one in w_tilde through gamma, one in the weights through h' and d),   \
     * or NaN when the scratch cannot be allocated. Always inlined into its exported caller (out of line, a static   \
     * function is compiled for the baseline target only, not cloned for AVX2). */                                    \
    static inline __attribute__((always_inline)) double uoro_gir_step_##SUFFIX(                                       \
        const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias, const T *restrict x,                  \
        const T *restrict h, const T *restrict h_tilde, const T *restrict w_tilde, const T *restrict nu,              \
        const T *restrict bits, long batch, long hidden, long inputs, T eps, int state_cut, T *restrict h_new,        \
        T *restrict h_tilde_new, T *restrict w_tilde_new) {                                                           \
        const long size = hidden * (hidden + inputs + 1);                                                             \
        T stack[UORO_STACK_ENTRIES];                                                                                  \
        T *restrict g = hidden <= UORO_STACK_ENTRIES ? stack : malloc(sizeof(T) * hidden);                            \
        if (g == NULL) return NAN;                                                                                    \
        tanh_cell_##SUFFIX(w_hh, w_ih, bias, x, h, batch, hidden, inputs, h_new);                                     \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict nub = nu + b * hidden;                                                                  \
            const T tau = 2 * bits[b] - 1;                                                                            \
            const T *restrict hb = h + b * hidden;                                                                    \
            const T *restrict xb = x + b * inputs;                                                                    \
            const T *restrict yb = h_new + b * hidden;                                                                \
            const T *restrict w = w_tilde + b * size;                                                                 \
            const T *restrict w_ih_in = w + hidden * hidden;                                                          \
            const T *restrict w_b_in = w_ih_in + hidden * inputs;                                                     \
            T *restrict out = h_tilde_new + b * hidden;                                                               \
            const T w_norm = SQRT(sum_squares_##SUFFIX(w, size));                                                     \
            matvec_##SUFFIX(w_hh, h_tilde + b * hidden, hidden, hidden, out); /* prop = W_h h_tilde, scaled below */  \
            T a2 = 1, prop2 = 0, nu2 = 0, m2 = 0, x_total = 0, y_total = 0;                                           \
            for (long k = 0; k < inputs; ++k) {                                                                       \
                a2 += xb[k] * xb[k];                                                                                  \
                x_total += xb[k];                                                                                     \
            }                                                                                                         \
            for (long k = 0; k < hidden; ++k) {                                                                       \
                const T prop = out[k];                                                                                \
                const T hk = hb[k];                                                                                   \
                const T y = yb[k];                                                                                    \
                const T slope = 1 - y * y;                                                                            \
                const T propagated = prop * slope;                                                                    \
                const T m = nub[k] * slope;                                                                           \
                out[k] = propagated; /* scaled below */                                                               \
                g[k] = m;            /* m; replaced below at the cut z */                                             \
                a2 += hk * hk;                                                                                        \
                prop2 += propagated * propagated;                                                                     \
                nu2 += nub[k] * nub[k];                                                                               \
                m2 += m * m;                                                                                          \
                y_total += y;                                                                                         \
            }                                                                                                         \
            const T g_norm = SQRT(state_cut ? m2 : nu2), psi_norm = SQRT(state_cut ? nu2 : m2);                       \
            const T gamma = SQRT((w_norm + eps) / (SQRT(prop2) + eps));                                               \
            const T beta = SQRT((g_norm * SQRT(a2) + eps) / (psi_norm + eps));                                        \
            const T beta_tau = beta * tau, tau_over_beta = tau / beta;                                                \
            T row_total = 0;                                                                                          \
            for (long k = 0; k < hidden; ++k) {                                                                       \
                const T m = g[k];                                                                                     \
                const T psi = state_cut ? nub[k] : m, gk = state_cut ? m : nub[k];                                    \
                const T value = gamma * out[k] + beta_tau * psi;                                                      \
                out[k] = value;                                                                                       \
                g[k] = gk * tau_over_beta;                                                                            \
                row_total += value;                                                                                   \
            }                                                                                                         \
            const T scale = 1 / gamma;                                                                                \
            T *restrict w_out = w_tilde_new + b * size;                                                               \
            T *restrict w_ih_out = w_out + hidden * hidden;                                                           \
            T *restrict w_b_out = w_ih_out + hidden * inputs;                                                         \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T gi = g[i];                                                                                    \
                const T *restrict w_row = w + i * hidden;                                                             \
                T *restrict w_row_out = w_out + i * hidden;                                                           \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) w_row_out[j] = w_row[j] * scale + gi * hb[j];   \
            }                                                                                                         \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T gi = g[i];                                                                                    \
                const T *restrict w_ih_row = w_ih_in + i * inputs;                                                    \
                T *restrict w_ih_row_out = w_ih_out + i * inputs;                                                     \
                _Pragma("omp simd") for (long j = 0; j < inputs; ++j) {                                               \
                    w_ih_row_out[j] = w_ih_row[j] * scale + gi * xb[j];                                               \
                }                                                                                                     \
            }                                                                                                         \
            _Pragma("omp simd") for (long i = 0; i < hidden; ++i) w_b_out[i] = w_b_in[i] * scale + g[i];              \
            total += (double)row_total + (double)x_total + (double)y_total;                                           \
        }                                                                                                             \
        if (g != stack) free(g);                                                                                      \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* uoro_gir_step with its arguments unpacked (uoro_step_arguments). */                                            \
    VECTOR_CLONES                                                                                                     \
    double uoro_tanh_gir_step_##SUFFIX(const uoro_step_arguments *a) {                                                \
        return uoro_gir_step_##SUFFIX(a->w_hh, a->w_ih, a->bias, a->x, a->h, a->h_tilde, a->w_tilde, a->nu, a->bits,  \
                                      a->batch, a->hidden, a->inputs, (T)a->eps, (int)a->state_cut, a->h_new,         \
                                      a->h_tilde_new, a->w_tilde_new);                                                \
    }                                                                                                                 \
                                                                                                                      \
    /* The summed estimate sum_b (grad_h_b . h_tilde_b) w_tilde_b (P,) for any cell, w_tilde (B, P), grad_h and       \
     * h_tilde (B, H), written part by part (uoro_gradient_arguments: one output per parameter, each the next         \
     * `length` entries of the flat layout), reading w_tilde once, in blocks of a part that stay in L1 across the     \
     * streams. Returns the sum of grad_h and of the estimate (NaN/inf when the estimate or grad_h is not finite),    \
     * or NaN when the scratch cannot be allocated. */                                                                \
    VECTOR_CLONES                                                                                                     \
    double uoro_gradient_##SUFFIX(const uoro_gradient_arguments *a) {                                                 \
        const T *restrict w_tilde = a->w_tilde, *restrict grad_h = a->grad_h, *restrict h_tilde = a->h_tilde;         \
        const long batch = a->batch, hidden = a->hidden, size = a->size;                                              \
        T stack[UORO_STACK_ENTRIES];                                                                                  \
        T *restrict scale = batch <= UORO_STACK_ENTRIES ? stack : malloc(sizeof(T) * batch);                          \
        if (scale == NULL) return NAN;                                                                                \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            T s = 0, grad_total = 0;                                                                                  \
            for (long k = 0; k < hidden; ++k) {                                                                       \
                s += grad_h[b * hidden + k] * h_tilde[b * hidden + k];                                                \
                grad_total += grad_h[b * hidden + k];                                                                 \
            }                                                                                                         \
            scale[b] = s;                                                                                             \
            total += grad_total;                                                                                      \
        }                                                                                                             \
        long offset = 0; /* of the part in a row of w_tilde */                                                        \
        for (long part = 0; part < a->parts; ++part) {                                                                \
            const long length = a->part[part].length;                                                                 \
            T *restrict out = a->part[part].out;                                                                      \
            const T *restrict first = w_tilde + offset;                                                               \
            for (long start = 0; start < length; start += 512) {                                                      \
                const long stop = start + 512 < length ? start + 512 : length;                                        \
                _Pragma("omp simd") for (long p = start; p < stop; ++p) out[p] = scale[0] * first[p];                 \
                for (long b = 1; b < batch; ++b) {                                                                    \
                    const T *restrict w = first + b * size;                                                           \
                    const T s = scale[b];                                                                             \
                    _Pragma("omp simd") for (long p = start; p < stop; ++p) out[p] += s * w[p];                       \
                }                                                                                                     \
                total += sum_values_##SUFFIX(out + start, stop - start);                                              \
            }                                                                                                         \
            offset += length;                                                                                         \
        }                                                                                                             \
        if (scale != stack) free(scale);                                                                              \
        return total;                                                                                                 \
    }

DEFINE_KERNELS(float, float32, sqrtf, tanhf, 32)
DEFINE_KERNELS(double, float64, sqrt, tanh, 16)
