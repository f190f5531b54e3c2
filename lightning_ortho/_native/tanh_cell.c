/* The tanh cell's step h' = tanh(W_h h + W_x x + b) in one call (TanhRNNCell.forward at small sizes outside
 * autograd, where PyTorch's addmm, add and tanh are each a dispatch that costs more than the arithmetic). */
#include <math.h>

#include "tanh_cell.h"
#include "vector_clones.h"

#define DEFINE_FORWARD(T, SUFFIX, TANH)                                                                              \
    DEFINE_TANH_CELL(T, SUFFIX, TANH)                                                                                \
    VECTOR_CLONES                                                                                                    \
    void tanh_cell_forward_##SUFFIX(const T *restrict w_hh, const T *restrict w_ih, const T *restrict bias,          \
                                    const T *restrict x, const T *restrict h, long batch, long hidden, long inputs,  \
                                    T *restrict h_new) {                                                             \
        tanh_cell_##SUFFIX(w_hh, w_ih, bias, x, h, batch, hidden, inputs, h_new);                                    \
    }

DEFINE_FORWARD(float, float32, tanhf)
DEFINE_FORWARD(double, float64, tanh)
