"""Householder reflections ``H(v) x = x - 2 v (v.x) / (v.v)`` (section 1.1 of "One Reflection Suffice")."""

from __future__ import annotations

import torch

from lightning_ortho.nn._checks import check_features, check_parameters_finite


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(...)``: ``a.b`` along the last dimension of two ``(..., d)`` tensors of the same shape.

    A batched ``(1, d) x (d, 1)`` product: several times faster on CPU than ``(a * b).sum(-1)``, which
    materialises the product.
    """
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def _row_axpy(x: torch.Tensor, scale: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``(..., d)``: ``x + scale * v`` with a per-row ``(...)`` scale, as one fused ``baddbmm`` pass.

    (A broadcast ``x + scale[..., None] * v`` takes two passes and is slower than ``baddbmm`` on CPU.)
    """
    d = x.shape[-1]
    out = torch.baddbmm(x.reshape(-1, 1, d), scale.reshape(-1, 1, 1), v.reshape(-1, 1, d))
    return out.reshape(x.shape)


def _coefficients(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(c, k, summary)`` of ``H(v) x = x - c v``: ``c = 2 v.x / v.v``, ``k = 2 / v.v``, ``summary = v.x + v.v``.

    Where ``v.v`` is zero (or below the dtype's smallest normal number) ``H(v)`` is undefined; we take
    ``H(0) = I``: ``k = 2 / inf = 0`` and ``c = 0``. Dividing by ``inf`` instead of masking the quotient keeps
    gradients finite too (``d(2/w)/dw = -2/w^2 = 0`` at ``w = inf``), with a single ``where``.
    """
    vx = _rowdot(v, x)
    vv = _rowdot(v, v)
    k = 2.0 / torch.where(vv > torch.finfo(vv.dtype).tiny, vv, torch.inf)
    return k * vx, k, vx + vv


class _Reflection(torch.autograd.Function):
    """``y = x - c v`` with hand-written first derivatives (forward and reverse mode).

    Autograd's own graph for this expression spends more time in elementwise passes than the matmul that
    computes ``v = W x`` for large batches; here the forward pass is one fused ``addcmul`` after two
    reductions and the backward pass is three. With ``g = dL/dy``, ``k = 2 / v.v``:

        dL/dx = g - k (g.v) v,        dL/dv = -c g - k (g.v) y.

    When a graph of the backward pass itself is requested (``create_graph=True``), the coefficients are
    recomputed from the saved inputs so second derivatives are exact.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, v):  # noqa: D102
        c, k, summary = _coefficients(x, v)
        return _row_axpy(x, -c, v), c, k, summary

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: D102
        x, v = inputs
        y, c, k, summary = output
        ctx.mark_non_differentiable(c, k, summary)
        ctx.save_for_backward(x, v, y, c, k)
        ctx.save_for_forward(x, v, c, k)

    @staticmethod
    def backward(ctx, grad_y, _grad_c, _grad_k, _grad_summary):  # noqa: D102
        x, v, y, c, k = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: keep the coefficients in the graph
            c, k, _ = _coefficients(x, v)
            y = x - c.unsqueeze(-1) * v
        grad_y = grad_y.contiguous()
        kgv = k * _rowdot(grad_y, v)
        grad_x = _row_axpy(grad_y, -kgv, v) if ctx.needs_input_grad[0] else None
        grad_v = None
        if ctx.needs_input_grad[1]:
            d = grad_y.shape[-1]
            scaled = torch.bmm(-c.reshape(-1, 1, 1), grad_y.reshape(-1, 1, d)).reshape(grad_y.shape)  # -c g, one pass
            grad_v = _row_axpy(scaled, -kgv, y)
        return grad_x, grad_v

    @staticmethod
    def jvp(ctx, x_t, v_t):  # noqa: D102
        x, v, c, k = ctx.saved_tensors
        # dc = k (dv.x + v.dx) - c k (v.dv); zero where H(v) is undefined because k = c = 0 there.
        dc = k * (_rowdot(v_t, x) + _rowdot(v, x_t)) - c * k * _rowdot(v, v_t)
        y_t = x_t - dc.unsqueeze(-1) * v - c.unsqueeze(-1) * v_t
        return y_t, None, None, None


#: Below this many elements the reflection is left to autograd: a custom Function costs ~50 us per call
#: in dispatch, more than its fused kernels save on small tensors (an RNN step, a small layer).
FUSED_MIN_NUMEL = 1 << 16


def reflect_with_summary(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reflect` without input validation, for internal hot paths.

    Both paths compute the same expression; large inputs use :class:`_Reflection` (fused, hand-written
    derivatives), small ones plain autograd.

    Returns:
        ``(H(v) x, summary)`` where ``summary = v.x + v.v`` has shape ``(...)`` and is finite exactly when
        the inputs were, so callers can check finiteness on ``B`` numbers instead of ``B x d``.
    """
    if x.shape != v.shape:  # broadcast explicitly; autograd sums the gradient of the expanded view
        shape = torch.broadcast_shapes(x.shape, v.shape)
        x, v = x.expand(shape), v.expand(shape)
    if x.numel() < FUSED_MIN_NUMEL:
        c, _, summary = _coefficients(x, v)
        return x - c.unsqueeze(-1) * v, summary
    y, _, _, summary = _Reflection.apply(x, v)
    return y, summary


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
    check_parameters_finite(summary.detach(), lambda: {"x": x, "v": v}, layer="reflect")
    return y


def householder_matrix(v: torch.Tensor) -> torch.Tensor:
    """Dense ``H(v)`` as a ``(..., d, d)`` matrix, for tests and small problems (``H(0) := I``)."""
    check_features(v, v.shape[-1] if isinstance(v, torch.Tensor) and v.dim() else -1, name="v", layer="householder_matrix")
    eye = torch.eye(v.shape[-1], dtype=v.dtype, device=v.device)
    return reflect_unchecked(eye.expand(*v.shape[:-1], -1, -1), v.unsqueeze(-2)).transpose(-1, -2)
