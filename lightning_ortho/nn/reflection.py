"""Householder reflections ``H(v) x = x - 2 v (v.x) / (v.v)`` (section 1.1 of "One Reflection Suffice")."""

from __future__ import annotations

import torch

from lightning_ortho.nn._checks import check_features, check_parameters_finite


def reflect_with_summary(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reflect` without input validation, for internal hot paths.

    Where ``v.v`` is zero (or below the dtype's smallest normal number) ``H(v)`` is undefined; we take
    ``H(0) = I`` so the result is ``x`` and both gradients are finite (the inner ``where`` keeps the unused
    branch free of a division by zero, which would otherwise poison the backward pass with NaN).

    Returns:
        ``(H(v) x, summary)`` where ``summary = v.x + v.v`` has shape ``(..., 1)`` and is finite exactly when
        the inputs were, so callers can check finiteness on ``B`` numbers instead of ``B x d``.
    """
    vx = torch.linalg.vecdot(v, x).unsqueeze(-1)
    vv = torch.linalg.vecdot(v, v).unsqueeze(-1)
    defined = vv > torch.finfo(vv.dtype).tiny
    coefficient = torch.where(defined, 2.0 * vx / torch.where(defined, vv, torch.ones_like(vv)), 0.0)
    return x - coefficient * v, vx + vv


def reflect_unchecked(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``H(v) x`` without validation (see :func:`reflect_with_summary` for the ``v = 0`` convention)."""
    return reflect_with_summary(x, v)[0]


def reflect(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Apply the Householder reflection ``H(v) = I - 2 v v^T / ||v||^2`` to ``x``.

    Args:
        x: ``(..., d)`` vectors, batch-first.
        v: ``(..., d)`` reflection vectors, broadcastable against ``x`` (a single ``(d,)`` vector reflects
            every row the same way; a ``(B, d)`` batch gives each row its own reflection).

    Returns:
        ``(..., d)``: ``H(v) x``, with the broadcast batch shape. ``||H(v) x|| = ||x||``.
        Where ``v = 0`` the reflection is undefined; this function returns ``x`` (``H(0) := I``) with finite
        gradients, never NaN.

    Raises:
        TypeError: non-floating-point input.
        ValueError: trailing dimensions differ, or an input holds NaN/inf.
    """
    check_features(v, v.shape[-1] if isinstance(v, torch.Tensor) and v.dim() else -1, name="v", layer="reflect")
    check_features(x, v.shape[-1], name="x", layer="reflect")
    y, summary = reflect_with_summary(x, v)
    check_parameters_finite(summary.detach(), {"x": x, "v": v}, layer="reflect")
    return y


def householder_matrix(v: torch.Tensor) -> torch.Tensor:
    """Dense ``H(v)`` as a ``(..., d, d)`` matrix, for tests and small problems (``H(0) := I``)."""
    check_features(v, v.shape[-1] if isinstance(v, torch.Tensor) and v.dim() else -1, name="v", layer="householder_matrix")
    eye = torch.eye(v.shape[-1], dtype=v.dtype, device=v.device)
    return reflect_unchecked(eye.expand(*v.shape[:-1], -1, -1), v.unsqueeze(-2)).transpose(-1, -2)
