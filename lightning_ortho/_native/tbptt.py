"""Python bindings of ``tbptt.c``, for float32/float64 CPU tensors: :class:`~lightning_ortho.online.TruncatedBPTT`'s
step and summed gradient on :class:`~lightning_ortho.online.TanhRNNCell`, each one C call (the estimator computes
the same with PyTorch ops elsewhere)."""

from __future__ import annotations

import ctypes

import torch

from lightning_ortho._native import load, real_cpu

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
_autocast = torch.is_autocast_enabled
_SUFFIXES = {torch.float32: "float32", torch.float64: "float64"}
#: Values of the gradient's scratch that ``tbptt.c`` keeps on its stack (its ``SMALL_SCRATCH``).
SMALL_SCRATCH = 4096


def tbptt_tanh_kernels(like: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """``(step, gradient)`` C functions for ``like``'s dtype, or ``None`` when ``like`` is not float32/float64, when
    ``like`` or one of ``others`` (every tensor the kernels will read or write) is not a real CPU tensor or something
    is tracing (:func:`lightning_ortho._native.real_cpu`), under CPU autocast (where the PyTorch path's cell would
    compute in bfloat16), or when the kernels are unavailable (:func:`lightning_ortho._native.load`). Dtypes, shapes
    and strides are the caller's to check."""
    suffix = _SUFFIXES.get(like.dtype)
    if suffix is None or _autocast("cpu") or not real_cpu(like, *others):
        return None
    library = load("tbptt")
    if library is None:
        return None
    step, gradient = getattr(library, f"tbptt_tanh_step_{suffix}"), getattr(library, f"tbptt_tanh_gradient_{suffix}")
    if step.argtypes is None:  # declared once: ctypes keeps the function objects
        step.argtypes = [_POINTER] * 9 + [_LONG] * 6 + [_INT] + [_POINTER] * 5
        step.restype = ctypes.c_double
        gradient.argtypes = [_POINTER] * 9 + [_LONG] * 4 + [_INT] + [_POINTER] * 3
        gradient.restype = ctypes.c_double
    return step, gradient


def step(operands: tuple, x: torch.Tensor, h: torch.Tensor, k: int, snapshot: torch.Tensor) -> tuple:
    """``(h_new (B, H), inputs (B, m, I), starts (B, m, H), cut (B, m), verdict)``: the cell's step
    ``h_new = tanh(W_h h + W_x x + b)`` and the window advanced by one step and cut to its last ``m = min(n + 1, k)``
    steps (``x``, ``h`` and ``cut_next`` appended); ``verdict`` is the sum of ``x``, ``h_new`` and the new
    ``inputs`` and ``starts`` as a float (NaN/inf when one of them is not finite).

    ``operands`` is ``(kernels, W_h (H, H), W_x (H, I), b (H,), inputs (B, n, I), starts (B, n, H), cut (B, n),
    cut_next (B,), continuing)`` (:func:`tbptt_tanh_kernels`, then the cell's parameters and the window); every
    tensor C-contiguous, the floating ones of one dtype, ``cut`` and ``cut_next`` bool. ``snapshot`` ``(P + 1,)``
    (of that dtype) is updated in place: the parameters of the last steps taken with exactly these parameters and
    their count (see ``tbptt.c``), counted on when ``continuing`` (the window and ``h`` are what the last step
    returned, and the snapshot is the one it updated)."""
    kernels, w_hh, w_ih, bias, inputs, starts, cut, cut_next, continuing = operands
    batch, hidden = h.shape
    n_inputs, held = x.shape[1], starts.shape[1]
    keep = held if held < k else k - 1
    h_new = torch.empty_like(h)
    new_inputs = x.new_empty(batch, keep + 1, n_inputs)
    new_starts = h.new_empty(batch, keep + 1, hidden)
    new_cut = cut.new_empty(batch, keep + 1)
    verdict = kernels[0](
        w_hh.data_ptr(), w_ih.data_ptr(), bias.data_ptr(), x.data_ptr(), h.data_ptr(), inputs.data_ptr(),
        starts.data_ptr(), cut.data_ptr(), cut_next.data_ptr(), batch, hidden, n_inputs, held, keep, k,
        continuing, snapshot.data_ptr(), h_new.data_ptr(), new_inputs.data_ptr(), new_starts.data_ptr(),
        new_cut.data_ptr(),
    )  # fmt: skip
    return h_new, new_inputs, new_starts, new_cut, verdict


def summed_gradient(
    operands: tuple, h: torch.Tensor, grad_h: torch.Tensor, snapshot: torch.Tensor | None
) -> tuple[torch.Tensor, float]:
    """``(estimate (P,), verdict)``: the gradient of ``sum_b grad_h_b . h_b`` through the window replayed with the
    cell's parameters (or, where ``snapshot`` shows that the window's steps were all taken with them, through the
    states it holds: see ``tbptt.c``), laid out as ``[vec(W_h), vec(W_x), b]``, and the sum of ``grad_h`` and of the
    estimate as a float (NaN/inf when one of them is not finite). ``operands`` as for :func:`step`; ``h`` and
    ``grad_h`` ``(B, H)`` C-contiguous, of the parameters' dtype; ``snapshot`` is read only when ``continuing``
    (then it is the one the step that made the window updated)."""
    kernels, w_hh, w_ih, bias, inputs, starts, cut, cut_next, continuing = operands
    batch, hidden = grad_h.shape
    n_inputs, held = w_ih.shape[1], starts.shape[1]
    out = grad_h.new_empty(hidden * (hidden + n_inputs + 1))
    # the replayed states (n, B, H), dz (n, H), a replayed step's operands (B, H + I), delta (H,): see tbptt.c, which
    # keeps up to SMALL_SCRATCH of them on its stack
    need = held * hidden * (batch + 1) + batch * (hidden + n_inputs) + hidden
    scratch = grad_h.new_empty(need) if need > SMALL_SCRATCH else None
    verdict = kernels[1](
        w_hh.data_ptr(), w_ih.data_ptr(), bias.data_ptr(), inputs.data_ptr(), starts.data_ptr(), cut.data_ptr(),
        cut_next.data_ptr(), h.data_ptr(), grad_h.data_ptr(), batch, hidden, n_inputs, held, continuing,
        snapshot.data_ptr() if continuing else None, None if scratch is None else scratch.data_ptr(),
        out.data_ptr(),
    )  # fmt: skip
    return out, verdict
