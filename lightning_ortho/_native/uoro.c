/* UORO's kernels (Tallec & Ollivier 2017), around what PyTorch does faster (GEMMs, the vectorised tanh).
 *
 * On the tanh cell h' = tanh(W_h h + W_x x + b), with greedy iterative rescaling: the row work of one step and the
 * update of w_tilde. Per stream, with d = 1 - h'^2, prop = W_h h_tilde, m = nu * d, a = [h; x; 1] and
 * (psi, g) = (nu, m) at the cut h or (m, nu) at z:
 *     gamma = sqrt((||w_tilde|| + eps) / (||d * prop|| + eps)),   beta = sqrt((||g|| ||a|| + eps) / (||psi|| + eps))
 *     h_tilde' = gamma (d * prop) + beta tau psi,                  w_tilde' = w_tilde / gamma + (tau / beta) g a^T
 * For any cell: the summed estimate sum_b (dL/dh_b . h_tilde_b) w_tilde_b.
 *
 * All arrays are C-contiguous; no fast-math, so a NaN or inf anywhere reaches the returned sums (through ||a||, d or
 * gamma in the step), which the callers check.
 */
#include <math.h>

#include "vector_clones.h"

#define DEFINE_KERNELS(T, SUFFIX, SQRT)                                                                               \
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
    /* The summed estimate sum_b (grad_h_b . h_tilde_b) w_tilde_b into out (P,), reading w_tilde once, in blocks of   \
     * out that stay in L1 across the streams; scale (B,) is scratch. Returns the sum of out (NaN/inf when the        \
     * estimate or grad_h is not finite). */                                                                          \
    VECTOR_CLONES                                                                                                     \
    double uoro_gradient_##SUFFIX(const T *restrict w_tilde, const T *restrict grad_h, const T *restrict h_tilde,     \
                                  long batch, long hidden, long size, T *restrict scale, T *restrict out) {           \
        for (long b = 0; b < batch; ++b) {                                                                            \
            T s = 0;                                                                                                  \
            for (long k = 0; k < hidden; ++k) s += grad_h[b * hidden + k] * h_tilde[b * hidden + k];                  \
            scale[b] = s;                                                                                             \
        }                                                                                                             \
        double total = 0;                                                                                             \
        for (long start = 0; start < size; start += 512) {                                                            \
            const long stop = start + 512 < size ? start + 512 : size;                                                \
            _Pragma("omp simd") for (long p = start; p < stop; ++p) out[p] = scale[0] * w_tilde[p];                   \
            for (long b = 1; b < batch; ++b) {                                                                        \
                const T *restrict w = w_tilde + b * size;                                                             \
                const T s = scale[b];                                                                                 \
                _Pragma("omp simd") for (long p = start; p < stop; ++p) out[p] += s * w[p];                           \
            }                                                                                                         \
            T block_total = 0;                                                                                        \
            _Pragma("omp simd reduction(+ : block_total)") for (long p = start; p < stop; ++p) block_total += out[p]; \
            total += block_total;                                                                                     \
        }                                                                                                             \
        return total;                                                                                                 \
    }

DEFINE_KERNELS(float, float32, sqrtf)
DEFINE_KERNELS(double, float64, sqrt)
