"""Python bindings of ``reflection_rows.c``: the row passes of the auxiliary reflection around its GEMMs.

``reflect_rows(x, v)`` and ``reflect_rows_backward(g, v, y, c, vv)`` compute what the PyTorch ops in
:mod:`lightning_ortho.nn._fast_reflection` compute (see there for the equations), in one pass each, for float32 or
float64 CPU tensors; :func:`row_kernels` says whether they may run on given tensors.
"""

from __future__ import annotations

import ctypes

import torch

from lightning_ortho._native import load, real_cpu

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long
_autocast = torch.is_autocast_enabled
_SUFFIX = {torch.float32: "float32", torch.float64: "float64"}


def _bind(library: ctypes.CDLL, dtype: torch.dtype) -> tuple:
    forward = getattr(library, f"reflect_rows_{_SUFFIX[dtype]}")
    backward = getattr(library, f"reflect_rows_backward_{_SUFFIX[dtype]}")
    if forward.argtypes is None:  # ctypes keeps the function objects: declare the signatures once
        forward.argtypes = [_POINTER] * 5 + [_LONG, _LONG, _POINTER]
        forward.restype = None
        backward.argtypes = [_POINTER, _LONG, _LONG] + [_POINTER] * 6 + [_LONG, _LONG]
        backward.restype = None
    return forward, backward


def row_kernels(x: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """The ``(forward, backward)`` C functions for ``x``'s dtype, or ``None`` when ``x`` is not float32/float64, when
    ``x`` or one of ``others`` (every tensor the kernels will read, or whose product they will read: the weight,
    the incoming gradient) is not a real CPU tensor or something is tracing (:func:`lightning_ortho._native.real_cpu`),
    under CPU autocast (the caller's product ``v = x W^T`` would come back in bfloat16), or when the kernels are
    unavailable (see :func:`lightning_ortho._native.load`)."""
    if x.dtype not in _SUFFIX or _autocast("cpu") or not real_cpu(x, *others):
        return None
    library = load("reflection_rows")
    return None if library is None else _bind(library, x.dtype)


def reflect_rows(
    kernels: tuple, x: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    """``(y, c, vv, lowest, highest)`` for C-contiguous ``(n, d)`` rows ``x`` and ``v = x W^T``: ``c = v.x / v.v``,
    ``y = x - 2 c v``, ``vv = v.v``; ``lowest``/``highest`` bound ``vv`` over the rows and are NaN where some ``c``
    or ``vv`` is not finite."""
    n, d = x.shape
    y = torch.empty_like(x)
    c = x.new_empty(n)
    vv = x.new_empty(n)
    span = (ctypes.c_double * 2)()
    kernels[0](x.data_ptr(), v.data_ptr(), y.data_ptr(), c.data_ptr(), vv.data_ptr(), n, d, span)
    return y, c, vv, span[0], span[1]


def reflect_rows_backward(
    kernels: tuple, g: torch.Tensor, v: torch.Tensor, y: torch.Tensor, c: torch.Tensor, vv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(u, r)`` with ``t = g.v / vv``, ``u = c g + t y`` and ``r = g - 2 t v`` for ``(n, d)`` rows (``g`` may have
    any strides, e.g. the expanded gradient of ``sum()``; the others C-contiguous)."""
    n, d = v.shape
    u = torch.empty_like(v)
    r = torch.empty_like(v)
    row_stride, column_stride = g.stride()
    kernels[1](
        g.data_ptr(),
        row_stride,
        column_stride,
        v.data_ptr(),
        y.data_ptr(),
        c.data_ptr(),
        vv.data_ptr(),
        u.data_ptr(),
        r.data_ptr(),
        n,
        d,
    )
    return u, r
