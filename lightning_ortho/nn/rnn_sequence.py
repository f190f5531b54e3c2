"""A whole sequence of an orthogonal RNN whose transition is one auxiliary reflection, as one autograd Function.

The recurrence ("One Reflection Suffice", section 3.2 / Appendix B.2) is

    v_t = W h_{t-1},   c_t = v_t.h_{t-1} / v_t.v_t,   z_t = h_{t-1} - 2 c_t v_t + V x_t,   h_t = sigma(z_t; b)

with ``sigma`` modReLU ``sign(z) relu(|z| + b)`` or ``tanh(z + b)``. Run step by step through autograd, every step
records a dozen nodes and the reflection checks its input with a host read. Here the recurrence runs under no grad
and keeps only ``v_t``, ``c_t``, ``v_t.v_t`` and the outputs for a hand-written backward pass through time, and the
finiteness and range checks of all steps are read once at the end. With ``g = dL/dh_t`` (plus what flows back from
step ``t + 1``), ``y_t = h_{t-1} - 2 c_t v_t`` recomputed,

    dL/dz_t = g sigma'(z_t),   s_t = (dL/dz_t . v_t) / v_t.v_t,   u_t = c_t dL/dz_t + s_t y_t,
    dL/dh_{t-1} = dL/dz_t - 2 s_t v_t - 2 u_t W,   dL/dW = -2 sum_t u_t^T h_{t-1},
    dL/dV = sum_t dL/dz_t^T x_t,   dL/dx_t = dL/dz_t V,   dL/db = sum_t g dsigma/db.

``sigma'`` comes from the outputs alone: modReLU has ``dh/dz = sign(h)^2`` and ``dh/db = sign(h)``, tanh
``1 - h^2`` for both. Nothing of size ``T x B x H`` is written but the outputs: on a CPU, fresh memory costs more
than the elementwise kernels that fill it.

A zero ``h_{t-1}`` row (``h_0 = 0``) has ``v = 0``: the reflection is the identity there (``H(0) := I``), which the
divisor ``max(v.v, tiny)`` gives exactly (``c = 0``, ``s = 0``). Any other row whose ``v.v`` left the accurate range
(:func:`~lightning_ortho.nn._undefined.accurate_range`), or a NaN/inf anywhere, makes the caller discard the result
and run the cell step by step, which reflects at unit scale or names the culprit.
"""

from __future__ import annotations

import torch

from lightning_ortho.nn._undefined import accurate_range
from lightning_ortho.nn.activations import modrelu as modrelu_activation


def _step_into(
    out: torch.Tensor,
    h: torch.Tensor,
    x: torch.Tensor,
    weight_t: torch.Tensor,
    kernel_t: torch.Tensor,
    bias: torch.Tensor,
    modrelu: bool,
    tiny: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step under no grad, ``h_t`` written into ``out``: ``(h_t, v, c, vv)`` from ``h_{t-1}`` ``(B, H)`` and
    ``x_t`` ``(B, I)``; ``weight_t = W^T``, ``kernel_t = V^T``."""
    v = torch.mm(h, weight_t)
    vv = torch.linalg.vecdot(v, v).clamp_min_(tiny)
    c = torch.linalg.vecdot(v, h).div_(vv)
    z = torch.addcmul(h, c.unsqueeze(-1), v, value=-2.0).addmm_(x, kernel_t)
    if modrelu:
        return torch.mul(torch.sign(z), torch.abs(z).add_(bias).relu_(), out=out), v, c, vv
    return torch.tanh(z.add_(bias), out=out), v, c, vv


def _step(
    h: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    kernel: torch.Tensor,
    bias: torch.Tensor,
    modrelu: bool,
    tiny: float,
) -> torch.Tensor:
    """The same step with differentiable ops (for the graph of the gradient)."""
    v = h @ weight.t()
    vv = torch.linalg.vecdot(v, v).clamp_min(tiny)
    c = torch.linalg.vecdot(v, h) / vv
    z = torch.addcmul(h, c.unsqueeze(-1), v, value=-2.0) + x @ kernel.t()
    return modrelu_activation(z, bias) if modrelu else torch.tanh(z + bias)


def _sequence(
    x: torch.Tensor, h0: torch.Tensor, weight: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor, modrelu: bool
) -> torch.Tensor:
    """``(B, T, H)`` outputs of the recurrence with differentiable ops (the graph of the gradient, double backward)."""
    tiny, h, outputs = torch.finfo(x.dtype).tiny, h0, []
    for t in range(x.shape[1]):
        h = _step(h, x[:, t], weight, kernel, bias, modrelu, tiny)
        outputs.append(h)
    return torch.stack(outputs, 1)


class _AuxiliaryRNNSequence(torch.autograd.Function):
    """``(x (B, T, I), h_0 (B, H), W (H, H), V (H, I), b (H,)) -> (h_1..h_T (B, T, H), h_T (B, H))``.

    ``keep``: whether a backward pass will follow (else the per-step ``v_t`` are not kept). ``report`` (a list)
    receives ``(min, max)`` of ``v.v`` over all steps and rows (NaN where some ``c`` is not finite), the sum of
    ``h_T`` (NaN or inf when it is not finite) and the ``(T, B)`` clamped ``v.v``.
    """

    @staticmethod
    def forward(ctx, x, h0, weight, kernel, bias, modrelu, report, keep):  # noqa: D102
        batch, steps, hidden = x.shape[0], x.shape[1], weight.shape[0]
        outputs = x.new_empty(batch, steps, hidden)
        tiny, weight_t, kernel_t, h = torch.finfo(x.dtype).tiny, weight.t(), kernel.t(), h0
        vs, cs, vvs = [], [], []
        for t in range(steps):
            h, v, c, vv = _step_into(outputs[:, t], h, x[:, t], weight_t, kernel_t, bias, modrelu, tiny)
            if keep:  # what the backward pass needs; inference keeps nothing of size B x H per step
                vs.append(v)
            cs.append(c)
            vvs.append(vv)
        cs, vvs = torch.stack(cs), torch.stack(vvs)
        # vv + 0 * c is vv where c is finite and NaN where it is not (0 * inf = NaN).
        report.extend((*torch.aminmax(torch.add(vvs, cs, alpha=0.0)), h.sum(), vvs))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, h0, weight, kernel, bias, outputs)
        ctx.modrelu, ctx.vs, ctx.cs, ctx.vvs = modrelu, vs, cs, vvs
        return outputs, h.clone()

    @staticmethod
    def backward(ctx, grad_outputs, grad_last):  # noqa: D102
        x, h0, weight, kernel, bias, outputs = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _double_backward(ctx, x, h0, weight, kernel, bias, grad_outputs, grad_last)
        modrelu, vs, cs, vvs, needs = ctx.modrelu, ctx.vs, ctx.cs, ctx.vvs, ctx.needs_input_grad
        grad_h = grad_last if grad_last is not None else torch.zeros_like(outputs[:, -1])
        grad_weight = torch.zeros_like(weight)
        grad_kernel = torch.zeros_like(kernel)
        grad_bias = torch.zeros_like(outputs[:, 0])  # (B, H), summed over the batch at the end
        grad_x = []
        for t in range(outputs.shape[1] - 1, -1, -1):
            if grad_outputs is not None:
                grad_h = grad_h + grad_outputs[:, t]
            h, h_prev = outputs[:, t], outputs[:, t - 1] if t > 0 else h0
            if modrelu:  # dh/dz = [h != 0] = sign(h)^2, dh/db = sign(h)
                sign = torch.sign(h)
                grad_z = grad_h.mul_(sign) if grad_h is not grad_last else grad_h * sign
                grad_bias.add_(grad_z)
                grad_z.mul_(sign)
            else:  # dh/dz = dh/db = 1 - h^2
                grad_z = torch.addcmul(grad_h, grad_h, h * h, value=-1.0)
                grad_bias.add_(grad_z)
            v, c = vs[t], cs[t].unsqueeze(-1)
            s = torch.linalg.vecdot(grad_z, v).div_(vvs[t]).unsqueeze(-1)
            y = torch.addcmul(h_prev, c, v, value=-2.0)
            u = torch.mul(grad_z, c).addcmul_(s, y)
            grad_weight.addmm_(u.t(), h_prev)
            if needs[3]:
                grad_kernel.addmm_(grad_z.t(), x[:, t])
            if needs[0]:
                grad_x.append(torch.mm(grad_z, kernel))
            grad_h = torch.addmm(torch.addcmul(grad_z, s, v, value=-2.0), u, weight, alpha=-2.0)
        return (
            torch.stack(grad_x[::-1], 1) if needs[0] else None,
            grad_h if needs[1] else None,
            grad_weight.mul_(-2.0) if needs[2] else None,
            grad_kernel if needs[3] else None,
            grad_bias.sum(0) if needs[4] else None,
            None,
            None,
            None,
        )


def _double_backward(ctx, x, h0, weight, kernel, bias, grad_outputs, grad_last):
    """The first derivative as a graph (``create_graph=True``): rerun the recurrence with differentiable ops from the
    saved inputs and differentiate it with autograd."""
    inputs = (x, h0, weight, kernel, bias)
    wanted = [i for i, needed in enumerate(ctx.needs_input_grad[:5]) if needed and inputs[i].requires_grad]
    with torch.enable_grad():
        outputs = _sequence(x, h0, weight, kernel, bias, ctx.modrelu)
        pairs = [(o, g) for o, g in ((outputs, grad_outputs), (outputs[:, -1], grad_last)) if g is not None]
        grads = torch.autograd.grad(
            [o for o, _ in pairs],
            [inputs[i] for i in wanted],
            [g for _, g in pairs],
            create_graph=True,
            allow_unused=True,
        )
    result: list[torch.Tensor | None] = [None] * 8
    for i, grad in zip(wanted, grads, strict=True):
        result[i] = grad
    return tuple(result)


def auxiliary_rnn_sequence(
    x: torch.Tensor,
    h0: torch.Tensor,
    weight: torch.Tensor,
    kernel: torch.Tensor,
    bias: torch.Tensor,
    *,
    modrelu: bool,
    checked: bool,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(outputs (B, T, H), h_T (B, H))`` of the recurrence in the module docstring, or ``None`` when some step had a
    non-zero ``h_{t-1}`` row with ``v.v`` outside the accurate range, or a NaN/inf appeared (``checked``: one host
    read at the end; without it the result is returned unchecked, as the layers do under ``finite_checks(False)``).

    Args:
        x: ``(B, T, I)`` inputs; ``h0``: ``(B, H)`` initial state (an expanded ``(H,)`` parameter is fine).
        weight: ``(H, H)`` ``W`` of the auxiliary reflection; ``kernel``: ``(H, I)`` ``V``; ``bias``: ``(H,)``.
            All of one float dtype.
    """
    report: list[torch.Tensor] = []
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (x, h0, weight, kernel, bias))
    outputs, last = _AuxiliaryRNNSequence.apply(x, h0, weight, kernel, bias, modrelu, report, keep)
    if not checked:
        return outputs, last
    lowest, highest, total, vvs = report
    low, high = accurate_range(x.dtype)
    lowest, highest, total = torch.stack((lowest, highest, total)).tolist()
    if not (highest <= high and abs(total) < float("inf")):  # False for NaN
        return None
    if lowest < low:  # only rows with h_{t-1} = 0 exactly may have a tiny v.v (they are reflected exactly)
        previous = torch.cat((h0.unsqueeze(1), outputs[:, :-1].detach()), 1)  # (B, T, H)
        if bool((previous[vvs.t() < low] != 0).any()):
            return None
    return outputs, last
