"""The steps of an online training chunk: estimator step, readout step and gradient accumulation, with every
decision a tensor operation (no host read), eager or as one compiled region.

For each step ``t`` of a segment ``(b streams, n steps)``:

    h_t, state = estimator.step(x_t, state)
    loss_t, dL_t/dh_t, readout grads = readout_step(readout, h_t, y_t, mask_t, loss, streams)
    g_p += estimator.gradient(state, dL_t/dh_t)[p]  (cell parameters)  and the readout's gradients

The mask enters as a tensor (a step where no stream scores adds exact zeros), and the estimator records NaN/inf
on the state's device (``check_every = None``), so a segment reads nothing on the host; the caller reads the
record once per update window (``estimator.check``).

:class:`CompiledSteps` runs a segment as one ``torch.compile(fullgraph=True)`` region. Inside it the state counts
its steps from 0 (so the graph does not change from one call to the next, and CUDA graphs can replay it); the step
is put back, and a failure the region recorded is moved to its true step, by tensor operations after the call.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from lightning_ortho.models.online.readout_step import readout_step
from lightning_ortho.online import OnlineGradientEstimator, OnlineState

__all__ = ["CompiledSteps", "GradientPlan", "block_length", "run_steps"]


class GradientPlan:
    """Where each buffer of the update window's gradient comes from: ``("cell", name)`` (the estimator's gradient
    of the cell's parameter ``name``) or ``("readout", i)`` (the ``i``-th gradient that ``readout_step`` returns).
    A parameter of neither (a module a subclass adds) gets no gradient from the steps: its buffer stays zero.

    Args:
        names: the buffers' parameter names, in the order the buffers are given (``cell.*``, ``readout.*``, others).
        readout_names: the readout's parameters that require a gradient, as ``readout_step`` orders its gradients
            (``readout.<name>``).
    """

    def __init__(self, names: Sequence[str], readout_names: Sequence[str]) -> None:
        position = {name: i for i, name in enumerate(readout_names)}
        #: ``(buffer index, kind, key)`` of the buffers that the steps add to
        self.sources: list[tuple[int, str, Any]] = []
        for index, name in enumerate(names):
            if name.startswith("cell."):
                self.sources.append((index, "cell", name[len("cell.") :]))
            elif name in position:
                self.sources.append((index, "readout", position[name]))

    def add(
        self,
        buffers: list[torch.Tensor],
        cell_grads: dict[str, torch.Tensor],
        readout_grads: list[torch.Tensor],
        functional: bool,
    ) -> list[torch.Tensor]:
        """``buffers`` with the step's gradients added (in their dtypes): in place (one ``_foreach_add_``), or
        as new tensors with ``functional``."""
        targets, grads = [], []
        for index, kind, key in self.sources:
            g = cell_grads[key] if kind == "cell" else readout_grads[key]
            buffer = buffers[index]
            targets.append(buffer)
            grads.append(g if g.dtype == buffer.dtype else g.to(buffer.dtype))
        if not targets:
            return buffers
        if not functional:  # one call for all of them: each add_ costs more than its arithmetic
            torch._foreach_add_(targets, grads)
            return buffers
        buffers = list(buffers)
        for (index, _, _), total in zip(self.sources, torch._foreach_add(targets, grads), strict=True):
            buffers[index] = total
        return buffers


def run_steps(
    estimator: OnlineGradientEstimator,
    readout: torch.nn.Module,
    loss: str,
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    state: OnlineState,
    buffers: list[torch.Tensor],
    plan: GradientPlan,
    streams: int,
    *,
    functional: bool = False,
) -> tuple[OnlineState, list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """Run the ``n`` steps of a segment; no host read (see the module docstring).

    Args:
        x: ``(b, n, I)`` inputs in the state's dtype; ``y`` ``(b, n)`` class indices or ``(b, n, O)`` targets;
            ``mask`` ``(b, n)`` bool (the entries that score).
        state: the estimator state before the segment.
        buffers: the update window's gradient so far, in ``plan``'s order.
        streams: ``b``, the divisor of the loss.
        functional: write none of the inputs: return new buffers, a new health record and new estimator entries
            (a compiled region whose inputs are not written can be replayed as a CUDA graph); ``False`` adds into
            the buffers and lets the steps update entries in place.

    Returns:
        ``(state, buffers, loss_sum, hs)``: the state after the segment, the buffers with the segment's gradient
        added, the masked loss summed over the segment (float64, detached) and the ``n`` states ``h_t`` ``(b, H)``
        (for the error path's diagnosis).
    """
    if functional:
        # the steps may update an entry in place (UORO's w_tilde): they update copies made here instead. The integer
        # entries (stream ids, counts) are never written and stay the same objects (the noise remembers its rows by
        # them).
        tensors = {k: v.clone() if v.is_floating_point() or v.is_complex() else v for k, v in state.tensors.items()}
        health = None if state.health is None else state.health.clone()
        state = state.replace(tensors=tensors, health=health)
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    hs = []
    inputs, targets, masks = x.unbind(1), y.unbind(1), mask.unbind(1)
    for t in range(len(inputs)):
        with no_autocast(x):
            h, state = estimator.step(inputs[t], state)
        step_loss, grad_h, readout_grads = readout_step(readout, h, targets[t], masks[t], loss, streams)
        with no_autocast(h):
            cell_grads = estimator.gradient(state, grad_h.to(h.dtype))
        buffers = plan.add(buffers, cell_grads, readout_grads, functional)
        loss_sum = loss_sum + step_loss
        hs.append(h)
    return state, buffers, loss_sum, hs


def block_length(steps: int, update_every: int, window_steps: int) -> int:
    """The steps of one compiled call: the largest length that divides the chunk and ends every update window on a
    call's end, ``gcd(steps, update_every, window_steps)``. In a steady state (the same chunk length, the window
    position a multiple of ``gcd(steps, update_every)``) every call has this length, so one graph serves them
    all; ``update_every`` a multiple of ``steps`` gives one call per chunk."""
    return math.gcd(steps, update_every, window_steps) if window_steps else math.gcd(steps, update_every)


class CompiledSteps:
    """:func:`run_steps` compiled as one region (``torch.compile(fullgraph=True)``), called on blocks of steps.

    Args:
        backend: ``torch.compile``'s backend (``"inductor"``, or ``"aot_eager"`` for tests).
        mode: ``torch.compile``'s mode; ``None`` chooses ``"reduce-overhead"`` (CUDA graphs) for the inductor on
            CUDA, the backend's default elsewhere.

    On CUDA with ``"reduce-overhead"``, each call starts a new CUDA-graph step and its outputs are copied out of the
    graph's memory (the next replay writes over them). Where the inductor declines to capture a CUDA graph (it
    counts a skip), this warns once: the region still runs compiled, without CUDA graphs.
    """

    def __init__(self, backend: str = "inductor", mode: str | None = None) -> None:
        self.backend, self.mode = backend, mode
        self._compiled: dict[str, Any] = {}
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # copies and pickles of the module compile afresh: compiled functions are neither copied nor pickled
        return {**self.__dict__, "_compiled": {}}

    def mode_for(self, device: torch.device) -> str | None:
        """The compile mode on ``device``: the one given, else CUDA graphs for the inductor on CUDA."""
        if self.mode is not None:
            return self.mode
        return "reduce-overhead" if device.type == "cuda" and self.backend == "inductor" else None

    def __call__(
        self,
        estimator: OnlineGradientEstimator,
        readout: torch.nn.Module,
        loss: str,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        state: OnlineState,
        buffers: list[torch.Tensor],
        plan: GradientPlan,
        streams: int,
    ) -> tuple[OnlineState, list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
        """:func:`run_steps` (functional) as a compiled region, with the state's true step count put back."""
        mode = self.mode_for(x.device)
        compiled = self._compiled.get(str(mode))
        if compiled is None:
            compiled = torch.compile(run_steps, fullgraph=True, backend=self.backend, mode=mode)
            self._compiled[str(mode)] = compiled
        graphs = mode == "reduce-overhead" and x.device.type == "cuda"
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        skips = _cudagraph_skips()
        base, before = state.step, state.health
        start = state.replace(step=0)  # the region counts from 0: no step number is baked into its graph
        new_state, buffers, loss_sum, hs = compiled(
            estimator, readout, loss, x, y, mask, start, buffers, plan, streams, functional=True
        )
        if graphs:  # the next replay writes over the outputs: keep copies
            new_state = new_state.replace(
                h=new_state.h.clone(),
                # an entry the steps hand back untouched is the input itself (the stream ids): kept, so that what
                # is remembered by identity (the noise's rows) still holds at the next call
                tensors={k: v if v is start.tensors.get(k) else v.clone() for k, v in new_state.tensors.items()},
                health=None if new_state.health is None else new_state.health.clone(),
            )
            buffers = [b.clone() for b in buffers]
            loss_sum, hs = loss_sum.clone(), [h.clone() for h in hs]
            if not self._warned and _cudagraph_skips() > skips:
                self._warned = True
                warnings.warn(
                    "OnlineRNNModule(compile=True): the inductor could not capture the chunk's steps as a CUDA"
                    " graph (see TORCH_LOGS=perf_hints for the reason); they run compiled without CUDA graphs.",
                    UserWarning,
                    stacklevel=3,
                )
        new_state.step = base + new_state.step
        if new_state.health is not None and before is not None and base:
            # A failure recorded in the region carries the region's step: move it to the true one (tensor ops).
            record = new_state.health
            fresh = (before[:1] == 0) & (record[:1] != 0)
            record[:1].add_(fresh.to(record.dtype) * base)
        return new_state, buffers, loss_sum, hs


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


def no_autocast(like: torch.Tensor) -> torch.autocast | contextlib.nullcontext:
    """Run the estimator and the cell outside autocast: their recursions stay in the parameters' dtype (a context
    that does nothing where autocast is off, the common case: entering ``torch.autocast`` costs more than an online
    step's small operations)."""
    device = like.device.type
    return torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else _NOTHING


_NOTHING = contextlib.nullcontext()
