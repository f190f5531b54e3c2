/* The step of the tanh cell, h' = tanh(W_h h + W_x x + b), for the fused one-pass steps of the online estimators
 * (each kernel that steps a TanhRNNCell includes this header, so the cell's arithmetic is written once).
 *
 * DEFINE_TANH_CELL(T, SUFFIX, TANH) defines, for the scalar type T:
 *     static void tanh_cell_SUFFIX(w_hh (H, H), w_ih (H, I), bias (H,), x (B, I), h (B, H), batch, hidden, inputs,
 *                                  h_new (B, H))
 * every array C-contiguous, h_new not aliasing the others. Each preactivation is a dot product summed in SIMD lanes
 * (the omp simd reduction: another order than BLAS's, so it agrees with PyTorch's addmm to rounding, not bit for
 * bit); no fast-math, so a NaN or inf in x, h or the weights reaches h_new. */
#ifndef LIGHTNING_ORTHO_TANH_CELL_H
#define LIGHTNING_ORTHO_TANH_CELL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Always inlined: a helper left out of line is compiled for the baseline target only, not cloned with the
 * VECTOR_CLONES function that calls it. */
#if defined(__GNUC__)
#define TANH_CELL_INLINE static inline __attribute__((always_inline))
#else
#define TANH_CELL_INLINE static inline
#endif

/* tanh of a float, computed in double so that a loop of it vectorises: libm's tanhf is one scalar call per element
 * (about 13 ns, as much as the arithmetic of a 64-unit step), this about a nanosecond in 256-bit lanes. Within an ulp
 * of tanh rounded to float (the double result is good to about 1e-14, relative). For |x| < 0.01 the series to x^5
 * (relative error below 6e-14); otherwise (1 - t) / (1 + t) with t = exp(-2|x|) = 2^k e^r, k = round(-2|x| / ln 2),
 * |r| <= ln 2 / 2 (Cody and Waite's two-part ln 2) and e^r to r^11 (relative error below 1e-14); |x| is clamped to 20,
 * where tanh is 1 in float (as from 9.01 on), and the sign is copied back (tanh(-0) = -0). A NaN stays NaN through
 * every branch (the clamp compares `a > 20`, false for a NaN). */
/* `condition ? when_true : otherwise` as a bit mask: GCC keeps a branch (and does not vectorise the loop) where a
 * conditional feeds floating-point operations that may trap */
TANH_CELL_INLINE double tanh_cell_select(int condition, double when_true, double otherwise) {
    uint64_t true_bits, other_bits;
    memcpy(&true_bits, &when_true, sizeof true_bits);
    memcpy(&other_bits, &otherwise, sizeof other_bits);
    const uint64_t mask = -(uint64_t)(condition != 0);
    const uint64_t bits = (true_bits & mask) | (other_bits & ~mask);
    double chosen;
    memcpy(&chosen, &bits, sizeof chosen);
    return chosen;
}

TANH_CELL_INLINE float tanh_cell_tanhf(float value) {
    const double x = value, a = fabs(x), s = a * a;
    const double small = a * (1.0 + s * (-1.0 / 3.0 + s * (2.0 / 15.0)));
    const double y = -2.0 * tanh_cell_select(a > 20.0, 20.0, a);
    const double shifter = 0x1.8p52; /* adding it rounds to an integer, kept in the low bits of its representation */
    const double k = (y * 0x1.71547652b82fep0 + shifter) - shifter;
    const double r = (y - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
    double e = 1.0 / 39916800.0;
    e = e * r + 1.0 / 3628800.0;
    e = e * r + 1.0 / 362880.0;
    e = e * r + 1.0 / 40320.0;
    e = e * r + 1.0 / 5040.0;
    e = e * r + 1.0 / 720.0;
    e = e * r + 1.0 / 120.0;
    e = e * r + 1.0 / 24.0;
    e = e * r + 1.0 / 6.0;
    e = e * r + 0.5;
    e = e * r + 1.0;
    e = e * r + 1.0;
    /* 2^k: the biased exponent k + 1023 (in [965, 1022]) moved into the exponent field */
    const double biased = k + (shifter + 1023.0);
    uint64_t bits;
    memcpy(&bits, &biased, sizeof bits);
    bits <<= 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    const double t = e * scale;
    return (float)copysign(tanh_cell_select(a < 0.01, small, (1.0 - t) / (1.0 + t)), x);
}

#define DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                            \
    TANH_CELL_INLINE void tanh_cell_##SUFFIX(const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias,    \
                                          const T *restrict x, const T *restrict h, long batch, long hidden,         \
                                          long inputs, T *restrict h_new) {                                          \
        for (long b = 0; b < batch; ++b) {                                                                           \
            const T *restrict hb = h + b * hidden;                                                                   \
            const T *restrict xb = x + b * inputs;                                                                   \
            T *restrict out = h_new + b * hidden;                                                                    \
            long i = 0;                                                                                              \
            /* four rows at a time: four independent sums in flight (one row's sum waits on each addition) */       \
            for (; i + 4 <= hidden; i += 4) {                                                                        \
                const T *restrict h0 = w_hh + i * hidden, *restrict h1 = h0 + hidden, *restrict h2 = h1 + hidden,    \
                                  *restrict h3 = h2 + hidden;                                                        \
                const T *restrict x0 = w_ih + i * inputs, *restrict x1 = x0 + inputs, *restrict x2 = x1 + inputs,    \
                                  *restrict x3 = x2 + inputs;                                                        \
                T z_h0 = 0, z_h1 = 0, z_h2 = 0, z_h3 = 0, z_x0 = 0, z_x1 = 0, z_x2 = 0, z_x3 = 0;                    \
                _Pragma("omp simd reduction(+ : z_h0, z_h1, z_h2, z_h3)") for (long j = 0; j < hidden; ++j) {        \
                    const T v = hb[j];                                                                               \
                    z_h0 += h0[j] * v;                                                                               \
                    z_h1 += h1[j] * v;                                                                               \
                    z_h2 += h2[j] * v;                                                                               \
                    z_h3 += h3[j] * v;                                                                               \
                }                                                                                                    \
                _Pragma("omp simd reduction(+ : z_x0, z_x1, z_x2, z_x3)") for (long j = 0; j < inputs; ++j) {        \
                    const T v = xb[j];                                                                               \
                    z_x0 += x0[j] * v;                                                                               \
                    z_x1 += x1[j] * v;                                                                               \
                    z_x2 += x2[j] * v;                                                                               \
                    z_x3 += x3[j] * v;                                                                               \
                }                                                                                                    \
                out[i] = bias[i] + z_h0 + z_x0;                                                                      \
                out[i + 1] = bias[i + 1] + z_h1 + z_x1;                                                              \
                out[i + 2] = bias[i + 2] + z_h2 + z_x2;                                                              \
                out[i + 3] = bias[i + 3] + z_h3 + z_x3;                                                              \
            }                                                                                                        \
            for (; i < hidden; ++i) {                                                                                \
                const T *restrict row_h = w_hh + i * hidden;                                                         \
                const T *restrict row_x = w_ih + i * inputs;                                                         \
                T z_h = 0, z_x = 0;                                                                                  \
                _Pragma("omp simd reduction(+ : z_h)") for (long j = 0; j < hidden; ++j) z_h += row_h[j] * hb[j];    \
                _Pragma("omp simd reduction(+ : z_x)") for (long j = 0; j < inputs; ++j) z_x += row_x[j] * xb[j];    \
                out[i] = bias[i] + z_h + z_x;                                                                        \
            }                                                                                                        \
            /* the activation over the row, apart: a loop that vectorises where TANH is written to (tanh_cell_tanhf) */ \
            _Pragma("omp simd") for (long j = 0; j < hidden; ++j) out[j] = TANH(out[j]);                             \
        }                                                                                                            \
    }

#endif
