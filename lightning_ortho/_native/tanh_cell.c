/* The tanh cell's step h' = tanh(W_h h + W_x x + b) in one call (TanhRNNCell.forward at small sizes outside
 * autograd, where PyTorch's addmm, add and tanh are each a dispatch that costs more than the arithmetic). */
#include <math.h>

#include "tanh_cell.h"
#include "vector_clones.h"

/* What a forward reads besides x and h: the cell's parameters and sizes (one struct per cell, written when the
 * parameters change, so that a call passes five arguments instead of nine). */
typedef struct {
    const void *w_hh, *w_ih, *bias;
    long hidden, inputs;
} tanh_cell_setup;

#define DEFINE_FORWARD(T, SUFFIX, TANH)                                                                              \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                \
    VECTOR_CLONES                                                                                                    \
    void tanh_cell_forward_##SUFFIX(const tanh_cell_setup *setup, const T *restrict x, const T *restrict h,          \
                                    long batch, T *restrict h_new) {                                                 \
        tanh_cell_##SUFFIX((const T *)setup->w_hh, (const T *)setup->w_ih, (const T *)setup->bias, x, h, batch,      \
                           setup->hidden, setup->inputs, h_new);                                                     \
    }

DEFINE_FORWARD(float, float32, tanh_cell_tanhf)
DEFINE_FORWARD(double, float64, tanh)
