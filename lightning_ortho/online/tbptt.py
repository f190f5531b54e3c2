"""Truncated backprop through time as an online estimator: the gradient through the last ``k`` steps."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vjp, vmap

from lightning_ortho.online.estimator import OnlineGradientEstimator
from lightning_ortho.online.linearization import StepLinearization
from lightning_ortho.online.state import OnlineState


class TruncatedBPTT(OnlineGradientEstimator):
    """``dL_t/dtheta`` through the last ``k`` steps only: ``sum_{s > t-k} (dL_t/dh_t) J^{h_t}_{h_s} J^{h_s}_{theta_s}``.

    The state keeps a window of the last ``k`` inputs and the states they started from (``O(k (I + H))`` per
    stream, constant in the sequence length); :meth:`gradient` replays the window with autograd from the
    detached state ``k`` steps back, so one call costs ``k`` forward and backward steps. With ``k`` at least
    the sequence length this is backprop through time exactly (tested). A stream that is :meth:`reset`
    starts a new window: no gradient flows into the state it had before.

    Args:
        cell: the recurrent cell.
        k: truncation length (``>= 1``).
        closed_form: use the cell's closed-form Jacobian products when it has them, as in
            :class:`~lightning_ortho.online.OnlineGradientEstimator`.
    """

    name = "tbptt"

    def __init__(self, cell: nn.Module, k: int, *, closed_form: bool = True) -> None:
        super().__init__(cell, closed_form=closed_form)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(
                f"TruncatedBPTT: k must be a positive integer (steps to backpropagate through), got {k!r}."
            )
        self.k = k
        # The window fills up to k steps; a cell that does not declare its input_size fixes I at the first step.
        self.varying_dims = {"inputs": (1,) if self.input_size is not None else (1, 2), "starts": (1,), "cut": (1,)}
        # A saved state of a longer window loads as its last k steps (what this estimator would hold), warned.
        self.windows = {"inputs": (1, k), "starts": (1, k), "cut": (1, k)}

    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = h0.shape[0]
        return {
            "inputs": h0.new_zeros(batch, 0, self.input_size or 0),  # (B, n, I), n <= k
            "starts": h0.new_zeros(batch, 0, h0.shape[1]),  # (B, n, H): the state each window step started from
            "cut": torch.zeros(batch, 0, dtype=torch.bool, device=h0.device),  # (B, n): no gradient into starts[:, j]
            "cut_next": torch.zeros(batch, dtype=torch.bool, device=h0.device),
        }

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        t = state.tensors
        inputs = t["inputs"] if t["inputs"].shape[1] else t["inputs"].new_zeros(x.shape[0], 0, x.shape[1])
        if inputs.shape[2] != x.shape[1]:
            raise ValueError(f"TruncatedBPTT: x has {x.shape[1]} features, earlier steps had {inputs.shape[2]}.")
        return {
            "inputs": torch.cat([inputs, x[:, None]], dim=1)[:, -self.k :],
            "starts": torch.cat([t["starts"], state.h[:, None]], dim=1)[:, -self.k :],
            "cut": torch.cat([t["cut"], t["cut_next"][:, None]], dim=1)[:, -self.k :],
            "cut_next": torch.zeros_like(t["cut_next"]),
        }

    def _reset_tensor(self, name: str, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if name == "cut_next":
            return value | ~keep
        return value  # the window stays; `cut` stops the gradient at the reset

    @staticmethod
    def _drop_reset_streams(t: dict[str, torch.Tensor], grad_h: torch.Tensor) -> torch.Tensor:
        """A stream reset since its last step holds the constant ``h0``: no gradient (as RTRL's zeroed influence)."""
        return torch.where(t["cut_next"][:, None], torch.zeros_like(grad_h), grad_h)

    def _replay(self, params: dict[str, torch.Tensor], inputs, starts, cut) -> torch.Tensor:
        """The last state recomputed through the window, ``(B, H)``; ``starts`` enter as constants."""
        h = starts[:, 0]
        for j in range(inputs.shape[1]):
            h_in = torch.where(cut[:, j, None], starts[:, j], h) if j else h
            h = functional_call(self.cell, params, (inputs[:, j], h_in))
        return h

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        t = state.tensors
        grad_h = self._drop_reset_streams(t, grad_h)
        params = {name: p.detach() for name, p in self.cell.named_parameters()}
        if t["inputs"].shape[1] == 0:
            return grad_h.new_zeros(grad_h.shape[0], self.layout.size)

        def one(inputs, starts, cut, cot):
            loss = lambda p: (self._replay(p, inputs[None], starts[None], cut[None])[0] * cot).sum()  # noqa: E731
            return grad(loss)(params)

        grads = vmap(one)(t["inputs"], t["starts"].detach(), t["cut"], grad_h)
        return self.layout.flatten(grads, lead=1)

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        """``(P,)``: one reverse pass through the replayed window for all streams at once (no per-stream ``vmap``).

        The pass is ``torch.func.vjp`` of :meth:`_replay` under ``torch.compile`` (Dynamo traces it into the graph,
        where ``torch.autograd.grad`` would break it), and ``torch.autograd.grad`` in eager, where it costs less
        per operation than ``torch.func``'s wrapped tensors; both are the same products."""
        t = state.tensors
        grad_h = self._drop_reset_streams(t, grad_h)
        if t["inputs"].shape[1] == 0:
            return grad_h.new_zeros(self.layout.size)
        starts = t["starts"].detach()
        if torch.compiler.is_compiling():
            params = {name: p.detach() for name, p in self.cell.named_parameters()}
            _, pull = vjp(lambda p: self._replay(p, t["inputs"], starts, t["cut"]), params)
            return self.layout.flatten(pull(grad_h)[0], lead=0)
        params = {name: p.detach().requires_grad_(True) for name, p in self.cell.named_parameters()}
        with torch.enable_grad():
            h = self._replay(params, t["inputs"], starts, t["cut"])
            grads = torch.autograd.grad(h, list(params.values()), grad_h, allow_unused=True)
        found = {n: (g if g is not None else torch.zeros_like(params[n])) for n, g in zip(params, grads, strict=True)}
        return self.layout.flatten(found, lead=0)
