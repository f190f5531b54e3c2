"""Python binding of ``tanh_cell.c``: the tanh cell's step ``h' = tanh(W_h h + W_x x + b)`` in one C call, for
:class:`~lightning_ortho.online.TanhRNNCell`'s forward at small sizes outside autograd."""

from __future__ import annotations

import ctypes

import torch

from lightning_ortho._native import load, real_cpu

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long
_SUFFIX = {torch.float32: "float32", torch.float64: "float64"}
#: Multiply-adds ``B H (H + I)`` up to which the C loop beats PyTorch's two GEMMs, add and tanh (each a dispatch of a
#: few microseconds); past it the GEMMs' blocking wins.
MAX_WORK = 1 << 16


def tanh_cell_step(
    weight_hh: torch.Tensor, weight_ih: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, h: torch.Tensor
) -> torch.Tensor | None:
    """``tanh(h W_h^T + x W_x^T + b)`` ``(B, H)`` in one C call, or ``None`` where the kernel does not apply: autograd
    records (grad mode on), another dtype than float32/float64, shapes that do not fit (``x`` ``(B, I)``, ``h``
    ``(B, H)``, ``W_h`` ``(H, H)``, ``W_x`` ``(H, I)``, ``b`` ``(H,)``: PyTorch's ops then raise their own errors),
    a tensor not C-contiguous or of another dtype, more than :data:`MAX_WORK` multiply-adds, CPU autocast, something
    tracing or a tensor that is not a plain CPU tensor (:func:`~lightning_ortho._native.real_cpu`), or the kernels off
    or unavailable (:func:`~lightning_ortho._native.load`). Agrees with the PyTorch expression to rounding (the dot
    products are summed in another order than BLAS's)."""
    dtype = x.dtype
    if dtype not in _SUFFIX or _grad_enabled() or x.dim() != 2 or h.dim() != 2 or bias.dim() != 1:
        return None
    batch, inputs = x.shape
    hidden = bias.shape[0]
    if (
        h.shape[0] != batch
        or h.shape[1] != hidden
        or weight_hh.shape != (hidden, hidden)
        or weight_ih.shape != (hidden, inputs)
        or batch * hidden * (hidden + inputs) > MAX_WORK
        or not (h.dtype is dtype and weight_hh.dtype is dtype and weight_ih.dtype is dtype and bias.dtype is dtype)
        or not (x.is_contiguous() and h.is_contiguous() and weight_hh.is_contiguous() and weight_ih.is_contiguous())
        or not bias.is_contiguous()
        or _autocast("cpu")
        or not real_cpu(x, h, weight_hh, weight_ih, bias)
    ):
        return None
    kernel = _kernel(dtype)
    if kernel is None:
        return None
    h_new = torch.empty_like(h)
    kernel(
        weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr(), x.data_ptr(), h.data_ptr(),
        batch, hidden, inputs, h_new.data_ptr(),
    )  # fmt: skip
    return h_new


_grad_enabled, _autocast = torch.is_grad_enabled, torch.is_autocast_enabled
#: {dtype: (library, its declared C function)}: the function of the library :func:`load` gives now.
_DECLARED: dict[torch.dtype, tuple[ctypes.CDLL, ctypes._CFuncPtr]] = {}


def _kernel(dtype: torch.dtype):
    """The C function for ``dtype`` with its signature declared, or ``None`` (kernels off or unavailable)."""
    library = load("tanh_cell")
    if library is None:
        return None
    declared = _DECLARED.get(dtype)
    if declared is not None and declared[0] is library:
        return declared[1]
    kernel = getattr(library, f"tanh_cell_forward_{_SUFFIX[dtype]}")
    kernel.argtypes = [_POINTER] * 5 + [_LONG] * 3 + [_POINTER]
    kernel.restype = None
    _DECLARED[dtype] = (library, kernel)
    return kernel
