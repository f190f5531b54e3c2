"""Cells under test and independent float64 references for lightning_ortho.online.

The references use plain autograd on the cell's own parameters (``torch.autograd.grad`` row by row,
``torch.autograd.functional.jacobian``), one stream at a time, and their own flattening order
(``cell.named_parameters()``); nothing here calls ``torch.func`` or the code under test.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import GRUCell, InfluenceBalancingCell, TanhRNNCell

DTYPE = torch.float64
INPUT, HIDDEN = 2, 3
TRANSITIONS = ["aux", "householder", "cayley", "matrix_exp"]
NONLINEARITIES = ["modrelu", "tanh"]


def _orthogonal(transition: str, nonlinearity: str) -> nn.Module:
    cell = OrthogonalRNNCell(INPUT, HIDDEN, transition=transition, nonlinearity=nonlinearity).to(DTYPE)
    with torch.no_grad():  # a bias that matters: some modReLU units off, tanh shifted
        cell.bias.copy_(0.4 * torch.randn(HIDDEN, dtype=DTYPE))
        for name, p in cell.named_parameters():
            if name.startswith("transition"):
                p.add_(0.3 * torch.randn_like(p))
    return cell


def _influence() -> nn.Module:
    return InfluenceBalancingCell(units=5, positive=2, theta=0.3, input_size=INPUT).to(DTYPE)


FACTORIES = {
    "tanh": lambda: TanhRNNCell(INPUT, HIDDEN).to(DTYPE),
    "gru": lambda: GRUCell(INPUT, HIDDEN).to(DTYPE),
    "influence": _influence,
    **{f"ortho-{t}-{n}": (lambda t=t, n=n: _orthogonal(t, n)) for t in TRANSITIONS for n in NONLINEARITIES},
}
CELLS = list(FACTORIES)
PREACTIVATION_CELLS = ["tanh"] + [c for c in CELLS if c.startswith("ortho")]


def make_cell(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return FACTORIES[name]()


def hidden_size(cell: nn.Module) -> int:
    return cell.hidden_size


def parameters(cell: nn.Module) -> list[torch.Tensor]:
    return [p for _, p in cell.named_parameters()]


def flat(grads, params) -> torch.Tensor:
    """Concatenate gradients in named_parameters order; ``None`` (unused) becomes zeros."""
    return torch.cat(
        [(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params, strict=True)]
    )


def param_count(cell: nn.Module) -> int:
    return sum(p.numel() for p in cell.parameters())


def rows_jacobian(out: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """``(len(out), P)``: d out_i / d params by one reverse pass per output entry."""
    if not out.requires_grad:  # no parameter reaches ``out``
        return out.new_zeros(len(out), sum(p.numel() for p in params))
    rows = [flat(torch.autograd.grad(o, params, retain_graph=True, allow_unused=True), params) for o in out]
    return torch.stack(rows)


# -- dense per-stream Jacobians --------------------------------------------------------------------------------
def state_jacobian(cell, x, h) -> torch.Tensor:
    """``(B, H, H)``: J^{h'}_h per stream."""
    return torch.stack(
        [torch.autograd.functional.jacobian(lambda hb: cell(x[b : b + 1], hb[None])[0], h[b]) for b in range(len(h))]
    )


def parameter_jacobian(cell, x, h) -> torch.Tensor:
    """``(B, H, P)``: J^{h'}_theta per stream."""
    params = parameters(cell)
    return torch.stack([rows_jacobian(cell(x[b : b + 1], h[b : b + 1])[0], params) for b in range(len(h))])


def preactivation_parameter_jacobian(cell, x, h) -> torch.Tensor:
    """``(B, Z, P)``: J^{z}_theta per stream."""
    params = parameters(cell)
    return torch.stack(
        [rows_jacobian(cell.preactivation(x[b : b + 1], h[b : b + 1])[0], params) for b in range(len(h))]
    )


def activation_jacobian(cell, z) -> torch.Tensor:
    """``(B, H, Z)``: J^{h'}_z per stream."""
    return torch.stack(
        [torch.autograd.functional.jacobian(lambda zb: cell.activation(zb[None])[0], z[b]) for b in range(len(z))]
    )


def post_activation_jacobian(cell, z) -> torch.Tensor:
    """``(B, H, P)``: d activation(z) / d theta at fixed z."""
    params = parameters(cell)
    z = z.detach()
    return torch.stack([rows_jacobian(cell.activation(z[b : b + 1])[0], params) for b in range(len(z))])


# -- unrolled backprop through time ---------------------------------------------------------------------------
def bptt_gradient(cell, xs, h0, cotangents, resets=None, streams=None) -> torch.Tensor:
    """Flat gradient of ``sum_t <cotangents[t], h_t>`` by autograd through the unrolled cell.

    ``resets``: ``{t: (mask, h_reset)}`` replaces the masked streams' state by the constant ``h_reset`` before
    step ``t`` (0-based). ``streams``: keep only these streams' losses.
    """
    params = parameters(cell)
    h, loss = h0, 0.0
    for t in range(len(xs)):
        if resets and t in resets:
            mask, h_reset = resets[t]
            h = torch.where(mask[:, None], h_reset.detach().expand_as(h), h)
        h = cell(xs[t], h)
        weight = cotangents[t] if streams is None else cotangents[t][streams]
        loss = loss + (weight * (h if streams is None else h[streams])).sum()
    return flat(torch.autograd.grad(loss, params, allow_unused=True), params)


def forward_states(cell, xs, h0, resets=None) -> list[torch.Tensor]:
    """The (post-reset) state fed into each step, ``T`` tensors ``(B, H)``, without gradients."""
    pre, h = [], h0
    with torch.no_grad():
        for t in range(len(xs)):
            if resets and t in resets:
                mask, h_reset = resets[t]
                h = torch.where(mask[:, None], h_reset.expand_as(h), h)
            pre.append(h)
            h = cell(xs[t], h)
    return pre


def truncated_gradient(cell, xs, h0, cotangents, k, resets=None, streams=None) -> torch.Tensor:
    """Flat ``sum_t`` gradient of ``<cotangents[t], h_t>`` through the last ``k`` steps only: autograd from the
    detached state ``k`` steps back, resets inside the window replacing the state by a constant."""
    params = parameters(cell)
    pre = forward_states(cell, xs, h0, resets)
    total = torch.zeros(param_count(cell), dtype=DTYPE)
    for t in range(len(xs)):
        start = max(0, t - k + 1)
        h = pre[start].detach()
        for j in range(start, t + 1):
            if j > start and resets and j in resets:
                mask, h_reset = resets[j]
                h = torch.where(mask[:, None], h_reset.detach().expand_as(h), h)
            h = cell(xs[j], h)
        weight, out = (cotangents[t], h) if streams is None else (cotangents[t][streams], h[streams])
        total += flat(torch.autograd.grad((weight * out).sum(), params, allow_unused=True), params)
    return total


def sequence(cell, T: int, B: int, seed: int = 1):
    """Random inputs ``(T, B, I)``, initial state ``(B, H)`` and cotangents ``(T, B, H)``."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(T, B, cell.input_size, generator=g, dtype=DTYPE)
    h0 = 0.5 * torch.randn(B, cell.hidden_size, generator=g, dtype=DTYPE)
    cots = torch.randn(T, B, cell.hidden_size, generator=g, dtype=DTYPE)
    return xs, h0, cots


def flatten_dict(grads: dict[str, torch.Tensor], cell, lead: int = 0) -> torch.Tensor:
    """The estimator's ``{name: tensor}`` flattened in named_parameters order (own code, not ParameterLayout)."""
    names = [n for n, _ in cell.named_parameters()]
    assert list(grads) == names
    return torch.cat([grads[n].reshape(*grads[n].shape[:lead], -1) for n in names], dim=-1)
