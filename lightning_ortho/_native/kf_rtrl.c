/* KF-RTRL's kernels (Mujika, Meier & Steger 2018) on the tanh cell h' = tanh(W_h h + W_x x + b): one step and the
 * summed estimate, each in one call.
 *
 * State per stream: u (n_a,) with n_a = H + I + 1 and A (H, H) (Z = H rows of W = [W_h W_x b]), so that
 * dh/dvec(W) ~ u^T (x) A. With d = 1 - h'^2, a = [h; x; 1], J A = diag(d) W_h A and the signs (c1, c2) drawn by the
 * caller (as bits b in {0, 1}: c = 2 b - 1):
 *     p1 = sqrt((||J A|| + eps) / (||u|| + eps)),     p2 = sqrt((||d|| + eps) / (||a|| + eps))
 *     u' = (c1 p1) u + (c2 p2) a,                     A' = (c1 / p1) J A + (c2 / p2) diag(d)
 * (||diag(d)|| = ||d||.) The estimate is sum_b (A_b^T g_b) u_b^T (Z, n_a), written by parameter: W_h (H, H),
 * W_x (H, I) and b (H,), each into an output of its own.
 *
 * Arithmetic in the order of the PyTorch path (lightning_ortho.online.KFRTRL): (W_h A) first, then times d, then
 * times c1 / p1, plus (c2 / p2) d on the diagonal; sums in SIMD lanes, so results agree with it to rounding. All
 * arrays C-contiguous; no fast-math, so a NaN or inf in an input reaches the returned sums, which the callers check.
 */
#include <math.h>

#include "tanh_cell.h"
#include "vector_clones.h"

/* The arguments of the two exported functions, packed by the binding into one buffer (struct.Struct, native layout):
 * one ctypes argument instead of sixteen or eight, which ctypes would convert one by one in Python (about a
 * microsecond for sixteen, a tenth of the step at H = 32). */
typedef struct {
    const void *w_hh, *w_ih, *bias, *x, *h, *u, *hidden, *bits;
    void *h_new, *u_new, *hidden_new;
    long batch, hidden_size, inputs, product_given;
    double eps;
} kf_rtrl_step_arguments;

typedef struct {
    const void *hidden, *u, *grad_h;
    void *scratch, *out_hh, *out_ih, *out_b;
    long batch, hidden_size, inputs;
} kf_rtrl_gradient_arguments;

/* Rows of A^T g kept on the stack by kf_rtrl_gradient when the caller passes no scratch (Python passes one above). */
#define KF_RTRL_STACK_ROWS 1024

#define DEFINE_KERNELS(T, SUFFIX, SQRT, TANH)                                                                         \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                 \
                                                                                                                      \
    /* 32 bytes of T (GCC/clang vector extension: an AVX register in the AVX2 clone, two SSE registers in the         \
     * baseline one); unaligned, and it may alias T. */                                                               \
    typedef T kf_rtrl_vector_##SUFFIX __attribute__((vector_size(32), aligned(sizeof(T)), may_alias));                \
                                                                                                                      \
    /* propagated (H, H) <- diag(d) (W_h A) for one stream (d = 1 - h'^2 from h_new y); returns ||propagated||^2.     \
     * Tiles of 4 rows x 2 vectors of the product stay in eight registers while k runs over W_h's columns and A's     \
     * rows (per k: two loads of A, four entries of W_h, sixteen products and sums: no partial sums stored and        \
     * reloaded, which makes the plain i-k-j loop twice as slow); the rows and columns past the last full tile take   \
     * plain loops. Each entry sums over k in order and is then multiplied by d_i, as the PyTorch path's              \
     * d[:, None] * (W_h @ A). Always inlined: out of line, a static function is compiled for the baseline target     \
     * only (not cloned for AVX2). */                                                                                 \
    static inline __attribute__((always_inline)) T kf_rtrl_propagate_##SUFFIX(                                        \
        const T *restrict w_hh, const T *restrict a_old, const T *restrict y, long hidden, T *restrict out) {         \
        typedef kf_rtrl_vector_##SUFFIX V;                                                                            \
        enum { LANES = 32 / sizeof(T) };                                                                              \
        const long full_rows = hidden - hidden % 4, full_columns = hidden - hidden % (2 * LANES);                     \
        V norm2_lanes = {0};                                                                                          \
        T norm2 = 0;                                                                                                  \
        for (long i = 0; i < full_rows; i += 4) {                                                                     \
            const T *restrict w0 = w_hh + i * hidden;                                                                 \
            const T *restrict w1 = w0 + hidden;                                                                       \
            const T *restrict w2 = w1 + hidden;                                                                       \
            const T *restrict w3 = w2 + hidden;                                                                       \
            const T d0 = 1 - y[i] * y[i], d1 = 1 - y[i + 1] * y[i + 1];                                               \
            const T d2 = 1 - y[i + 2] * y[i + 2], d3 = 1 - y[i + 3] * y[i + 3];                                       \
            for (long j = 0; j < full_columns; j += 2 * LANES) {                                                      \
                V c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};             \
                for (long k = 0; k < hidden; ++k) {                                                                   \
                    const V x0 = *(const V *)(a_old + k * hidden + j);                                                \
                    const V x1 = *(const V *)(a_old + k * hidden + j + LANES);                                        \
                    const T v0 = w0[k], v1 = w1[k], v2 = w2[k], v3 = w3[k];                                           \
                    c00 += v0 * x0;                                                                                   \
                    c01 += v0 * x1;                                                                                   \
                    c10 += v1 * x0;                                                                                   \
                    c11 += v1 * x1;                                                                                   \
                    c20 += v2 * x0;                                                                                   \
                    c21 += v2 * x1;                                                                                   \
                    c30 += v3 * x0;                                                                                   \
                    c31 += v3 * x1;                                                                                   \
                }                                                                                                     \
                T *restrict row = out + i * hidden + j;                                                               \
                const V p00 = d0 * c00, p01 = d0 * c01, p10 = d1 * c10, p11 = d1 * c11;                               \
                const V p20 = d2 * c20, p21 = d2 * c21, p30 = d3 * c30, p31 = d3 * c31;                               \
                *(V *)row = p00;                                                                                      \
                *(V *)(row + LANES) = p01;                                                                            \
                *(V *)(row + hidden) = p10;                                                                           \
                *(V *)(row + hidden + LANES) = p11;                                                                   \
                *(V *)(row + 2 * hidden) = p20;                                                                       \
                *(V *)(row + 2 * hidden + LANES) = p21;                                                               \
                *(V *)(row + 3 * hidden) = p30;                                                                       \
                *(V *)(row + 3 * hidden + LANES) = p31;                                                               \
                norm2_lanes += p00 * p00 + p01 * p01 + p10 * p10 + p11 * p11;                                         \
                norm2_lanes += p20 * p20 + p21 * p21 + p30 * p30 + p31 * p31;                                         \
            }                                                                                                         \
            for (long r = 0; r < 4; ++r) { /* the columns past the last full tile */                                  \
                const T *restrict w_row = w0 + r * hidden;                                                            \
                const T slope = 1 - y[i + r] * y[i + r];                                                              \
                for (long j = full_columns; j < hidden; ++j) {                                                        \
                    T sum = 0;                                                                                        \
                    for (long k = 0; k < hidden; ++k) sum += w_row[k] * a_old[k * hidden + j];                        \
                    const T value = slope * sum;                                                                      \
                    out[(i + r) * hidden + j] = value;                                                                \
                    norm2 += value * value;                                                                           \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
        for (long i = full_rows; i < hidden; ++i) { /* the rows past the last full tile, i-k-j */                     \
            T *restrict row = out + i * hidden;                                                                       \
            const T *restrict w_row = w_hh + i * hidden;                                                              \
            const T slope = 1 - y[i] * y[i];                                                                          \
            _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row[j] = 0;                                         \
            for (long k = 0; k < hidden; ++k) {                                                                       \
                const T *restrict a_row = a_old + k * hidden;                                                         \
                const T v = w_row[k];                                                                                 \
                _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row[j] += v * a_row[j];                         \
            }                                                                                                         \
            _Pragma("omp simd reduction(+ : norm2)") for (long j = 0; j < hidden; ++j) {                              \
                const T value = slope * row[j];                                                                       \
                row[j] = value;                                                                                       \
                norm2 += value * value;                                                                               \
            }                                                                                                         \
        }                                                                                                             \
        for (long lane = 0; lane < LANES; ++lane) norm2 += norm2_lanes[lane];                                         \
        return norm2;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* propagated (H, H) <- diag(d) propagated in place (it holds W_h A from BLAS); returns ||propagated||^2.         \
     * (Always inlined, as kf_rtrl_propagate.) */                                                                     \
    static inline __attribute__((always_inline)) T kf_rtrl_scale_rows_##SUFFIX(                                       \
        const T *restrict y, long hidden, T *restrict out) {                                                          \
        T norm2 = 0;                                                                                                  \
        for (long i = 0; i < hidden; ++i) {                                                                           \
            const T slope = 1 - y[i] * y[i];                                                                          \
            T *restrict row = out + i * hidden;                                                                       \
            _Pragma("omp simd reduction(+ : norm2)") for (long j = 0; j < hidden; ++j) {                              \
                const T value = slope * row[j];                                                                       \
                row[j] = value;                                                                                       \
                norm2 += value * value;                                                                               \
            }                                                                                                         \
        }                                                                                                             \
        return norm2;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* One step for batch streams: h_new (B, H), u_new (B, n_a), hidden_new (B, H, H) from w_hh (H, H), w_ih (H, I),  \
     * bias (H,), x (B, I), h (B, H), u (B, n_a), hidden (B, H, H) and bits (B, 2) in {0, 1}, the signs               \
     * (c1, c2) = 2 bits - 1 per stream (the draw of StreamNoise._draw before its conversion to signs). With          \
     * product_given, hidden_new already holds W_h A per stream (a BLAS product: large H) and is finished in place;   \
     * else the product is taken here. The outputs alias no input. Returns the sum of x, h_new, u_new and hidden_new  \
     * (in double; NaN/inf when the step is not finite). */                                                           \
    static inline __attribute__((always_inline)) double kf_rtrl_step_##SUFFIX(                                        \
        const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias, const T *restrict x,                  \
        const T *restrict h, const T *restrict u, const T *restrict hidden_old, const T *restrict bits, long batch,   \
        long hidden, long inputs, T eps, long product_given, T *restrict h_new, T *restrict u_new,                    \
        T *restrict hidden_new) {                                                                                     \
        const long width = hidden + inputs + 1, square = hidden * hidden;                                             \
        tanh_cell_##SUFFIX(w_hh, w_ih, bias, x, h, batch, hidden, inputs, h_new);                                     \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict hb = h + b * hidden;                                                                    \
            const T *restrict xb = x + b * inputs;                                                                    \
            const T *restrict yb = h_new + b * hidden;                                                                \
            const T *restrict ub = u + b * width;                                                                     \
            T *restrict out = hidden_new + b * square;                                                                \
            T *restrict u_out = u_new + b * width;                                                                    \
            const T *restrict a_b = hidden_old + b * square;                                                          \
            const T propagated2 = product_given ? kf_rtrl_scale_rows_##SUFFIX(yb, hidden, out)                        \
                                                : kf_rtrl_propagate_##SUFFIX(w_hh, a_b, yb, hidden, out);             \
            T slope2 = 0, h2 = 0, x2 = 0, u2 = 0, y_total = 0, x_total = 0;                                           \
            _Pragma("omp simd reduction(+ : slope2, y_total)") for (long i = 0; i < hidden; ++i) {                    \
                const T y = yb[i];                                                                                    \
                const T slope = 1 - y * y;                                                                            \
                slope2 += slope * slope;                                                                              \
                y_total += y;                                                                                         \
            }                                                                                                         \
            _Pragma("omp simd reduction(+ : h2)") for (long j = 0; j < hidden; ++j) h2 += hb[j] * hb[j];              \
            _Pragma("omp simd reduction(+ : x2, x_total)") for (long j = 0; j < inputs; ++j) {                        \
                x2 += xb[j] * xb[j];                                                                                  \
                x_total += xb[j];                                                                                     \
            }                                                                                                         \
            _Pragma("omp simd reduction(+ : u2)") for (long j = 0; j < width; ++j) u2 += ub[j] * ub[j];               \
            const T c1 = 2 * bits[2 * b] - 1, c2 = 2 * bits[2 * b + 1] - 1; /* exact */                               \
            const T p1 = SQRT((SQRT(propagated2) + eps) / (SQRT(u2) + eps));                                          \
            const T p2 = SQRT((SQRT(slope2) + eps) / (SQRT(h2 + x2 + 1) + eps));                                      \
            const T s1 = c1 / p1, s2 = c2 / p2, t1 = c1 * p1, t2 = c2 * p2;                                           \
            T a_total = 0, u_total = 0;                                                                               \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                T *restrict row = out + i * hidden;                                                                   \
                _Pragma("omp simd reduction(+ : a_total)") for (long j = 0; j < hidden; ++j) {                        \
                    const T value = s1 * row[j];                                                                      \
                    row[j] = value;                                                                                   \
                    a_total += value;                                                                                 \
                }                                                                                                     \
                const T diagonal = row[i] + s2 * (1 - yb[i] * yb[i]);                                                 \
                a_total += diagonal - row[i]; /* the sum counts the new diagonal (NaN where it overflowed) */         \
                row[i] = diagonal;                                                                                    \
            }                                                                                                         \
            _Pragma("omp simd reduction(+ : u_total)") for (long j = 0; j < hidden; ++j) {                            \
                const T value = t1 * ub[j] + t2 * hb[j];                                                              \
                u_out[j] = value;                                                                                     \
                u_total += value;                                                                                     \
            }                                                                                                         \
            _Pragma("omp simd reduction(+ : u_total)") for (long j = 0; j < inputs; ++j) {                            \
                const T value = t1 * ub[hidden + j] + t2 * xb[j];                                                     \
                u_out[hidden + j] = value;                                                                            \
                u_total += value;                                                                                     \
            }                                                                                                         \
            const T last = t1 * ub[width - 1] + t2;                                                                   \
            u_out[width - 1] = last;                                                                                  \
            total += (double)a_total + (double)u_total + (double)last + (double)y_total + (double)x_total;            \
        }                                                                                                             \
        return total;                                                                                                 \
    }                                                                                                                 \
                                                                                                                      \
    /* kf_rtrl_step with its arguments unpacked (kf_rtrl_step_arguments). */                                          \
    VECTOR_CLONES                                                                                                     \
    double kf_rtrl_tanh_step_##SUFFIX(const kf_rtrl_step_arguments *a) {                                              \
        return kf_rtrl_step_##SUFFIX(a->w_hh, a->w_ih, a->bias, a->x, a->h, a->u, a->hidden, a->bits, a->batch,       \
                                     a->hidden_size, a->inputs, (T)a->eps, a->product_given, a->h_new, a->u_new,      \
                                     a->hidden_new);                                                                  \
    }                                                                                                                 \
                                                                                                                      \
    /* The summed estimate sum_b (A_b^T g_b) u_b^T (H, n_a) by parameter: its columns [W_h | W_x | b] into out_hh     \
     * (H, H), out_ih (H, I) and out_b (H,), from hidden (B, H, H), u (B, n_a) and grad_h (B, H); scratch holds H     \
     * entries (NULL: the stack, for H up to KF_RTRL_STACK_ROWS). Returns the sum of grad_h and of the estimate (in   \
     * double; NaN/inf when either is not finite). */                                                                 \
    static inline __attribute__((always_inline)) double kf_rtrl_estimate_##SUFFIX(                                    \
        const T *restrict hidden_factor, const T *restrict u, const T *restrict grad_h, long batch, long hidden,      \
        long inputs, T *restrict scratch, T *restrict out, T *restrict out_ih, T *restrict out_b) {                   \
        T stack[KF_RTRL_STACK_ROWS];                                                                                  \
        T *restrict r = scratch ? scratch : stack;                                                                    \
        const long width = hidden + inputs + 1, square = hidden * hidden;                                             \
        double total = 0;                                                                                             \
        for (long b = 0; b < batch; ++b) {                                                                            \
            const T *restrict a_b = hidden_factor + b * square;                                                       \
            const T *restrict gb = grad_h + b * hidden;                                                               \
            const T *restrict ub = u + b * width;                                                                     \
            T g_total = 0;                                                                                            \
            _Pragma("omp simd") for (long z = 0; z < hidden; ++z) r[z] = 0;                                           \
            for (long k = 0; k < hidden; ++k) { /* r = A^T g, along A's rows */                                       \
                const T gk = gb[k];                                                                                   \
                const T *restrict row = a_b + k * hidden;                                                             \
                _Pragma("omp simd") for (long z = 0; z < hidden; ++z) r[z] += gk * row[z];                            \
                g_total += gk;                                                                                        \
            }                                                                                                         \
            total += g_total;                                                                                         \
            const T last = ub[width - 1];                                                                             \
            for (long i = 0; i < hidden; ++i) {                                                                       \
                const T ri = r[i];                                                                                    \
                T *restrict row_hh = out + i * hidden;                                                                \
                T *restrict row_ih = out_ih + i * inputs;                                                             \
                if (b == 0) {                                                                                         \
                    _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row_hh[j] = ri * ub[j];                     \
                    _Pragma("omp simd") for (long j = 0; j < inputs; ++j) row_ih[j] = ri * ub[hidden + j];            \
                    out_b[i] = ri * last;                                                                             \
                } else {                                                                                              \
                    _Pragma("omp simd") for (long j = 0; j < hidden; ++j) row_hh[j] += ri * ub[j];                    \
                    _Pragma("omp simd") for (long j = 0; j < inputs; ++j) row_ih[j] += ri * ub[hidden + j];           \
                    out_b[i] += ri * last;                                                                            \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
        T out_total = 0;                                                                                              \
        _Pragma("omp simd reduction(+ : out_total)") for (long p = 0; p < square; ++p) out_total += out[p];           \
        _Pragma("omp simd reduction(+ : out_total)") for (long p = 0; p < hidden * inputs; ++p) {                     \
            out_total += out_ih[p];                                                                                   \
        }                                                                                                             \
        _Pragma("omp simd reduction(+ : out_total)") for (long p = 0; p < hidden; ++p) out_total += out_b[p];         \
        return total + out_total;                                                                                     \
    }                                                                                                                 \
                                                                                                                      \
    /* kf_rtrl_estimate with its arguments unpacked (kf_rtrl_gradient_arguments). */                                  \
    VECTOR_CLONES                                                                                                     \
    double kf_rtrl_gradient_##SUFFIX(const kf_rtrl_gradient_arguments *a) {                                           \
        return kf_rtrl_estimate_##SUFFIX(a->hidden, a->u, a->grad_h, a->batch, a->hidden_size, a->inputs,             \
                                         a->scratch, a->out_hh, a->out_ih, a->out_b);                                 \
    }

DEFINE_KERNELS(float, float32, sqrtf, tanh_cell_tanhf)
DEFINE_KERNELS(double, float64, sqrt, tanh)
