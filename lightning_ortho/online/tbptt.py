"""Truncated backprop through time as an online estimator: the gradient through the last ``k`` steps."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vjp, vmap

from lightning_ortho._native.tbptt import step as fused_step
from lightning_ortho._native.tbptt import summed_gradient, tbptt_tanh_kernels
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator
from lightning_ortho.online.linearization import StepLinearization
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.uoro_fused import fusable_tanh_cell

#: ``B H (H + I)`` (multiply-adds of one step of the cell for all ``B`` streams) above which the fused tanh step and
#: gradient decline for ``B > 1``: the C kernels take the streams one by one (matrix-vector products), PyTorch's
#: batched products take them all at once with BLAS, which from about this size is faster than the calls and the
#: autograd replay it costs (measured: about 0.6x of PyTorch's time at 2^19 with 8 to 32 streams, 1x at 128 streams;
#: one stream has no batch to gain from at any size).
FUSED_MAX_WORK = 1 << 19


class TruncatedBPTT(OnlineGradientEstimator):
    """``dL_t/dtheta`` through the last ``k`` steps only: ``sum_{s > t-k} (dL_t/dh_t) J^{h_t}_{h_s} J^{h_s}_{theta_s}``.

    The state keeps a window of the last ``k`` inputs and the states they started from (``O(k (I + H))`` per
    stream, constant in the sequence length); :meth:`gradient` replays the window with autograd from the
    detached state ``k`` steps back, so one call costs ``k`` forward and backward steps. With ``k`` at least
    the sequence length this is backprop through time exactly (tested). A stream that is :meth:`reset`
    starts a new window: no gradient flows into the state it had before.

    On a plain :class:`~lightning_ortho.online.TanhRNNCell` (with ``closed_form``) a step and a summed gradient are
    each one C call on float32/float64 CPU tensors (one stream, or up to :data:`FUSED_MAX_WORK`;
    :mod:`lightning_ortho._native.tbptt`): the cell's step and the window shifted by one step into new tensors; the
    replay and the reverse pass through every stream's window, summed straight into the flat estimate. The replay
    is skipped where the window already holds its states: on the state the last step returned, untouched, while the
    parameters are bit for bit those of the window's steps (no optimiser update since). The same numbers as the
    PyTorch path to rounding, which runs elsewhere (under ``torch.compile`` and other tracers, on other devices, with
    :func:`lightning_ortho._native.native_kernels` ``(False)``). The estimator remembers what its last step
    returned to know that state again (a gradient on any other state replays: slower, never wrong), so it is not
    meant to step from several threads at once.

    Args:
        cell: the recurrent cell.
        k: truncation length (``>= 1``).
        closed_form: use the cell's closed-form Jacobian products when it has them, as in
            :class:`~lightning_ortho.online.OnlineGradientEstimator` (``False`` also keeps the C kernels off).
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
        # The C step and gradient compute tanh(W_h h + W_x x + b): the cell must step exactly so (parameters are
        # read at every call, so optimiser updates between steps are seen).
        self._fusable = closed_form and fusable_tanh_cell(cell, self.layout)
        # What the last fused step returned, (h, inputs, starts, cut, cut_next, dtype), and the parameters it took
        # with the count of steps in a row that took exactly those ((P + 1,), written by the C step): a gradient on
        # that state, while the parameters are those bits, reads the window's states instead of replaying them
        # (see _native/tbptt.c).
        self._stepped: tuple | None = None
        self._snapshot: torch.Tensor | None = None

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

    # -- the fused tanh step and gradient (one C call each) -------------------------------------------------------
    def _advance_step(self, x: torch.Tensor, state: OnlineState) -> Advance:
        """One step (see :meth:`OnlineGradientEstimator._advance_step`): on a fusable cell one C call (the cell's
        step, the window shifted by one step into new tensors, and the verdict), else the cell and :meth:`_advance`."""
        if self._fusable and not torch.compiler.is_compiling():
            fused = self._one_call_step(x, state)
            if fused is not None:
                return fused
        return super()._advance_step(x, state)

    def _gradient_estimate(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        """``(estimate (P,), verdict)``: on a fusable cell one C call (the reverse pass through every stream's
        window, replayed unless it holds the states of the current parameters, summed into the flat estimate; and
        the sum of ``grad_h`` and the estimate), else :meth:`_gradient_summed` and ``None``."""
        if self._fusable and not torch.compiler.is_compiling():
            operands = self._fused_operands(state, grad_h)
            if operands is not None:
                return summed_gradient(operands, state.h, grad_h, self._snapshot)
        return self._gradient_summed(state, grad_h), None

    def _one_call_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """The step as one C call (:func:`~lightning_ortho._native.tbptt.step`), or ``None`` where it declines
        (then the PyTorch path runs). The new window entries are new tensors (the state passed in is left as it
        was; the all-false ``cut_next`` of the last fused step, untouched, is shared); the verdict sums ``x``,
        ``h'`` and the new window."""
        operands = self._fused_operands(state, x)
        if operands is None or x.shape[1] != operands[2].shape[1]:
            return None
        w_ih, cut_next, continuing = operands[2], operands[7], operands[8]
        snapshot = self._snapshot  # continuing: the last step's, of its dtype and parameter shapes, which still hold
        if not continuing:
            hidden, n_inputs = w_ih.shape
            size = hidden * (hidden + n_inputs + 1)
            if snapshot is None or snapshot.dtype is not w_ih.dtype or snapshot.shape[0] != size + 1:
                snapshot = self._snapshot = w_ih.new_empty(size + 1)
        h_new, inputs, starts, cut, verdict = fused_step(operands, x, state.h, self.k, snapshot)
        if not continuing:
            cut_next = torch.zeros_like(cut_next)
        # (an inference tensor has no version counter to tell that it is untouched: no memo)
        self._stepped = None if h_new.is_inference() else (h_new, inputs, starts, cut, cut_next, w_ih.dtype)
        return Advance(h_new, {"inputs": inputs, "starts": starts, "cut": cut, "cut_next": cut_next}, None, verdict)

    def _continues(self, state: OnlineState) -> bool:
        """Whether ``state`` holds, untouched, what the last fused step returned: the same ``h`` and window
        tensors (:attr:`_stepped`), at version 0 (no in-place change since)."""
        last = self._stepped
        if last is None:
            return False
        h, t = state.h, state.tensors
        inputs, starts, cut, cut_next = t["inputs"], t["starts"], t["cut"], t["cut_next"]
        return (
            h is last[0]
            and inputs is last[1]
            and starts is last[2]
            and cut is last[3]
            and cut_next is last[4]
            and not (h._version or inputs._version or starts._version or cut._version or cut_next._version)
        )

    def _fused_operands(self, state: OnlineState, lead: torch.Tensor) -> tuple | None:
        """``(kernels, W_h, W_x, b, inputs, starts, cut, cut_next, continuing)`` for the C kernels
        (:mod:`lightning_ortho._native.tbptt`; ``continuing``: :meth:`_continues`), or ``None`` where they decline:
        unless the cell's parameters, ``lead`` (the step's ``x`` or the gradient's ``grad_h``), ``state.h`` and the
        window are C-contiguous real CPU tensors (:func:`~lightning_ortho._native.real_cpu`) of the shapes the
        kernels read (an empty window may have any ``I``), the floating ones of the parameters' dtype, and the
        streams are one or few enough (:data:`FUSED_MAX_WORK`). The template has checked ``lead`` against
        ``state.h`` (streams, dtype, device). ``h`` and the window of the state the last fused step returned,
        untouched since, are that step's own new CPU tensors, of the shapes and dtype checked then: only the
        parameters (which an update may replace or convert) and ``lead`` are checked again."""
        params = self.cell._parameters  # read at every call: optimiser updates and replaced parameters are seen
        w_hh, w_ih, bias = params.get("weight_hh"), params.get("weight_ih"), params.get("bias")
        if w_hh is None or w_ih is None or bias is None:  # (a parametrisation registered since: not the plain step)
            return None
        t = state.tensors
        h, inputs, starts, cut, cut_next = state.h, t["inputs"], t["starts"], t["cut"], t["cut_next"]
        dtype = w_hh.dtype
        continuing = self._continues(state)
        if continuing:
            batch, hidden = h.shape
            n_inputs = inputs.shape[2]
            if self._stepped[5] is not dtype:
                return None
            others: tuple[torch.Tensor, ...] = ()
        else:
            if h.dim() != 2 or starts.dim() != 3:
                return None
            batch, hidden = h.shape
            n_inputs, held = w_ih.shape[-1], starts.shape[1]
            if (
                starts.shape[::2] != (batch, hidden)
                or (held and inputs.shape != (batch, held, n_inputs))
                or cut.shape != (batch, held)
                or cut_next.shape != (batch,)
                or cut.dtype is not torch.bool
                or cut_next.dtype is not torch.bool
                or not (cut.is_contiguous() and cut_next.is_contiguous())
                or (batch > 1 and batch * hidden * (hidden + n_inputs) > FUSED_MAX_WORK)
            ):
                return None
            others = (h, inputs, starts, cut, cut_next)
        if w_hh.shape != (hidden, hidden) or w_ih.shape != (hidden, n_inputs) or bias.shape != (hidden,):
            return None
        for tensor in (w_hh, w_ih, bias, lead, *others[:3]):
            if tensor.dtype is not dtype or not tensor.is_contiguous():
                return None
        kernels = tbptt_tanh_kernels(w_hh, w_ih, bias, lead, *others)
        if kernels is None:
            return None
        return kernels, w_hh, w_ih, bias, inputs, starts, cut, cut_next, continuing

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
