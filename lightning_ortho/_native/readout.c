/* One online step of a linear readout o = W h + c with its loss and gradients, for OnlineRNNModule's step.
 *
 * Per stream b of h (batch, hidden), scored when mask[b] (and, for class targets, y[b] != ignore_index):
 *     mse:                 l = 0.5 ||o - y||^2,                 dl/do = o - y
 *     cross-entropy:       l = -sum_k y_k log softmax(o)_k,     dl/do = softmax(o) sum_k y_k - y
 *                          (a class index is its one-hot row)
 * and g_b = dl/do / streams at scored streams, 0 elsewhere (their targets, NaN or out of range, are never read);
 * then grad_h = g W, grad_weight = g^T h and grad_bias = sum_b g_b. In eager PyTorch these are about fifteen kernel
 * launches on tiny tensors; here one pass. The loss sum (summed in double) is returned and written to loss_out; the
 * return is NaN when a scored class index is out of range (the caller then runs its PyTorch path, which says why).
 *
 * With no outputs the loss is 0 and every gradient 0 (the binding declines empty problems before calling anyway).
 * h, weight, bias and the outputs are C-contiguous; y and mask are read with strides (a step of a chunk). No
 * fast-math: a NaN or inf in h or the weights reaches the outputs and gradients as PyTorch's ops would carry it.
 */
#include <math.h>

#include "vector_clones.h"

#define DEFINE_KERNELS(T, SUFFIX, EXP, LOG)                                                                           \
    VECTOR_CLONES                                                                                                     \
    double readout_linear_##SUFFIX(const T *restrict h, long batch, long hidden, const T *restrict weight,            \
                                   long outputs, const T *restrict bias, const T *restrict y_real,                    \
                                   const long long *restrict y_index, long y_row_stride, long y_column_stride,        \
                                   const unsigned char *restrict mask, long mask_stride, int cross_entropy,           \
                                   long ignore_index, double streams, T *restrict scratch, T *restrict grad_h,        \
                                   T *restrict grad_weight, T *restrict grad_bias, double *restrict loss_out) {       \
        double loss = 0;                                                                                              \
        const T inverse_streams = (T)(1.0 / streams);                                                                 \
        if (grad_weight)                                                                                              \
            for (long i = 0; i < outputs * hidden; ++i) grad_weight[i] = 0;                                           \
        if (grad_bias)                                                                                                \
            for (long k = 0; k < outputs; ++k) grad_bias[k] = 0;                                                      \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict hb = h + b * hidden;                                                                    \
            T *restrict gh = grad_h + b * hidden;                                                                     \
            T *restrict g = scratch; /* o, then g */                                                                  \
            int scored = !mask || mask[b * mask_stride];                                                              \
            long long target = 0;                                                                                     \
            if (y_index) {                                                                                            \
                target = y_index[b * y_row_stride];                                                                   \
                scored = scored && target != ignore_index;                                                            \
                if (scored && (target < 0 || target >= outputs)) return NAN; /* the caller's PyTorch path says so */  \
            }                                                                                                         \
            for (long k = 0; k < outputs; ++k) {                                                                      \
                const T *restrict wk = weight + k * hidden;                                                           \
                T o = 0;                                                                                              \
                _Pragma("omp simd reduction(+ : o)") for (long j = 0; j < hidden; ++j) o += wk[j] * hb[j];            \
                g[k] = bias ? o + bias[k] : o;                                                                        \
            }                                                                                                         \
            if (!scored) {                                                                                            \
                for (long k = 0; k < outputs; ++k) g[k] = 0;                                                          \
            } else if (!cross_entropy) {                                                                              \
                T row = 0;                                                                                            \
                for (long k = 0; k < outputs; ++k) {                                                                  \
                    const T r = g[k] - y_real[b * y_row_stride + k * y_column_stride];                                \
                    row += r * r;                                                                                     \
                    g[k] = r * inverse_streams;                                                                       \
                }                                                                                                     \
                loss += 0.5 * (double)row;                                                                            \
            } else if (outputs > 0) { /* no outputs: nothing to normalise, the loss is 0 (as log_softmax gives) */    \
                T highest = g[0];                                                                                     \
                for (long k = 1; k < outputs; ++k) highest = g[k] > highest ? g[k] : highest;                         \
                T total = 0;                                                                                          \
                for (long k = 0; k < outputs; ++k) total += EXP(g[k] - highest);                                      \
                const T log_total = highest + LOG(total);                                                             \
                if (y_index) { /* l = -log p_y; dl/do = p - onehot(y) */                                              \
                    loss -= (double)(g[target] - log_total);                                                          \
                    for (long k = 0; k < outputs; ++k) g[k] = EXP(g[k] - log_total);                                 \
                    g[target] -= 1;                                                                                   \
                    for (long k = 0; k < outputs; ++k) g[k] *= inverse_streams;                                       \
                } else { /* l = -sum y_k log p_k; dl/do = p sum_k y_k - y */                                          \
                    const T *restrict yb = y_real + b * y_row_stride;                                                 \
                    T mass = 0, row = 0;                                                                              \
                    for (long k = 0; k < outputs; ++k) {                                                              \
                        const T yk = yb[k * y_column_stride];                                                         \
                        mass += yk;                                                                                   \
                        row += yk * (g[k] - log_total);                                                               \
                    }                                                                                                 \
                    loss -= (double)row;                                                                              \
                    for (long k = 0; k < outputs; ++k)                                                                \
                        g[k] = (EXP(g[k] - log_total) * mass - yb[k * y_column_stride]) * inverse_streams;            \
                }                                                                                                     \
            }                                                                                                         \
            for (long j = 0; j < hidden; ++j) gh[j] = 0;                                                              \
            for (long k = 0; k < outputs; ++k) {                                                                      \
                const T gk = g[k];                                                                                    \
                const T *restrict wk = weight + k * hidden;                                                           \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) gh[j] += gk * wk[j];                            \
                if (grad_weight) {                                                                                    \
                    T *restrict dw = grad_weight + k * hidden;                                                        \
                    _Pragma("omp simd") for (long j = 0; j < hidden; ++j) dw[j] += gk * hb[j];                        \
                }                                                                                                     \
                if (grad_bias) grad_bias[k] += gk;                                                                    \
            }                                                                                                         \
        }                                                                                                             \
        *loss_out = loss;                                                                                             \
        return loss;                                                                                                  \
    }

DEFINE_KERNELS(float, float32, expf, logf)
DEFINE_KERNELS(double, float64, exp, log)
