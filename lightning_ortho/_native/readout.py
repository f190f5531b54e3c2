"""Python binding of ``readout.c``: one online step of a linear readout, its loss and its gradients, for float32 and
float64 CPU tensors (:func:`lightning_ortho.models.online.readout_step.readout_step` computes the same with PyTorch
ops elsewhere)."""

from __future__ import annotations

import ctypes
import math

import torch

from lightning_ortho._native import load, real_cpu

__all__ = ["LARGEST_PRODUCT", "linear_readout", "linear_readout_kernel"]

_POINTER, _LONG, _INT, _DOUBLE = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_double
_SUFFIXES = {torch.float32: "float32", torch.float64: "float64"}
#: Streams x outputs x hidden units up to which the kernel runs: its loops are plain SIMD, so past this size the
#: BLAS products of the PyTorch path overtake the launches they cost.
LARGEST_PRODUCT = 1 << 18


def linear_readout_kernel(like: torch.Tensor, *others: torch.Tensor | None):
    """The C function for ``like``'s dtype, or ``None``: ``like`` not float32/float64, ``like`` or one of ``others``
    (pass every tensor the kernel reads: ``h``, ``weight``, ``bias``, ``y``, ``mask``; ``None`` entries are skipped)
    not a real CPU tensor or something tracing (:func:`lightning_ortho._native.real_cpu`), or the kernels
    unavailable (:func:`lightning_ortho._native.load`)."""
    if like.dtype not in _SUFFIXES or not real_cpu(like, *others):
        return None
    library = load("readout")
    if library is None:
        return None
    function = getattr(library, f"readout_linear_{_SUFFIXES[like.dtype]}")
    if function.argtypes is None:  # declared once: ctypes keeps the function object
        function.argtypes = (
            [_POINTER, _LONG, _LONG, _POINTER, _LONG, _POINTER, _POINTER, _POINTER, _LONG, _LONG, _POINTER, _LONG]
            + [_INT, _LONG, _DOUBLE]
            + [_POINTER] * 5
        )
        function.restype = _DOUBLE
    return function


def linear_readout(
    kernel,
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    mask: torch.Tensor | None,
    cross_entropy: bool,
    ignore_index: int,
    streams: float,
    *,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(loss sum, grad_h (b, H), grad of weight (O, H) or None, grad of bias (O,) or None)`` of ``o = h W^T + c``;
    the loss sum a float64 0-d tensor, or ``None`` when it is not finite or a scored class is out of range. An
    empty problem (no streams, no hidden units or no outputs) is declined without a call: ``(None, None, None,
    None)``, and the caller's PyTorch ops give their answer (or say what is wrong).

    ``h`` ``(b, H)``, ``weight`` ``(O, H)`` and ``bias`` ``(O,)`` C-contiguous, of one dtype (read, never written:
    parameters that require grad are fine); ``y`` ``(b,)`` int64 class indices or ``(b, O)`` targets of that dtype,
    and ``mask`` ``(b,)`` bool or ``None``, with any strides (a step of a chunk). The caller checks dtypes,
    devices and the mse/int64 combination."""
    batch, hidden = h.shape
    outputs = weight.shape[0]
    if batch == 0 or hidden == 0 or outputs == 0:  # empty tensors may have no memory (a null data_ptr)
        return None, None, None, None
    grad_h = torch.empty_like(h)
    grad_weight = torch.empty_like(weight) if weight_grad else None
    # new_empty: on h's device (the CPU) whatever the default device (torch.set_default_device, a torch.device block)
    grad_bias = h.new_empty(outputs) if bias_grad and bias is not None else None
    scratch = h.new_empty(outputs)
    loss = h.new_empty((), dtype=torch.float64)
    index = y.dtype == torch.int64
    row_stride, column_stride = (y.stride(0), 0) if index else y.stride()
    total = kernel(
        h.data_ptr(), batch, hidden, weight.data_ptr(), outputs, None if bias is None else bias.data_ptr(),
        None if index else y.data_ptr(), y.data_ptr() if index else None, row_stride, column_stride,
        None if mask is None else mask.data_ptr(), 0 if mask is None else mask.stride(0),
        int(cross_entropy), ignore_index, float(streams),
        scratch.data_ptr(), grad_h.data_ptr(),
        None if grad_weight is None else grad_weight.data_ptr(), None if grad_bias is None else grad_bias.data_ptr(),
        loss.data_ptr(),
    )  # fmt: skip
    return (loss if math.isfinite(total) else None), grad_h, grad_weight, grad_bias
