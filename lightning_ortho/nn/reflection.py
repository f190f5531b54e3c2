"""Householder reflections ``H(v) x = x - 2 v (v.x) / (v.v)`` (section 1.1 of "One Reflection Suffice")."""

from __future__ import annotations

import torch

from lightning_ortho.nn._checks import check_features, check_parameters_finite
from lightning_ortho.nn._undefined import is_defined, row_scale


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(...)``: ``a.b`` along the last dimension of two ``(..., d)`` tensors of the same shape.

    For large inputs a batched ``(1, d) x (d, 1)`` product, which does not materialise ``a * b`` (the memory
    traffic it saves outweighs its fixed cost there); for small ones ``vecdot``, which has less per-row overhead.
    """
    if a.numel() >= 1 << 22:
        return (a.unsqueeze(-2) @ b.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    return torch.linalg.vecdot(a, b)


def _row_axpy(x: torch.Tensor, scale: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``(..., d)``: ``x + scale * v`` with a per-row ``(...)`` scale, in one fused pass."""
    return torch.addcmul(x, scale.unsqueeze(-1), v)


def _coefficients(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(c, k, summary)`` of ``H(v) x = x - c v``: ``c = 2 v.x / v.v``, ``k = 2 / v.v``, ``summary = c + v.v``.

    Where ``H(v)`` is undefined (:mod:`~lightning_ortho.nn._undefined`) we take ``H(0) = I``: ``k = 2 / inf = 0``
    and ``c = 0``. Dividing by ``inf`` instead of masking the quotient keeps gradients finite too
    (``d(2/w)/dw = -2/w^2 = 0`` at ``w = inf``), with a single ``where``. A NaN ``v`` gives NaN, never identity.
    """
    vx = _rowdot(v, x)
    vv = _rowdot(v, v)
    k = 2.0 / torch.where(is_defined(vv), vv, torch.inf)
    c = k * vx
    # c, not v.x: a finite v.x over a tiny (but in-range) v.v can still overflow c, and then y.
    return c, k, c + vv


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
        kgv = k * _rowdot(grad_y, v)
        grad_x = _row_axpy(grad_y, -kgv, v) if ctx.needs_input_grad[0] else None
        grad_v = None
        if ctx.needs_input_grad[1]:
            grad_v = _row_axpy(grad_y * (-c.unsqueeze(-1)), -kgv, y)
        return grad_x, grad_v

    @staticmethod
    def jvp(ctx, x_t, v_t):  # noqa: D102
        x, v, c, k = ctx.saved_tensors
        # dc = k (dv.x + v.dx) - c k (v.dv); zero where H(v) is undefined because k = c = 0 there.
        dc = k * (_rowdot(v_t, x) + _rowdot(v, x_t)) - c * k * _rowdot(v, v_t)
        y_t = x_t - dc.unsqueeze(-1) * v - c.unsqueeze(-1) * v_t
        return y_t, None, None, None


class _LinearReflection(torch.autograd.Function):
    """``y = H(W x) x`` as one Function: the auxiliary reflection with ``n(x) = W x``, fused.

    Same derivatives as :class:`_Reflection` with ``v = W x`` chained in by hand, so that the input gradient
    ``g - k (g.v) v + (dL/dv) W`` is accumulated inside the GEMM (``addmm``) instead of in a separate pass:

        dL/dv = -c g - k (g.v) y,   dL/dW = (dL/dv)^T x,   dL/dx = g - k (g.v) v + (dL/dv) W.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight):  # noqa: D102
        v = x @ weight.mT
        c, k, summary = _coefficients(x, v)
        return _row_axpy(x, -c, v), v, c, k, summary

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: D102
        x, weight = inputs
        y, v, c, k, summary = output
        ctx.mark_non_differentiable(v, c, k, summary)
        ctx.save_for_backward(x, weight, v, y, c, k)
        ctx.save_for_forward(x, weight, v, c, k)

    @staticmethod
    def backward(ctx, grad_y, _grad_v, _grad_c, _grad_k, _grad_summary):  # noqa: D102
        x, weight, v, y, c, k = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: keep every intermediate in the graph
            v = x @ weight.mT
            c, k, _ = _coefficients(x, v)
            y = x - c.unsqueeze(-1) * v
        d = x.shape[-1]
        kgv = k * _rowdot(grad_y, v)
        grad_v = _row_axpy(grad_y * (-c.unsqueeze(-1)), -kgv, y).reshape(-1, d)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            direct = _row_axpy(grad_y, -kgv, v).reshape(-1, d)
            grad_x = torch.addmm(direct, grad_v, weight).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_v.mT @ x.reshape(-1, d)
        return grad_x, grad_weight

    @staticmethod
    def jvp(ctx, x_t, weight_t):  # noqa: D102
        x, weight, v, c, k = ctx.saved_tensors
        v_t = torch.zeros_like(v)
        if x_t is not None:
            v_t = v_t + x_t @ weight.mT
        if weight_t is not None:
            v_t = v_t + x @ weight_t.mT
        x_t = torch.zeros_like(x) if x_t is None else x_t
        dc = k * (_rowdot(v_t, x) + _rowdot(v, x_t)) - c * k * _rowdot(v, v_t)
        y_t = x_t - dc.unsqueeze(-1) * v - c.unsqueeze(-1) * v_t
        return y_t, None, None, None, None


#: Below this many elements the careful path leaves the reflection to autograd (plain ops, no custom Function).
#: ``AuxiliaryReflection`` reaches this path only for batches its fused path cannot take
#: (:mod:`~lightning_ortho.nn._fast_reflection`): zero or badly scaled rows, NaN/inf, ``torch.func``.
FUSED_MIN_NUMEL = 1 << 16


def reflect_with_summary(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reflect` without input validation, for internal hot paths.

    Every row is reflected at unit scale, ``H(v) x = s_x H(v / s_v) (x / s_x)`` with the power-of-two row scales
    of :func:`~lightning_ortho.nn._undefined.row_scale` (exact, detached): a 1e-20 or 1e19 row is reflected like a
    unit one instead of being taken as ``v = 0`` or overflowing, its gradients are those of the unit row, and no
    row has a discarded computation whose derivative could be ``inf * 0``. No host synchronisation. Large inputs
    use :class:`_Reflection` (fused, hand-written derivatives), small ones plain autograd; both compute the same
    expression.

    Returns:
        ``(H(v) x, summary)`` where ``summary`` has shape ``(...)`` and is finite exactly when the inputs were and
        the result did not overflow, so callers can check finiteness on ``B`` numbers instead of ``B x d``.
    """
    scale_x = row_scale(x)
    x_hat, v_hat = x / scale_x, v / row_scale(v)  # scales of the inputs before broadcasting: a (d,) v is scaled once
    if x.shape != v.shape:  # broadcast explicitly; autograd sums the gradient of the expanded view
        shape = torch.broadcast_shapes(x.shape, v.shape)
        x, x_hat, v_hat = x.expand(shape), x_hat.expand(shape), v_hat.expand(shape)
    if x.numel() < FUSED_MIN_NUMEL:
        c, _, summary = _coefficients(x_hat, v_hat)
        y = torch.addcmul(x_hat, c.unsqueeze(-1), v_hat, value=-1.0)
    else:
        y, _, _, summary = _Reflection.apply(x_hat, v_hat)
    return _unscaled(y, scale_x, summary)


def reflect_linear_with_summary(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H(W x) x, summary)`` for ``(..., d)`` rows and a ``(d, d)`` ``W``, without validation.

    As :func:`reflect_with_summary`, at unit scale: ``H(W x) x = s_x H((W / s_W) (x / s_x)) (x / s_x)`` with a
    power-of-two scale per row of ``x`` and one for ``W`` (a 1e-20 or 1e20 ``W`` gives well-scaled ``v`` too).
    Large inputs take the fused :class:`_LinearReflection`; small ones plain autograd (same expression).
    """
    scale_x = row_scale(x)
    x_hat = x / scale_x
    weight = weight / row_scale(weight.reshape(1, -1))
    if x.numel() < FUSED_MIN_NUMEL:
        v_hat = x_hat @ weight.mT
        c, _, summary = _coefficients(x_hat, v_hat)
        y = torch.addcmul(x_hat, c.unsqueeze(-1), v_hat, value=-1.0)
    else:
        y, _, _, _, summary = _LinearReflection.apply(x_hat, weight)
    return _unscaled(y, scale_x, summary)


def _unscaled(y: torch.Tensor, scale: torch.Tensor, summary: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s y, summary)`` for ``y`` computed at unit scale, with an overflow of ``s y`` folded into the summary.

    At unit scale nothing overflows: ``||x||^2 < 4 d``, ``|c| = 2 |v.x| / ||v||^2 <= 4 sqrt(d) / ||v||`` with
    ``||v||^2`` above the smallest normal number where ``H(v)`` is defined, and ``|c v| <= 2 ||x||``. Only ``s y``
    can, for rows near the dtype's largest number: ``0 * max|s y_i|`` is 0, or NaN for an inf or NaN entry (no
    branch, no host synchronisation)."""
    y = y * scale
    if y.numel() == 0:
        return y, summary
    return y, torch.add(summary, y.detach().abs().amax(-1), alpha=0.0)


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
    """Dense ``H(v)`` as a ``(..., d, d)`` matrix, for tests and small problems (``H(0) := I``).

    Args:
        v: ``(..., d)`` reflection vectors.
    """
    check_features(
        v, v.shape[-1] if isinstance(v, torch.Tensor) and v.dim() else -1, name="v", layer="householder_matrix"
    )
    eye = torch.eye(v.shape[-1], dtype=v.dtype, device=v.device)
    return reflect_unchecked(eye.expand(*v.shape[:-1], -1, -1), v.unsqueeze(-2)).transpose(-1, -2)
