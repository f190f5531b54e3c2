"""Python bindings of ``kf_rtrl.c``, for float32/float64 CPU tensors: KF-RTRL's whole step on the tanh cell and its
summed estimate, each one C call (:class:`lightning_ortho.online.KFRTRL` computes the same with PyTorch ops
elsewhere)."""

from __future__ import annotations

import ctypes
import struct

import torch

from lightning_ortho._native import load, real_cpu

__all__ = ["STACK_ROWS", "kf_rtrl_kernels", "step", "summed_estimate"]

_TYPES = {torch.float32: "float32", torch.float64: "float64"}
#: ``kf_rtrl_step_arguments`` and ``kf_rtrl_gradient_arguments`` of ``kf_rtrl.c`` (native sizes and alignment): each
#: call passes its arguments packed in one buffer, one ctypes argument (ctypes converts each argument in Python).
_STEP_ARGUMENTS = struct.Struct("@11P4ld").pack
_GRADIENT_ARGUMENTS = struct.Struct("@7P3l").pack
#: ``KF_RTRL_STACK_ROWS`` of ``kf_rtrl.c``: up to this ``H`` the gradient keeps ``A^T g`` on the C stack, above it
#: :func:`summed_estimate` passes a scratch tensor.
STACK_ROWS = 1024


def kf_rtrl_kernels(like: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """``(step, gradient)`` C functions for ``like``'s dtype, or ``None`` when ``like`` is not float32/float64, when
    ``like`` or one of ``others`` (every tensor the kernels read: the step's inputs, the state, the cell's weights)
    is not a real CPU tensor or something is tracing (:func:`lightning_ortho._native.real_cpu`), or when the kernels
    are unavailable (:func:`lightning_ortho._native.load`). The caller of a :func:`step` that takes its product
    from BLAS declines under CPU autocast (the product would come back in bfloat16)."""
    if not real_cpu(like, *others):
        return None
    library = load("kf_rtrl")
    if library is None:
        return None
    found = _KERNELS.get(like.dtype)
    if found is None or found[0] is not library:  # first call, or a library loaded afresh (load.cache_clear)
        if like.dtype not in _TYPES:
            return None
        found = _KERNELS[like.dtype] = (library, _declare(library, like.dtype))
    return found[1]


#: ``{dtype: (library, (step, gradient))}``: the functions declared for the library last loaded (a lookup per call
#: instead of two name lookups).
_KERNELS: dict[torch.dtype, tuple] = {}


def _declare(library: ctypes.CDLL, dtype: torch.dtype) -> tuple:
    """``(step, gradient)`` of ``dtype``, their C signatures declared: each takes its packed arguments (bytes)."""
    suffix = _TYPES[dtype]
    functions = getattr(library, f"kf_rtrl_tanh_step_{suffix}"), getattr(library, f"kf_rtrl_gradient_{suffix}")
    for function in functions:
        function.argtypes = [ctypes.c_char_p]  # the bytes of the packed arguments, passed without a copy
        function.restype = ctypes.c_double
    return functions


def step(
    kernels: tuple,
    addresses: tuple[int, ...],
    h: torch.Tensor,
    input_factor: torch.Tensor,
    hidden_factor: torch.Tensor,
    bits: torch.Tensor,
    eps: float,
    sizes: tuple[int, int, int],
    weight_hh: torch.Tensor | None = None,
) -> tuple:
    """``(h', u', A', verdict, and the three outputs' data_ptr()s)``: one KF-RTRL step of the tanh cell for ``B``
    streams::

        h' = tanh(W_h h + W_x x + b),  d = 1 - h'^2,  a = [h; x; 1],  J A = diag(d) W_h A
        p1 = sqrt((||J A|| + eps) / (||u|| + eps)),  p2 = sqrt((||d|| + eps) / (||a|| + eps))
        u' = c1 p1 u + c2 p2 a,  A' = (c1 / p1) J A + (c2 / p2) diag(d)

    from ``addresses``, the ``data_ptr()`` of ``weight_hh`` ``(H, H)``, ``weight_ih`` ``(H, I)``, ``bias``
    ``(H,)``, ``x`` ``(B, I)``, ``h`` ``(B, H)``, ``input_factor`` ``u`` ``(B, H + I + 1)`` and ``hidden_factor``
    ``A`` ``(B, H, H)`` (``h`` and the factors given too: the outputs are allocated like them), and ``bits``
    ``(B, 2)`` in ``{0, 1}``, the signs ``(c1, c2) = 2 bits - 1``, with ``sizes = (B, H, I)``; every tensor
    C-contiguous, of one dtype and of these sizes (the caller checks). The outputs are new tensors. ``weight_hh``
    (the tensor at the first address), where given: take ``W_h A`` with ``torch.matmul`` (BLAS, large ``H``; an
    op autograd would record: call it under ``no_grad``) instead of the kernel's loop. The verdict is the sum of
    ``x``, ``h'``, ``u'`` and ``A'`` (NaN/inf when the step is not finite)."""
    if weight_hh is not None:
        hidden_new = torch.matmul(weight_hh, hidden_factor)  # finished in place by the kernel
    else:
        hidden_new = torch.empty_like(hidden_factor)
    h_new, input_new = torch.empty_like(h), torch.empty_like(input_factor)
    outputs = h_new.data_ptr(), input_new.data_ptr(), hidden_new.data_ptr()
    verdict = kernels[0](_STEP_ARGUMENTS(*addresses, bits.data_ptr(), *outputs, *sizes, weight_hh is not None, eps))
    return h_new, input_new, hidden_new, verdict, *outputs


def summed_estimate(
    kernels: tuple,
    hidden_factor: int,
    input_factor: int,
    grad_h: torch.Tensor,
    sizes: tuple[int, int, int],
    names: tuple[str, str, str] = ("weight_hh", "weight_ih", "bias"),
) -> tuple[dict[str, torch.Tensor], float]:
    """``({names[0]: W_h (H, H), names[1]: W_x (H, I), names[2]: b (H,)}, verdict)``: the estimate
    ``sum_b (A_b^T g_b) u_b^T`` ``(H, H + I + 1)`` by parameter (its columns ``[W_h | W_x | b]``, each written into a
    new tensor of its own), from the ``data_ptr()`` of ``hidden_factor`` ``A`` ``(B, H, H)`` and ``input_factor``
    ``u`` ``(B, H + I + 1)``, and ``grad_h`` ``g`` ``(B, H)``, with ``sizes = (B, H, I)``, all C-contiguous, of one
    dtype and of these sizes (the caller checks); the verdict is the sum of ``grad_h`` and of the estimate (NaN/inf
    when either is not finite)."""
    batch, hidden, inputs = sizes
    # One allocation per parameter: cheaper than views of one (P,) tensor.
    out_hh, out_ih, out_b = grad_h.new_empty(hidden, hidden), grad_h.new_empty(hidden, inputs), grad_h.new_empty(hidden)
    scratch = grad_h.new_empty(hidden) if hidden > STACK_ROWS else None  # (alive until the call returns)
    verdict = kernels[1](
        _GRADIENT_ARGUMENTS(
            hidden_factor, input_factor, grad_h.data_ptr(), 0 if scratch is None else scratch.data_ptr(),
            out_hh.data_ptr(), out_ih.data_ptr(), out_b.data_ptr(), batch, hidden, inputs,
        )
    )  # fmt: skip
    return {names[0]: out_hh, names[1]: out_ih, names[2]: out_b}, verdict
