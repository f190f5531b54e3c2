/* The linear recurrent unit (Orvieto et al. 2023) and its exact RTRL traces (Zucchet et al. 2023), one C pass per
 * step and one per gradient, for DiagonalRTRL (lightning_ortho/online/diagonal_rtrl.py; the PyTorch path that
 * computes the same is LRUTraces in lightning_ortho/online/lru.py).
 *
 * Per unit k, with mu = exp(nu_log), phi = exp(theta_log), gamma = exp(gamma_log), lambda = exp(-mu + i phi) and
 * u = B x (B = B_re + i B_im), per stream:
 *     h'       = lambda h + gamma u
 *     e_nu'    = lambda e_nu    - mu lambda h          e_units[:, 0]
 *     e_theta' = lambda e_theta + i phi lambda h       e_units[:, 1]
 *     e_gamma' = lambda e_gamma + gamma u              e_units[:, 2]
 *     e_B'     = lambda e_B     + gamma x^T            (H, I)
 * and the estimate Re(conj(g) e) (-Im(conj(g) e_B) for B_im), summed over the streams.
 *
 * Complex numbers are interleaved (re, im) pairs of T, what torch.view_as_real shows of a complex64 (T = float) or
 * complex128 (T = double) tensor. Every array is C-contiguous; the outputs alias no input. Complex products are
 * written out as PyTorch forms them, (a + bi)(c + di) = (ac - bd) + (ad + bc)i, with no fused multiply-add
 * (-ffp-contract=off); the dot products B x are summed in another order than BLAS's, so results agree with the
 * PyTorch path to rounding. No fast-math: a NaN or inf in x, h, a trace or a parameter reaches the returned sum,
 * which the caller takes as its NaN/inf verdict (summed in double: finite float32 entries never overflow it).
 */
#include <math.h>
#include <stdint.h>

#include "vector_clones.h"

/* An address passed as a 64-bit integer (see the entry points below). */
#define ADDRESS(TYPE, VALUE) ((TYPE *)(intptr_t)(VALUE))
/* Units whose lambda and slopes a step keeps on the stack at once (7 arrays of this many scalars). */
#define LRU_CHUNK 64

#define DEFINE_LRU_KERNELS(T, SUFFIX, EXP, COS, SIN)                                                                 \
    /* One step of `batch` streams: h (B, H), e_units (B, 3, H), e_b (B, H, I) complex, x (B, I) real, the           \
     * parameters nu_log, theta_log, gamma_log (H,) and b_re, b_im (H, I) real; writes h_new, e_units_new, e_b_new   \
     * (complex, shaped as h, e_units, e_b). Returns the sum of x and of the real views of the three outputs. */     \
    VECTOR_CLONES                                                                                                    \
    static double lru_step_body_##SUFFIX(const T *restrict nu_log, const T *restrict theta_log,                     \
                                         const T *restrict gamma_log, const T *restrict b_re,                        \
                                         const T *restrict b_im, const T *restrict x, const T *restrict h,           \
                                         const T *restrict e_units, const T *restrict e_b, long batch, long hidden,  \
                                         long inputs, T *restrict h_new, T *restrict e_units_new,                    \
                                         T *restrict e_b_new) {                                                      \
        double total = 0;                                                                                            \
        for (long b = 0; b < batch; ++b) {                                                                           \
            T x_sum = 0;                                                                                             \
            _Pragma("omp simd reduction(+ : x_sum)") for (long j = 0; j < inputs; ++j) x_sum += x[b * inputs + j];   \
            total += x_sum;                                                                                          \
        }                                                                                                            \
        /* Units in chunks: their lambda and slopes once (the transcendental functions are most of the arithmetic),  \
         * then each stream's rows of the chunk, read and written in memory order. */                                \
        for (long k0 = 0; k0 < hidden; k0 += LRU_CHUNK) {                                                            \
            const long k1 = k0 + LRU_CHUNK < hidden ? k0 + LRU_CHUNK : hidden;                                       \
            T lam_re_[LRU_CHUNK], lam_im_[LRU_CHUNK], gamma_[LRU_CHUNK];                                             \
            T nu_re_[LRU_CHUNK], nu_im_[LRU_CHUNK], theta_re_[LRU_CHUNK], theta_im_[LRU_CHUNK];                      \
            for (long k = k0; k < k1; ++k) {                                                                         \
                const T mu = EXP(nu_log[k]), phi = EXP(theta_log[k]);                                                \
                const T modulus = EXP(-mu);                                                                          \
                const T lam_re = modulus * COS(phi), lam_im = modulus * SIN(phi);                                    \
                const long u = k - k0;                                                                               \
                lam_re_[u] = lam_re;                                                                                 \
                lam_im_[u] = lam_im;                                                                                 \
                gamma_[u] = EXP(gamma_log[k]);                                                                       \
                /* d lambda / d nu_log = -mu lambda, d lambda / d theta_log = i phi lambda */                        \
                nu_re_[u] = -mu * lam_re;                                                                            \
                nu_im_[u] = -mu * lam_im;                                                                            \
                theta_re_[u] = -(phi * lam_im);                                                                      \
                theta_im_[u] = phi * lam_re;                                                                         \
            }                                                                                                        \
            for (long b = 0; b < batch; ++b) {                                                                       \
                const T *restrict xb = x + b * inputs;                                                               \
                for (long k = k0; k < k1; ++k) {                                                                     \
                    const long u = k - k0;                                                                           \
                    const T lam_re = lam_re_[u], lam_im = lam_im_[u], gamma = gamma_[u];                             \
                    const T nu_re = nu_re_[u], nu_im = nu_im_[u], theta_re = theta_re_[u], theta_im = theta_im_[u];  \
                    const T *restrict row_re = b_re + k * inputs;                                                    \
                    const T *restrict row_im = b_im + k * inputs;                                                    \
                    T u_re = 0, u_im = 0;                                                                            \
                    _Pragma("omp simd reduction(+ : u_re, u_im)") for (long j = 0; j < inputs; ++j) {                \
                        u_re += row_re[j] * xb[j];                                                                   \
                        u_im += row_im[j] * xb[j];                                                                   \
                    }                                                                                                \
                    const T driven_re = gamma * u_re, driven_im = gamma * u_im;                                      \
                    const long at = 2 * (b * hidden + k);                                                            \
                    const T h_re = h[at], h_im = h[at + 1];                                                          \
                    const T new_re = driven_re + (lam_re * h_re - lam_im * h_im);                                    \
                    const T new_im = driven_im + (lam_re * h_im + lam_im * h_re);                                    \
                    h_new[at] = new_re;                                                                              \
                    h_new[at + 1] = new_im;                                                                          \
                    /* the three per-unit traces: immediate + lambda e */                                            \
                    const T source_re[3] = {nu_re * h_re - nu_im * h_im, theta_re * h_re - theta_im * h_im,          \
                                            driven_re};                                                              \
                    const T source_im[3] = {nu_re * h_im + nu_im * h_re, theta_re * h_im + theta_im * h_re,          \
                                            driven_im};                                                              \
                    double row_total = (double)new_re + (double)new_im;                                              \
                    for (int c = 0; c < 3; ++c) {                                                                    \
                        const long to = 2 * ((b * 3 + c) * hidden + k);                                              \
                        const T e_re = e_units[to], e_im = e_units[to + 1];                                          \
                        const T out_re = source_re[c] + (lam_re * e_re - lam_im * e_im);                             \
                        const T out_im = source_im[c] + (lam_re * e_im + lam_im * e_re);                             \
                        e_units_new[to] = out_re;                                                                    \
                        e_units_new[to + 1] = out_im;                                                                \
                        row_total += (double)out_re + (double)out_im;                                                \
                    }                                                                                                \
                    /* e_B[k, :] = lambda e_B[k, :] + gamma x^T */                                                   \
                    const T *restrict e_row = e_b + 2 * (b * hidden + k) * inputs;                                   \
                    T *restrict out_row = e_b_new + 2 * (b * hidden + k) * inputs;                                   \
                    T e_sum = 0;                                                                                     \
                    _Pragma("omp simd reduction(+ : e_sum)") for (long j = 0; j < inputs; ++j) {                     \
                        const T e_re = e_row[2 * j], e_im = e_row[2 * j + 1];                                        \
                        const T out_re = (lam_re * e_re - lam_im * e_im) + gamma * xb[j];                            \
                        const T out_im = lam_re * e_im + lam_im * e_re;                                              \
                        out_row[2 * j] = out_re;                                                                     \
                        out_row[2 * j + 1] = out_im;                                                                 \
                        e_sum += out_re + out_im;                                                                    \
                    }                                                                                                \
                    total += row_total + (double)e_sum;                                                              \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        return total;                                                                                                \
    }                                                                                                                \
                                                                                                                     \
    /* The estimate summed over `batch` streams into out (size,) real, laid out as [nu_log, theta_log, gamma_log     \
     * (H each), B_re (H, I), B_im (H, I), zeros to size (the readout's C_re, C_im, D)], from grad_h (B, H),         \
     * e_units (B, 3, H) and e_b (B, H, I) complex. Returns the sum of the real view of grad_h and of out. */         \
    VECTOR_CLONES                                                                                                    \
    static double lru_gradient_body_##SUFFIX(const T *restrict grad_h, const T *restrict e_units,                   \
                                             const T *restrict e_b, long batch, long hidden, long inputs, long size, \
                                             T *restrict out) {                                                      \
        const long units = 3 * hidden, weights = hidden * inputs;                                                    \
        T *restrict out_re = out + units;                                                                            \
        T *restrict out_im = out_re + weights;                                                                       \
        double total = 0;                                                                                            \
        for (long b = 0; b < batch; ++b) {                                                                           \
            const T *restrict g = grad_h + 2 * b * hidden;                                                           \
            const T *restrict e = e_units + 2 * b * units;                                                           \
            const T *restrict e_w = e_b + 2 * b * weights;                                                           \
            T g_sum = 0;                                                                                             \
            _Pragma("omp simd reduction(+ : g_sum)") for (long k = 0; k < 2 * hidden; ++k) g_sum += g[k];            \
            total += g_sum;                                                                                          \
            /* Re(conj(g) e) = g_re e_re + g_im e_im */                                                              \
            for (int c = 0; c < 3; ++c) {                                                                            \
                const T *restrict e_c = e + 2 * c * hidden;                                                          \
                T *restrict o = out + c * hidden;                                                                    \
                if (b == 0) {                                                                                        \
                    _Pragma("omp simd") for (long k = 0; k < hidden; ++k) o[k] =                                     \
                        g[2 * k] * e_c[2 * k] + g[2 * k + 1] * e_c[2 * k + 1];                                       \
                } else {                                                                                             \
                    _Pragma("omp simd") for (long k = 0; k < hidden; ++k) o[k] +=                                    \
                        g[2 * k] * e_c[2 * k] + g[2 * k + 1] * e_c[2 * k + 1];                                       \
                }                                                                                                    \
            }                                                                                                        \
            /* conj(g) e_B: its real part for B_re, minus its imaginary part for B_im (g_im e_re - g_re e_im) */      \
            for (long k = 0; k < hidden; ++k) {                                                                      \
                const T g_re = g[2 * k], g_im = g[2 * k + 1];                                                        \
                const T *restrict row = e_w + 2 * k * inputs;                                                        \
                T *restrict o_re = out_re + k * inputs;                                                              \
                T *restrict o_im = out_im + k * inputs;                                                              \
                if (b == 0) {                                                                                        \
                    _Pragma("omp simd") for (long j = 0; j < inputs; ++j) {                                          \
                        o_re[j] = g_re * row[2 * j] + g_im * row[2 * j + 1];                                         \
                        o_im[j] = g_im * row[2 * j] - g_re * row[2 * j + 1];                                         \
                    }                                                                                                \
                } else {                                                                                             \
                    _Pragma("omp simd") for (long j = 0; j < inputs; ++j) {                                          \
                        o_re[j] += g_re * row[2 * j] + g_im * row[2 * j + 1];                                        \
                        o_im[j] += g_im * row[2 * j] - g_re * row[2 * j + 1];                                        \
                    }                                                                                                \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        T out_sum = 0;                                                                                               \
        _Pragma("omp simd reduction(+ : out_sum)") for (long p = 0; p < units + 2 * weights; ++p) out_sum += out[p]; \
        for (long p = units + 2 * weights; p < size; ++p) out[p] = 0; /* outside the recurrence */                   \
        return total + (double)out_sum;                                                                              \
    }                                                                                                                \
                                                                                                                     \
    /* The exported entry points take their arguments as one array of 64-bit integers (addresses, then sizes):       \
     * ctypes converts each argument of a call in Python (about 0.3 us apiece, as much as the whole step at          \
     * H = 32), and one filled array costs less than a tenth of that. step: the addresses of nu_log, theta_log,      \
     * gamma_log, b_re, b_im, x, h, e_units, e_b, h_new, e_units_new, e_b_new, then batch, hidden, inputs (the      \
     * bodies above carry the vector clones). */                                                                     \
    double lru_step_##SUFFIX(const int64_t *restrict args) {                                                         \
        return lru_step_body_##SUFFIX(ADDRESS(const T, args[0]), ADDRESS(const T, args[1]),                          \
                                      ADDRESS(const T, args[2]), ADDRESS(const T, args[3]),                          \
                                      ADDRESS(const T, args[4]), ADDRESS(const T, args[5]),                          \
                                      ADDRESS(const T, args[6]), ADDRESS(const T, args[7]),                          \
                                      ADDRESS(const T, args[8]), (long)args[12], (long)args[13], (long)args[14],     \
                                      ADDRESS(T, args[9]), ADDRESS(T, args[10]), ADDRESS(T, args[11]));              \
    }                                                                                                                \
                                                                                                                     \
    /* gradient: the addresses of grad_h, e_units, e_b, out, then batch, hidden, inputs, size. */                    \
    double lru_gradient_##SUFFIX(const int64_t *restrict args) {                                                     \
        return lru_gradient_body_##SUFFIX(ADDRESS(const T, args[0]), ADDRESS(const T, args[1]),                      \
                                          ADDRESS(const T, args[2]), (long)args[4], (long)args[5], (long)args[6],    \
                                          (long)args[7], ADDRESS(T, args[3]));                                       \
    }

DEFINE_LRU_KERNELS(float, float32, expf, cosf, sinf)
DEFINE_LRU_KERNELS(double, float64, exp, cos, sin)
