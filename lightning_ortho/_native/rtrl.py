"""Python bindings of ``rtrl.c``, for float32/float64 CPU tensors: RTRL's step on the tanh cell around PyTorch's GEMM
``W_h M``, and its summed estimate ``sum_b grad_h_b^T M_b`` (:class:`lightning_ortho.online.RTRL` computes the same
with PyTorch ops elsewhere)."""

from __future__ import annotations

import ctypes

import torch

from lightning_ortho._native import load, real_cpu

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long
_autocast = torch.is_autocast_enabled
_SUFFIXES = {torch.float32: "float32", torch.float64: "float64"}


def rtrl_tanh_kernels(like: torch.Tensor, *others: torch.Tensor | None):
    """The C function of :func:`tanh_step` for ``like``'s dtype, or ``None`` when ``like`` is not float32/float64,
    when ``like`` or one of ``others`` (every tensor the kernel or the GEMM before it will read: ``x``, ``h``, the
    influence, the cell's parameters) is not a real CPU tensor or something is tracing
    (:func:`lightning_ortho._native.real_cpu`), under CPU autocast (the GEMM ``W_h M`` would come back in
    bfloat16), or when the kernels are unavailable (:func:`lightning_ortho._native.load`). Dtypes, shapes and
    strides are the caller's to check."""
    if _autocast("cpu"):
        return None
    return _kernels(like, others, 0)


def rtrl_gradient_kernel(like: torch.Tensor, *others: torch.Tensor | None):
    """The C function of :func:`summed_estimate` for ``like``'s dtype, or ``None`` (as :func:`rtrl_tanh_kernels`:
    pass the influence and ``grad_h``; autocast does not matter, the kernel reads only them)."""
    return _kernels(like, others, 1)


def _kernels(like: torch.Tensor, others: tuple, which: int):
    """``(step, gradient)[which]`` for ``like``'s dtype, or ``None`` (see :func:`rtrl_tanh_kernels`)."""
    suffix = _SUFFIXES.get(like.dtype)
    if suffix is None or not real_cpu(like, *others):
        return None
    library = load("rtrl")
    if library is None:
        return None
    step, gradient = getattr(library, f"rtrl_tanh_step_{suffix}"), getattr(library, f"rtrl_gradient_{suffix}")
    if step.argtypes is None:  # declared once: ctypes keeps the function objects
        step.argtypes = [_POINTER] * 5 + [_LONG] * 3 + [_POINTER] * 2
        step.restype = ctypes.c_double
        gradient.argtypes = [_POINTER] * 2 + [_LONG] * 3 + [_POINTER]
        gradient.restype = ctypes.c_double
    return gradient if which else step


def tanh_step(
    kernel,
    weight_hh: torch.Tensor,
    weight_ih: torch.Tensor,
    bias: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    influence: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(h' (B, H), M' (B, H, P), the sum of x, h' and M')``: one RTRL step of the cell ``h' = tanh(W_h h + W_x x +
    b)`` from ``x`` ``(B, I)``, ``h`` ``(B, H)`` and the influence ``M`` ``(B, H, P)``::

        M' = diag(d) (W_h M + dz/dtheta),   d = 1 - h'^2

    ``W_h M`` by PyTorch's BLAS into a fresh tensor, the rest in one C pass over it (``M`` is read only). Every
    tensor C-contiguous and of one dtype; the sum is NaN/inf when the step is not finite."""
    batch, hidden = h.shape
    # bmm of W_h broadcast: matmul((H, H), (B, H, P)) of a parameter that requires grad (even under no_grad) takes
    # a path twice as slow at these sizes (measured); a fresh, C-contiguous output either way
    influence_new = torch.bmm(weight_hh.expand(batch, hidden, hidden), influence)
    h_new = torch.empty_like(h)
    total = kernel(
        weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr(), x.data_ptr(), h.data_ptr(),
        batch, hidden, x.shape[1], influence_new.data_ptr(), h_new.data_ptr(),
    )  # fmt: skip
    return h_new, influence_new, total


def summed_estimate(kernel, influence: torch.Tensor, grad_h: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(sum_b grad_h_b^T M_b (P,), the sum of grad_h and of the estimate)`` for the influence ``M`` ``(B, H, P)``
    and ``grad_h`` ``(B, H)``, both C-contiguous and of one dtype; the sum is NaN/inf when either is not finite."""
    batch, hidden, size = influence.shape
    out = influence.new_empty(size)
    total = kernel(influence.data_ptr(), grad_h.data_ptr(), batch, hidden, size, out.data_ptr())
    return out, total
