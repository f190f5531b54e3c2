"""The one place that decides where a reflection ``H(v)`` is undefined, and what the layers do there.

(And where ``||v||^2`` as computed has lost its range, so that a layer must rescale before it reflects:
:func:`badly_scaled`.)

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


def badly_scaled(k: torch.Tensor) -> torch.Tensor:
    """``(...)`` bool from ``k = 2 / ||v||^2`` (0 where ``H(v)`` was taken as undefined): rows whose squared norm
    fell outside :func:`accurate_range`, including an underflowed 0 and an overflowed inf.

    ``H(v) x`` is homogeneous (of degree 0 in ``v`` and 1 in ``x``), so such rows can be recomputed exactly from
    rescaled vectors; a true zero ``v`` stays ``H(0) = I``. NaN rows are not flagged (they reach the NaN check).
    """
    low, high = accurate_range(k.dtype)
    return (k > 2.0 / low) | (k < 2.0 / high)


def squared_norm_badly_scaled(squared_norm: torch.Tensor) -> torch.Tensor:
    """:func:`badly_scaled` from the squared norm itself (False for NaN)."""
    low, high = accurate_range(squared_norm.dtype)
    return (squared_norm < low) | (squared_norm > high)


def row_scale(t: torch.Tensor) -> torch.Tensor:
    """``(..., 1)``: the largest ``|t_i|`` of each row (1 for a zero row), detached: ``t / row_scale(t)`` has entries
    in ``[-1, 1]`` and a well-scaled norm."""
    scale = t.detach().abs().amax(-1, keepdim=True)
    return torch.where(scale > 0, scale, torch.ones_like(scale))
