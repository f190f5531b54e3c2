/* RTRL's kernels (Williams & Zipser 1989) on the tanh cell h' = tanh(W_h h + W_x x + b), around the GEMM W_h M that
 * PyTorch's BLAS computes faster.
 *
 * The influence M (B, H, P) of each stream, with d = 1 - h'^2 and the parameters laid out [vec(W_h), vec(W_x), b]
 * (P = H H + H I + H), steps as
 *     M' = diag(d) (W_h M + dz/dtheta),   dz_i/dW_h[i, j] = h_j,   dz_i/dW_x[i, j] = x_j,   dz_i/db_i = 1
 * (every other entry of dz/dtheta is zero): rtrl_tanh_step takes W_h M in the output, computes the cell's step, adds
 * the H + I + 1 nonzeros of each row of dz/dtheta and scales the row by d_i, in one pass. rtrl_gradient sums the
 * estimate sum_b grad_h_b^T M_b (P,).
 *
 * All arrays are C-contiguous; no fast-math, so a NaN or inf anywhere reaches the returned sums, which the callers
 * check (the sums are taken in double, so finite float32 entries do not overflow them).
 */
#include <math.h>

#include "tanh_cell.h"
#include "vector_clones.h"

/* Entries of the estimate summed over every row before the next block: a block of out stays in L1 while the rows
 * stream past it (16 KiB of float64, 8 KiB of float32). */
#define RTRL_BLOCK 2048

/* Independent partial sums of a pass (16 lanes: four AVX2 vectors of float64): one chain of additions would hold the
 * pass to one vector per add latency, several times slower than the loads and stores. */
#define RTRL_LANES 16

#define DEFINE_KERNELS(T, SUFFIX, TANH)                                                                               \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                 \
                                                                                                                      \
    /* row[p] *= scale for p < n; returns the sum of the new entries (in double). */                                  \
    static inline double scale_and_sum_##SUFFIX(T *restrict row, long n, T scale) {                                  \
        double lanes[RTRL_LANES] = {0};                                                                               \
        long p = 0;                                                                                                   \
        for (; p + RTRL_LANES <= n; p += RTRL_LANES) {                                                                \
            _Pragma("omp simd") for (long k = 0; k < RTRL_LANES; ++k) {                                               \
                const T value = row[p + k] * scale;                                                                   \
                row[p + k] = value;                                                                                   \
                lanes[k] += value;                                                                                    \
            }                                                                                                         \
        }                                                                                                             \
        double total = 0;                                                                                             \
        for (; p < n; ++p) {                                                                                          \
            const T value = row[p] * scale;                                                                           \
            row[p] = value;                                                                                           \
            total += value;                                                                                           \
        }                                                                                                             \
        for (long k = 0; k < RTRL_LANES; ++k) total += lanes[k];                                                      \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* The sum of values[p] for p < n (in double). */                                                                 \
    static inline double sum_##SUFFIX(const T *restrict values, long n) {                                             \
        double lanes[RTRL_LANES] = {0};                                                                               \
        long p = 0;                                                                                                   \
        for (; p + RTRL_LANES <= n; p += RTRL_LANES) {                                                                \
            _Pragma("omp simd") for (long k = 0; k < RTRL_LANES; ++k) lanes[k] += values[p + k];                      \
        }                                                                                                             \
        double total = 0;                                                                                             \
        for (; p < n; ++p) total += values[p];                                                                        \
        for (long k = 0; k < RTRL_LANES; ++k) total += lanes[k];                                                      \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* h_new (B, H) = the cell's step from x (B, I) and h (B, H); influence (B, H, P) holds W_h M on entry and M' on  \
     * exit. Returns the sum of x, h_new and M' (NaN/inf when the step is not finite). */                             \
    VECTOR_CLONES                                                                                                     \
    double rtrl_tanh_step_##SUFFIX(const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias,            \
                                   const T *restrict x, const T *restrict h, long batch, long hidden, long inputs,   \
                                   T *restrict influence, T *restrict h_new) {                                        \
        tanh_cell_##SUFFIX(w_hh, w_ih, bias, x, h, batch, hidden, inputs, h_new);                                     \
        const long input_block = hidden * hidden, bias_block = input_block + hidden * inputs;                         \
        const long size = bias_block + hidden;                                                                        \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict hb = h + b * hidden;                                                                    \
            const T *restrict xb = x + b * inputs;                                                                    \
            const T *restrict yb = h_new + b * hidden;                                                                \
            for (long j = 0; j < inputs; ++j) total += xb[j];                                                         \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                T *restrict row = influence + (b * hidden + i) * size;                                                \
                const T slope = 1 - yb[i] * yb[i];                                                                    \
                total += yb[i];                                                                                       \
                /* the nonzeros of dz_i/dtheta, added before the scaling: M' = d (W_h M + dz/dtheta) (row_hh and     \
                 * row_ih are not restrict: the scaling reads the same entries through row) */                        \
                T *row_hh = row + i * hidden;                                                                         \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row_hh[j] += hb[j];                             \
                T *row_ih = row + input_block + i * inputs;                                                           \
                _Pragma("omp simd") for (long j = 0; j < inputs; ++j) row_ih[j] += xb[j];                             \
                row[bias_block + i] += 1;                                                                             \
                total += scale_and_sum_##SUFFIX(row, size, slope);                                                    \
            }                                                                                                         \
        }                                                                                                             \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* out (P,) = sum_b grad_h_b^T M_b for influence M (B, H, P) and grad_h (B, H), reading M once, row by row, in    \
     * blocks of out that stay in L1. Returns the sum of grad_h and out (NaN/inf when either is not finite). */       \
    VECTOR_CLONES                                                                                                     \
    double rtrl_gradient_##SUFFIX(const T *restrict influence, const T *restrict grad_h, long batch, long hidden,     \
                                  long size, T *restrict out) {                                                       \
        const long rows = batch * hidden;                                                                             \
        double total = sum_##SUFFIX(grad_h, rows);                                                                    \
        for (long start = 0; start < size; start += RTRL_BLOCK) {                                                     \
            const long stop = start + RTRL_BLOCK < size ? start + RTRL_BLOCK : size;                                  \
            const T g0 = grad_h[0];                                                                                   \
            _Pragma("omp simd") for (long p = start; p < stop; ++p) out[p] = g0 * influence[p];                       \
            for (long r = 1; r < rows; ++r) {                                                                         \
                const T *restrict row = influence + r * size;                                                         \
                const T g = grad_h[r];                                                                                \
                _Pragma("omp simd") for (long p = start; p < stop; ++p) out[p] += g * row[p];                         \
            }                                                                                                         \
            total += sum_##SUFFIX(out + start, stop - start);                                                         \
        }                                                                                                             \
        return total;                                                                                                 \
    }

DEFINE_KERNELS(float, float32, tanh_cell_tanhf)
DEFINE_KERNELS(double, float64, tanh)
