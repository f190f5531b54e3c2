/* Row kernels of the auxiliary reflection's fast path, y = H(v) x with v = W x (one row per sample).
 *
 * The GEMMs (v = x W^T and the two in the backward pass) stay with PyTorch's BLAS; these kernels do the row work
 * around them in one pass each, which in eager PyTorch takes about seven kernel launches per pass. Every function
 * comes in float and double; arrays are C-contiguous (n, d) unless a stride is passed.
 *
 * Forward:   c = v.x / v.v,  y = x - 2 c v;  span = [min v.v, max v.v] over the rows, NaN where some c or v.v is
 *            not finite (the caller then discards y and takes the careful path).
 * Backward:  with g = dL/dy, t = g.v / v.v:  u = c g + t y,  r = g - 2 t v;  then (in PyTorch)
 *            dL/dx = r - 2 u W,  dL/dW = -2 u^T x.
 */
#include <math.h>

#include "vector_clones.h"

#define DEFINE_KERNELS(T, SUFFIX)                                                                                     \
    VECTOR_CLONES                                                                                                     \
    void reflect_rows_##SUFFIX(const T *restrict x, const T *restrict v, T *restrict y, T *restrict c_out,            \
                               T *restrict vv_out, long n, long d, double *restrict span) {                           \
        double lowest = INFINITY, highest = -INFINITY;                                                                \
        int undefined = 0;                                                                                            \
        for (long i = 0; i < n; ++i) {                                                                                \
            const T *restrict xi = x + i * d;                                                                         \
            const T *restrict vi = v + i * d;                                                                         \
            T *restrict yi = y + i * d;                                                                               \
            T vx = 0, vv = 0;                                                                                         \
            _Pragma("omp simd reduction(+ : vx, vv)") for (long k = 0; k < d; ++k) {                                  \
                vx += vi[k] * xi[k];                                                                                  \
                vv += vi[k] * vi[k];                                                                                  \
            }                                                                                                         \
            const T c = vx / vv;                                                                                      \
            const T minus_two_c = -2 * c;                                                                             \
            _Pragma("omp simd") for (long k = 0; k < d; ++k) yi[k] = xi[k] + minus_two_c * vi[k];                     \
            c_out[i] = c;                                                                                             \
            vv_out[i] = vv;                                                                                           \
            undefined |= !isfinite(c) || isnan(vv);                                                                   \
            if (vv < lowest) lowest = vv;                                                                             \
            if (vv > highest) highest = vv;                                                                           \
        }                                                                                                             \
        span[0] = undefined ? NAN : lowest;                                                                           \
        span[1] = undefined ? NAN : highest;                                                                          \
    }                                                                                                                 \
                                                                                                                      \
    VECTOR_CLONES                                                                                                     \
    void reflect_rows_backward_##SUFFIX(const T *restrict g, long g_row_stride, long g_column_stride,                 \
                                        const T *restrict v, const T *restrict y, const T *restrict c,                \
                                        const T *restrict vv, T *restrict u, T *restrict r, long n, long d) {         \
        for (long i = 0; i < n; ++i) {                                                                                \
            const T *restrict gi = g + i * g_row_stride;                                                              \
            const T *restrict vi = v + i * d;                                                                         \
            const T *restrict yi = y + i * d;                                                                         \
            T *restrict ui = u + i * d;                                                                               \
            T *restrict ri = r + i * d;                                                                               \
            T gv = 0;                                                                                                 \
            _Pragma("omp simd reduction(+ : gv)") for (long k = 0; k < d; ++k) gv += gi[k * g_column_stride] * vi[k]; \
            const T t = gv / vv[i], ci = c[i], minus_two_t = -2 * t;                                                  \
            _Pragma("omp simd") for (long k = 0; k < d; ++k) {                                                        \
                const T gk = gi[k * g_column_stride];                                                                 \
                ui[k] = ci * gk + t * yi[k];                                                                          \
                ri[k] = gk + minus_two_t * vi[k];                                                                     \
            }                                                                                                         \
        }                                                                                                             \
    }

DEFINE_KERNELS(float, float32)
DEFINE_KERNELS(double, float64)
