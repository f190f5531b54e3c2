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
 *
 * The per-unit values a step derives from nu_log, theta_log and gamma_log (lambda, gamma and the slopes of lambda:
 * six transcendental functions per unit, most of a step's arithmetic at one stream) depend on the parameters only,
 * which an optimiser changes at most once per step and often less. So a step keeps them in a cache (one per
 * estimator, see lru_cache below) beside a copy of the three parameters they came from, and the next step reuses
 * them when the parameters hold the same bits (a comparison of 3 H scalars): the same numbers it would compute. A
 * step that finds the cache in use by another thread computes them on its stack, as a step without a cache does.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifndef __STDC_NO_ATOMICS__
#include <stdatomic.h>
#endif

#include "vector_clones.h"

/* An address passed as a 64-bit integer (see the entry points below). */
#define ADDRESS(TYPE, VALUE) ((TYPE *)(intptr_t)(VALUE))
/* Units whose lambda and slopes a step without the cache keeps on the stack at once (7 arrays of this many). */
#define LRU_CHUNK 64

/* The head of a cache: 8 bytes, then 10 H scalars of T, [nu_log, theta_log, gamma_log] as they were when the other
 * seven were derived from them, then [lambda_re, lambda_im, gamma, dlambda/dnu_log (re, im), dlambda/dtheta_log (re,
 * im)], H each. `busy` keeps a step of another thread out while one step reads or writes it (the Python caller does
 * not hold the GIL during the call); `valid` is sizeof(T) once the values are those of T's parameters, else 0. The
 * caller allocates it zeroed, 8 + 10 H sizeof(double) bytes, 8-byte aligned. */
struct lru_cache {
#ifndef __STDC_NO_ATOMICS__
    atomic_int busy;
#else
    int busy;
#endif
    int valid;
};

/* Whether this step has the cache to itself (then it gives it back with lru_release). */
static int lru_acquire(struct lru_cache *cache) {
#ifndef __STDC_NO_ATOMICS__
    return cache != NULL && atomic_exchange_explicit(&cache->busy, 1, memory_order_acquire) == 0;
#else
    (void)cache; /* no atomics: no cache */
    return 0;
#endif
}

static void lru_release(struct lru_cache *cache) {
#ifndef __STDC_NO_ATOMICS__
    atomic_store_explicit(&cache->busy, 0, memory_order_release);
#else
    (void)cache;
#endif
}
#define DEFINE_LRU_KERNELS(T, SUFFIX, EXP, COS, SIN)                                                                 \
    /* One step of `batch` streams: h (B, H), e_units (B, 3, H), e_b (B, H, I) complex, x (B, I) real, the           \
     * parameters nu_log, theta_log, gamma_log (H,) and b_re, b_im (H, I) real; writes h_new, e_units_new, e_b_new   \
     * (complex, shaped as h, e_units, e_b); `cache` (or NULL): see struct lru_cache. Returns the sum of x and       \
     * of the real views of the three outputs. */                                                                    \
    VECTOR_CLONES                                                                                                    \
    static double lru_step_body_##SUFFIX(const T *restrict nu_log, const T *restrict theta_log,                      \
                                         const T *restrict gamma_log, const T *restrict b_re,                        \
                                         const T *restrict b_im, const T *restrict x, const T *restrict h,           \
                                         const T *restrict e_units, const T *restrict e_b, long batch, long hidden,  \
                                         long inputs, T *restrict h_new, T *restrict e_units_new,                    \
                                         T *restrict e_b_new, struct lru_cache *cache) {                             \
        double total = 0;                                                                                            \
        for (long b = 0; b < batch; ++b) {                                                                           \
            T x_sum = 0;                                                                                             \
            _Pragma("omp simd reduction(+ : x_sum)") for (long j = 0; j < inputs; ++j) x_sum += x[b * inputs + j];   \
            total += x_sum;                                                                                          \
        }                                                                                                            \
        const int owned = lru_acquire(cache);                                                                        \
        T *kept = owned ? (T *)(cache + 1) : NULL; /* [nu_log, theta_log, gamma_log, the seven derived] x H */       \
        const size_t bytes = (size_t)hidden * sizeof(T);                                                             \
        const int known = owned && cache->valid == (int)sizeof(T) && memcmp(kept, nu_log, bytes) == 0 &&             \
                          memcmp(kept + hidden, theta_log, bytes) == 0 &&                                            \
                          memcmp(kept + 2 * hidden, gamma_log, bytes) == 0;                                          \
        if (owned && !known)                                                                                         \
            cache->valid = 0; /* until the seven below and the parameters they come from are written */              \
        /* Units in chunks: their lambda and slopes once (from the cache, else derived into it or onto the stack),   \
         * then per stream: B x of the chunk's units, h' and the per-unit traces across them (one vector loop), and  \
         * the chunk's rows of e_B; each read and written in memory order. */                                        \
        for (long k0 = 0; k0 < hidden; k0 += LRU_CHUNK) {                                                            \
            const long k1 = k0 + LRU_CHUNK < hidden ? k0 + LRU_CHUNK : hidden;                                       \
            T stack[7][LRU_CHUNK];                                                                                   \
            T *values[7];                                                                                            \
            for (int c = 0; c < 7; ++c) values[c] = owned ? kept + (3 + c) * hidden + k0 : stack[c];                 \
            T *lam_re_ = values[0], *lam_im_ = values[1], *gamma_ = values[2];                                       \
            T *nu_re_ = values[3], *nu_im_ = values[4], *theta_re_ = values[5], *theta_im_ = values[6];              \
            if (!known) {                                                                                            \
                for (long k = k0; k < k1; ++k) {                                                                     \
                    const T mu = EXP(nu_log[k]), phi = EXP(theta_log[k]);                                            \
                    const T modulus = EXP(-mu);                                                                      \
                    const T lam_re = modulus * COS(phi), lam_im = modulus * SIN(phi);                                \
                    const long u = k - k0;                                                                           \
                    lam_re_[u] = lam_re;                                                                             \
                    lam_im_[u] = lam_im;                                                                             \
                    gamma_[u] = EXP(gamma_log[k]);                                                                   \
                    /* d lambda / d nu_log = -mu lambda, d lambda / d theta_log = i phi lambda */                    \
                    nu_re_[u] = -mu * lam_re;                                                                        \
                    nu_im_[u] = -mu * lam_im;                                                                        \
                    theta_re_[u] = -(phi * lam_im);                                                                  \
                    theta_im_[u] = phi * lam_re;                                                                     \
                }                                                                                                    \
            }                                                                                                        \
            for (long b = 0; b < batch; ++b) {                                                                       \
                const T *restrict xb = x + b * inputs;                                                               \
                /* u = B x for the chunk's units: a dot product over the inputs each */                              \
                T u_re_[LRU_CHUNK], u_im_[LRU_CHUNK];                                                                \
                for (long k = k0; k < k1; ++k) {                                                                     \
                    const T *restrict row_re = b_re + k * inputs;                                                    \
                    const T *restrict row_im = b_im + k * inputs;                                                    \
                    T u_re = 0, u_im = 0;                                                                            \
                    _Pragma("omp simd reduction(+ : u_re, u_im)") for (long j = 0; j < inputs; ++j) {                \
                        u_re += row_re[j] * xb[j];                                                                   \
                        u_im += row_im[j] * xb[j];                                                                   \
                    }                                                                                                \
                    u_re_[k - k0] = u_re;                                                                            \
                    u_im_[k - k0] = u_im;                                                                            \
                }                                                                                                    \
                /* h' and the three per-unit traces (immediate + lambda e), across the chunk's units */              \
                const T *restrict hb = h + 2 * b * hidden;                                                           \
                const T *restrict e_nu = e_units + 6 * b * hidden;                                                   \
                const T *restrict e_theta = e_nu + 2 * hidden;                                                       \
                const T *restrict e_gamma = e_theta + 2 * hidden;                                                    \
                T *restrict hb_new = h_new + 2 * b * hidden;                                                         \
                T *restrict e_nu_new = e_units_new + 6 * b * hidden;                                                 \
                T *restrict e_theta_new = e_nu_new + 2 * hidden;                                                     \
                T *restrict e_gamma_new = e_theta_new + 2 * hidden;                                                  \
                double units_total = 0;                                                                              \
                _Pragma("omp simd reduction(+ : units_total)") for (long k = k0; k < k1; ++k) {                      \
                    const long u = k - k0;                                                                           \
                    const T lam_re = lam_re_[u], lam_im = lam_im_[u], gamma = gamma_[u];                             \
                    const T nu_re = nu_re_[u], nu_im = nu_im_[u], theta_re = theta_re_[u], theta_im = theta_im_[u];  \
                    const T driven_re = gamma * u_re_[u], driven_im = gamma * u_im_[u];                              \
                    const T h_re = hb[2 * k], h_im = hb[2 * k + 1];                                                  \
                    const T new_re = driven_re + (lam_re * h_re - lam_im * h_im);                                    \
                    const T new_im = driven_im + (lam_re * h_im + lam_im * h_re);                                    \
                    hb_new[2 * k] = new_re;                                                                          \
                    hb_new[2 * k + 1] = new_im;                                                                      \
                    const T nu_re_e = e_nu[2 * k], nu_im_e = e_nu[2 * k + 1];                                        \
                    const T theta_re_e = e_theta[2 * k], theta_im_e = e_theta[2 * k + 1];                            \
                    const T gamma_re_e = e_gamma[2 * k], gamma_im_e = e_gamma[2 * k + 1];                            \
                    const T nu_out_re = (nu_re * h_re - nu_im * h_im) + (lam_re * nu_re_e - lam_im * nu_im_e);       \
                    const T nu_out_im = (nu_re * h_im + nu_im * h_re) + (lam_re * nu_im_e + lam_im * nu_re_e);       \
                    const T theta_out_re =                                                                           \
                        (theta_re * h_re - theta_im * h_im) + (lam_re * theta_re_e - lam_im * theta_im_e);           \
                    const T theta_out_im =                                                                           \
                        (theta_re * h_im + theta_im * h_re) + (lam_re * theta_im_e + lam_im * theta_re_e);           \
                    const T gamma_out_re = driven_re + (lam_re * gamma_re_e - lam_im * gamma_im_e);                  \
                    const T gamma_out_im = driven_im + (lam_re * gamma_im_e + lam_im * gamma_re_e);                  \
                    e_nu_new[2 * k] = nu_out_re;                                                                     \
                    e_nu_new[2 * k + 1] = nu_out_im;                                                                 \
                    e_theta_new[2 * k] = theta_out_re;                                                               \
                    e_theta_new[2 * k + 1] = theta_out_im;                                                           \
                    e_gamma_new[2 * k] = gamma_out_re;                                                               \
                    e_gamma_new[2 * k + 1] = gamma_out_im;                                                           \
                    units_total += ((double)new_re + (double)new_im) + ((double)nu_out_re + (double)nu_out_im) +     \
                                   ((double)theta_out_re + (double)theta_out_im) +                                   \
                                   ((double)gamma_out_re + (double)gamma_out_im);                                    \
                }                                                                                                    \
                total += units_total;                                                                                \
                /* e_B[k, :] = lambda e_B[k, :] + gamma x^T */                                                       \
                for (long k = k0; k < k1; ++k) {                                                                     \
                    const long u = k - k0;                                                                           \
                    const T lam_re = lam_re_[u], lam_im = lam_im_[u], gamma = gamma_[u];                             \
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
                    total += (double)e_sum;                                                                          \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        if (owned) {                                                                                                 \
            if (!known) {                                                                                            \
                memcpy(kept, nu_log, bytes);                                                                         \
                memcpy(kept + hidden, theta_log, bytes);                                                             \
                memcpy(kept + 2 * hidden, gamma_log, bytes);                                                         \
                cache->valid = (int)sizeof(T);                                                                       \
            }                                                                                                        \
            lru_release(cache);                                                                                      \
        }                                                                                                            \
        return total;                                                                                                \
    }                                                                                                                \
                                                                                                                     \
    /* The estimate summed over `batch` streams, one output per parameter: Re(conj(g) e) into out_nu, out_theta,     \
     * out_gamma (H,) and out_b_re (H, I), -Im(conj(g) e_b) into out_b_im (H, I), and zeros into the readout's       \
     * out_c_re, out_c_im (I, H) and out_d (I,) (outside the recurrence: writing them here is cheaper than asking    \
     * PyTorch for zeroed memory), from grad_h (B, H), e_units (B, 3, H) and e_b (B, H, I) complex. Returns the sum  \
     * of the real view of grad_h and of the five recurrent outputs. */                                              \
    VECTOR_CLONES                                                                                                    \
    static double lru_gradient_body_##SUFFIX(const T *restrict grad_h, const T *restrict e_units,                    \
                                             const T *restrict e_b, long batch, long hidden, long inputs,            \
                                             T *restrict out_nu, T *restrict out_theta, T *restrict out_gamma,       \
                                             T *restrict out_re, T *restrict out_im, T *restrict out_c_re,           \
                                             T *restrict out_c_im, T *restrict out_d) {                              \
        const long units = 3 * hidden, weights = hidden * inputs;                                                    \
        T *restrict const outs[3] = {out_nu, out_theta, out_gamma};                                                  \
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
                T *restrict o = outs[c];                                                                             \
                if (b == 0) {                                                                                        \
                    _Pragma("omp simd") for (long k = 0; k < hidden; ++k) o[k] =                                     \
                        g[2 * k] * e_c[2 * k] + g[2 * k + 1] * e_c[2 * k + 1];                                       \
                } else {                                                                                             \
                    _Pragma("omp simd") for (long k = 0; k < hidden; ++k) o[k] +=                                    \
                        g[2 * k] * e_c[2 * k] + g[2 * k + 1] * e_c[2 * k + 1];                                       \
                }                                                                                                    \
            }                                                                                                        \
            /* conj(g) e_B: its real part for B_re, minus its imaginary part for B_im (g_im e_re - g_re e_im) */     \
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
        for (int c = 0; c < 3; ++c) {                                                                                \
            const T *restrict o = outs[c];                                                                           \
            _Pragma("omp simd reduction(+ : out_sum)") for (long k = 0; k < hidden; ++k) out_sum += o[k];            \
        }                                                                                                            \
        _Pragma("omp simd reduction(+ : out_sum)") for (long p = 0; p < weights; ++p) out_sum += out_re[p];          \
        _Pragma("omp simd reduction(+ : out_sum)") for (long p = 0; p < weights; ++p) out_sum += out_im[p];          \
        for (long p = 0; p < weights; ++p) out_c_re[p] = 0;                                                          \
        for (long p = 0; p < weights; ++p) out_c_im[p] = 0;                                                          \
        for (long j = 0; j < inputs; ++j) out_d[j] = 0;                                                              \
        return total + (double)out_sum;                                                                              \
    }                                                                                                                \
                                                                                                                     \
    /* The exported entry points take two arrays of 64-bit integers: ctypes converts each argument of a call in      \
     * Python (about 0.15 us apiece), and an array whose entries are written one by one costs a fraction of that.    \
     * `setup` (one per estimator, written when the parameters change): the addresses of nu_log, theta_log,          \
     * gamma_log, b_re, b_im, then hidden, inputs, then the address of the cache (0 for none). step's `args`: the    \
     * addresses of x, h, e_units, e_b, h_new, e_units_new, e_b_new, then batch. gradient's `args`: the addresses    \
     * of grad_h, e_units, e_b, out_nu, out_theta, out_gamma, out_b_re, out_b_im, out_c_re, out_c_im, out_d, then    \
     * batch (of `setup`, it reads hidden and inputs). The bodies above carry the vector clones. */                  \
    double lru_step_##SUFFIX(const int64_t *restrict setup, const int64_t *restrict args) {                          \
        return lru_step_body_##SUFFIX(ADDRESS(const T, setup[0]), ADDRESS(const T, setup[1]),                        \
                                      ADDRESS(const T, setup[2]), ADDRESS(const T, setup[3]),                        \
                                      ADDRESS(const T, setup[4]), ADDRESS(const T, args[0]),                         \
                                      ADDRESS(const T, args[1]), ADDRESS(const T, args[2]),                          \
                                      ADDRESS(const T, args[3]), (long)args[7], (long)setup[5], (long)setup[6],      \
                                      ADDRESS(T, args[4]), ADDRESS(T, args[5]), ADDRESS(T, args[6]),                 \
                                      ADDRESS(struct lru_cache, setup[7]));                                          \
    }                                                                                                                \
                                                                                                                     \
    double lru_gradient_##SUFFIX(const int64_t *restrict setup, const int64_t *restrict args) {                      \
        return lru_gradient_body_##SUFFIX(ADDRESS(const T, args[0]), ADDRESS(const T, args[1]),                      \
                                          ADDRESS(const T, args[2]), (long)args[11], (long)setup[5],                 \
                                          (long)setup[6], ADDRESS(T, args[3]), ADDRESS(T, args[4]),                  \
                                          ADDRESS(T, args[5]), ADDRESS(T, args[6]), ADDRESS(T, args[7]),             \
                                          ADDRESS(T, args[8]), ADDRESS(T, args[9]), ADDRESS(T, args[10]));           \
    }

DEFINE_LRU_KERNELS(float, float32, expf, cosf, sinf)
DEFINE_LRU_KERNELS(double, float64, exp, cos, sin)
