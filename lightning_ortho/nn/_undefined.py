"""The one place that decides where a reflection ``H(v)`` is undefined, and what the layers do there.

(And how a row is brought to unit scale before it is reflected, so that ``||v||^2`` as computed keeps its range
for a 1e-20 or a 1e19 row: :func:`row_scale`.)

``H(v) = I - 2 v v^T / ||v||^2`` is undefined where ``||v||^2`` is zero, or below the dtype's smallest normal
number (its reciprocal would overflow). There the library takes ``H(0) := I``: the reflection is the identity,
its Jacobian is ``I`` and its log-determinant 0, with finite gradients.

NaN is not "undefined": a NaN squared norm counts as *defined*, so the NaN flows into the result, where the
layers' finiteness checks find it and name the input or parameter that holds it. (A comparison such as
``q > tiny`` is False for NaN and would silently turn a NaN weight into an identity map.)
"""

from __future__ import annotations

import torch


def is_defined(squared_norm: torch.Tensor) -> torch.Tensor:
    """``(...)`` bool: where ``H(v)`` is defined, from ``||v||^2`` of shape ``(...)``; True for NaN (it propagates)."""
    return ~(squared_norm <= torch.finfo(squared_norm.dtype).tiny)


def safe_squared_norm(squared_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, defined)``: ``||v||^2`` with 1 where ``H(v)`` is undefined (safe to divide by), and the mask."""
    defined = is_defined(squared_norm)
    return torch.where(defined, squared_norm, torch.ones_like(squared_norm)), defined


def reflection_scale(numerator: torch.Tensor, squared_norm: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(s, q, defined)``: ``s = numerator / ||v||^2`` (0 where undefined), ``q`` safe to divide by, the mask.

    For an auxiliary reflection ``H(n(x)) x = x - 2 s n(x)`` with ``s = n(x).x / ||n(x)||^2``.
    """
    q, defined = safe_squared_norm(squared_norm)
    return torch.where(defined, numerator / q, torch.zeros_like(q)), q, defined


def reflection_scalars(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, s, defined)`` for rows ``x, n`` of shape ``(..., d)``: ``q = ||n||^2`` (1 where undefined) and
    ``s = n.x / q`` (0 where undefined), each ``(...)``."""
    s, q, defined = reflection_scale(torch.linalg.vecdot(n, x), torch.linalg.vecdot(n, n))
    return q, s, defined


def accurate_range(dtype: torch.dtype) -> tuple[float, float]:
    """``(low, high)``: squared norms in ``[low, high]`` are computed from their entries without underflow or
    overflow in ``dtype`` (``tiny / eps`` and ``max * eps``: about ``1e-31`` and ``4e31`` in float32)."""
    info = torch.finfo(dtype)
    return info.tiny / info.eps, info.max * info.eps


def row_scale(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The power of two ``2^e`` with ``max_i |t_i|`` in ``[2^e, 2^(e+1))`` for each row along ``dim`` (kept, of size
    1), detached; 1 for a zero or non-finite row (a NaN or inf then reaches the finiteness checks unchanged).

    ``t / row_scale(t)`` has entries in ``(-2, 2)``, the largest at least 1 in magnitude, so its squared norm lies
    in ``[1, 4 n)``: in every dtype's accurate range (:func:`accurate_range`), for a 1e-20 row as for a 1e19
    one. Dividing by a power of two only changes exponents: a row whose entries are all normal numbers before and
    after is scaled exactly, so a computation on the scaled row gives bit for bit the result on the row itself
    wherever that one did not underflow or overflow. ``H(v) x`` is homogeneous (degree 0 in ``v``, 1 in ``x``):
    ``H(v) x = s_x H(v / s_v) (x / s_x)``, and with the scales held constant every derivative of the right-hand
    side equals that of the left.
    """
    largest = t.detach().abs().amax(dim, keepdim=True)  # (vector_norm(ord=inf) is many times slower)
    mantissa, _ = torch.frexp(largest)  # largest = mantissa * 2^(e+1) with mantissa in [1/2, 1)
    # Exactly 2^e (finite for every finite row: 2^(e+1) could be 2^128 in float32); 0/0 and inf/inf give NaN.
    return torch.nan_to_num(largest / (2.0 * mantissa), nan=1.0)
