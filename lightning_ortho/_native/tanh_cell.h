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

/* Always inlined: a helper left out of line is compiled for the baseline target only, not cloned with the
 * VECTOR_CLONES function that calls it. */
#if defined(__GNUC__)
#define TANH_CELL_INLINE static inline __attribute__((always_inline))
#else
#define TANH_CELL_INLINE static inline
#endif

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
                out[i] = TANH(bias[i] + z_h0 + z_x0);                                                                \
                out[i + 1] = TANH(bias[i + 1] + z_h1 + z_x1);                                                        \
                out[i + 2] = TANH(bias[i + 2] + z_h2 + z_x2);                                                        \
                out[i + 3] = TANH(bias[i + 3] + z_h3 + z_x3);                                                        \
            }                                                                                                        \
            for (; i < hidden; ++i) {                                                                                \
                const T *restrict row_h = w_hh + i * hidden;                                                         \
                const T *restrict row_x = w_ih + i * inputs;                                                         \
                T z_h = 0, z_x = 0;                                                                                  \
                _Pragma("omp simd reduction(+ : z_h)") for (long j = 0; j < hidden; ++j) z_h += row_h[j] * hb[j];    \
                _Pragma("omp simd reduction(+ : z_x)") for (long j = 0; j < inputs; ++j) z_x += row_x[j] * xb[j];    \
                out[i] = TANH(bias[i] + z_h + z_x);                                                                  \
            }                                                                                                        \
        }                                                                                                            \
    }

#endif
