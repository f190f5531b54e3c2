"""Python bindings of ``lru.c``: one step of the linear recurrent unit with all its exact RTRL traces, and their
summed estimate, each in one C call, for float32/float64 parameters (complex64/complex128 states) on the CPU
(:class:`lightning_ortho.online.lru.LRUTraces` computes the same with PyTorch ops elsewhere).

:func:`fused_step` and :func:`fused_gradient` check what they are given and answer ``None`` (the caller then runs
its PyTorch ops) unless every tensor the kernel touches is C-contiguous, of the one real dtype or its complex
counterpart, of the shapes the kernel assumes, without the lazy conjugation bit (whose memory holds ``conj(z)``),
and a real CPU tensor outside any tracing (:func:`lightning_ortho._native.real_cpu`), and the library loads
(:func:`lightning_ortho._native.load`). The kernel reads the tensors it is given and nothing PyTorch computed for it,
so CPU autocast does not matter.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from lightning_ortho._native import load, real_cpu

__all__ = ["fused_gradient", "fused_step", "lru_kernels"]

#: The kernels take their arguments as one array of 64-bit integers (addresses, then sizes; see ``lru.c``): ctypes
#: converts each argument of a call in Python (about 0.3 us apiece), a filled array costs a tenth of that.
_STEP_ARGS, _GRADIENT_ARGS = ctypes.c_int64 * 15, ctypes.c_int64 * 8
_DOUBLE = ctypes.c_double
#: The real dtype of the parameters -> (the kernels' name suffix, the complex dtype of the state and traces).
_TYPES = {torch.float32: ("float32", torch.complex64), torch.float64: ("float64", torch.complex128)}
#: The complex dtype of the state -> the real dtype of the parameters.
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
#: dtype -> (the library, its declared (step, gradient)): the functions of the library that load returns now.
_DECLARED: dict[torch.dtype, tuple] = {}
#: Per thread, the argument arrays: another thread could refill a shared array between this thread's filling it and
#: the kernel's reading it.
_ARGUMENTS = threading.local()
#: An empty CPU tensor of each real dtype, whose ``new_empty`` makes the estimate (on the CPU whatever the default
#: device; the cheapest allocation of a tensor of another dtype than the operands' at hand).
_EXEMPLARS = {dtype: torch.empty(0, dtype=dtype, device="cpu") for dtype in _TYPES}


def lru_kernels(like: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """``(step, gradient)``, the C functions for ``like``'s dtype (float32 or float64 parameters and inputs,
    complex64 or complex128 states: either kind of ``like`` names the pair), or ``None`` when ``like`` is of another
    dtype, when ``like`` or one of ``others`` (pass every tensor the kernel will touch) is not a real CPU tensor or
    something is tracing (:func:`lightning_ortho._native.real_cpu`, asked first: under ``torch.compile`` nothing
    else is read), or when the kernels are unavailable or turned off (:func:`lightning_ortho._native.load`).
    Dtypes of ``others``, shapes, strides and conjugation bits are the caller's to check."""
    if not real_cpu(like, *others):
        return None
    dtype = _REAL.get(like.dtype, like.dtype)
    if dtype not in _TYPES:
        return None
    library = load("lru")
    if library is None:
        return None
    known = _DECLARED.get(dtype)
    if known is not None and known[0] is library:
        return known[1]
    suffix = _TYPES[dtype][0]
    step, gradient = getattr(library, f"lru_step_{suffix}"), getattr(library, f"lru_gradient_{suffix}")
    step.argtypes, gradient.argtypes = [_STEP_ARGS], [_GRADIENT_ARGS]
    step.restype = gradient.restype = _DOUBLE
    _DECLARED[dtype] = (library, (step, gradient))
    return step, gradient


def _arguments() -> tuple[ctypes.Array, ctypes.Array]:
    """This thread's argument arrays ``(step, gradient)``."""
    arrays = getattr(_ARGUMENTS, "arrays", None)
    if arrays is None:
        arrays = _ARGUMENTS.arrays = (_STEP_ARGS(), _GRADIENT_ARGS())
    return arrays


def fused_step(
    x: torch.Tensor,
    h: torch.Tensor,
    e_units: torch.Tensor,
    e_b: torch.Tensor,
    nu_log: torch.Tensor,
    theta_log: torch.Tensor,
    gamma_log: torch.Tensor,
    b_re: torch.Tensor,
    b_im: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None:
    """One step of the linear recurrent unit and its traces, or ``None`` where the kernel declines (see the module
    docstring): ``(h', e_units', e_B', verdict)``, new tensors, with ``lambda = exp(-exp(nu_log) + i
    exp(theta_log))``, ``gamma = exp(gamma_log)``, ``u = (B_re + i B_im) x``::

        h' = lambda h + gamma u,   e_units' = lambda e_units + [-mu lambda h, i phi lambda h, gamma u],
        e_B' = lambda e_B + gamma x^T

    Shapes: ``x`` ``(B, I)`` real, ``h`` ``(B, H)``, ``e_units`` ``(B, 3, H)``, ``e_b`` ``(B, H, I)`` complex,
    ``nu_log``, ``theta_log``, ``gamma_log`` ``(H,)``, ``b_re``, ``b_im`` ``(H, I)`` real. ``verdict`` is the sum
    of ``x`` and of the real views of the three outputs (in double): NaN/inf when one of them holds NaN/inf (or,
    rarely, when finite entries sum past the range). Raises nothing."""
    kernels = lru_kernels(x, h, e_units, e_b, nu_log, theta_log, gamma_log, b_re, b_im)
    if kernels is None:
        return None
    dtype = x.dtype
    state_dtype = _TYPES[dtype][1] if dtype in _TYPES else None  # x complex: declined by the dtype checks below
    if (
        h.dtype is not state_dtype
        or e_units.dtype is not state_dtype
        or e_b.dtype is not state_dtype
        or nu_log.dtype is not dtype
        or theta_log.dtype is not dtype
        or gamma_log.dtype is not dtype
        or b_re.dtype is not dtype
        or b_im.dtype is not dtype
        or x.dim() != 2
        or h.dim() != 2
    ):
        return None
    batch, inputs = x.shape
    hidden = h.shape[1]
    units, weights = (hidden,), (hidden, inputs)
    if (
        not (batch and hidden and inputs)  # empty tensors may have no memory (a null data_ptr)
        or h.shape[0] != batch
        or e_units.shape != (batch, 3, hidden)
        or e_b.shape != (batch, hidden, inputs)
        or nu_log.shape != units
        or theta_log.shape != units
        or gamma_log.shape != units
        or b_re.shape != weights
        or b_im.shape != weights
        or h.is_conj()
        or e_units.is_conj()
        or e_b.is_conj()
        or not (
            x.is_contiguous()
            and h.is_contiguous()
            and e_units.is_contiguous()
            and e_b.is_contiguous()
            and nu_log.is_contiguous()
            and theta_log.is_contiguous()
            and gamma_log.is_contiguous()
            and b_re.is_contiguous()
            and b_im.is_contiguous()
        )
    ):
        return None
    # empty_like: contiguous as its input, on its device (the CPU) whatever the default device
    h_new, e_units_new, e_b_new = torch.empty_like(h), torch.empty_like(e_units), torch.empty_like(e_b)
    arguments = _arguments()[0]
    arguments[:] = (
        nu_log.data_ptr(), theta_log.data_ptr(), gamma_log.data_ptr(), b_re.data_ptr(), b_im.data_ptr(),
        x.data_ptr(), h.data_ptr(), e_units.data_ptr(), e_b.data_ptr(),
        h_new.data_ptr(), e_units_new.data_ptr(), e_b_new.data_ptr(), batch, hidden, inputs,
    )  # fmt: skip
    return h_new, e_units_new, e_b_new, kernels[0](arguments)


def fused_gradient(
    grad_h: torch.Tensor, e_units: torch.Tensor, e_b: torch.Tensor, size: int
) -> tuple[torch.Tensor, float] | None:
    """The estimate summed over the streams, ``(flat (size,), verdict)``, or ``None`` where the kernel declines (see
    the module docstring). ``flat`` holds ``Re(conj(g) e)`` for ``nu_log``, ``theta_log``, ``gamma_log`` ``(H,)``
    and ``B_re`` ``(H, I)``, ``-Im(conj(g) e_B)`` for ``B_im`` ``(H, I)`` (each row-major, in that order), then zeros
    up to ``size`` (the readout's ``C_re``, ``C_im``, ``D``, outside the recurrence). Shapes: ``grad_h`` ``(B, H)``,
    ``e_units`` ``(B, 3, H)``, ``e_b`` ``(B, H, I)`` complex; ``size >= 3 H + 2 H I``. ``verdict`` is the sum of
    the real view of ``grad_h`` and of ``flat`` (in double), NaN/inf when one of them holds NaN/inf. Raises
    nothing."""
    kernels = lru_kernels(grad_h, e_units, e_b)
    if kernels is None or grad_h.dim() != 2 or e_b.dim() != 3:
        return None
    batch, hidden, inputs = e_b.shape
    dtype = _REAL.get(grad_h.dtype)
    if (
        dtype is None
        or not (batch and hidden and inputs)  # empty tensors may have no memory (a null data_ptr)
        or e_units.dtype is not grad_h.dtype
        or e_b.dtype is not grad_h.dtype
        or grad_h.shape != (batch, hidden)
        or e_units.shape != (batch, 3, hidden)
        or size < hidden * (3 + 2 * inputs)
        or grad_h.is_conj()
        or e_units.is_conj()
        or e_b.is_conj()
        or not (grad_h.is_contiguous() and e_units.is_contiguous() and e_b.is_contiguous())
    ):
        return None
    flat = _EXEMPLARS[dtype].new_empty(size)
    arguments = _arguments()[1]
    arguments[:] = (
        grad_h.data_ptr(), e_units.data_ptr(), e_b.data_ptr(), flat.data_ptr(), batch, hidden, inputs, size
    )  # fmt: skip
    return flat, kernels[1](arguments)
