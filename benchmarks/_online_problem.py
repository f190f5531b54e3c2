"""The online-training problem the speed benchmarks time (``bench_online``, ``bench_small``, the GPU suite): a
tanh cell with a readout and a pool of inputs and targets (:class:`Problem`), and one method running on it
(:class:`Runner`): a forward pass, backprop through time, or an online estimator."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.online import RTRL, UORO, TanhRNNCell, TruncatedBPTT

INPUT_SIZE, OUTPUTS, BATCH, POOL = 32, 8, 8, 64
TBPTT_K = 10
#: method key -> (method, projection)
METHODS: dict[str, tuple[str, str | None]] = {
    "forward": ("forward", None),
    "bptt": ("bptt", None),
    "uoro_state": ("uoro", "state"),
    "uoro_preactivation": ("uoro", "preactivation"),
    "uoro_parameter": ("uoro", "parameter"),
    "uoro_none": ("uoro", "none"),
    "tbptt": ("tbptt", None),
    "rtrl": ("rtrl", None),
}


class Problem:
    """The cell (``TanhRNNCell(input_size, hidden)`` unless ``cell`` is given), the readout and a pool of inputs and
    targets, all from one seed, on ``device`` (the cell is moved there; the draws are made on the CPU, so every
    device sees the same numbers)."""

    def __init__(
        self,
        hidden: int,
        batch: int = BATCH,
        input_size: int = INPUT_SIZE,
        seed: int = 0,
        cell: nn.Module | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        torch.manual_seed(seed)
        self.hidden, self.batch = hidden, batch
        self.cell = (TanhRNNCell(input_size, hidden) if cell is None else cell).to(device)
        self.readout = nn.Linear(hidden, OUTPUTS).to(device)
        self.inputs = torch.randn(POOL, batch, input_size).to(device)
        self.targets = torch.randn(POOL, batch, OUTPUTS).to(device)
        self.h0 = torch.zeros(batch, hidden, device=device)

    def data(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[t % POOL], self.targets[t % POOL]

    def warm_up(self) -> None:
        """One cell step and one readout backward pass (lazy kernel and autograd buffers), keeping nothing."""
        x, y = self.data(0)
        with torch.no_grad():
            self.cell(x, self.h0)
        h = self.cell(x, self.h0)
        loss = nn.functional.mse_loss(self.readout(h), y)
        torch.autograd.grad(loss, [h, *self.cell.parameters(), *self.readout.parameters()])


def make_estimator(key: str, cell: nn.Module):
    method, projection = METHODS[key]
    if method == "uoro":
        return UORO(cell, projection=projection, generator=0)
    if method == "rtrl":
        return RTRL(cell)
    return TruncatedBPTT(cell, TBPTT_K)


class Runner:
    """One method on one running stream of the problem: :meth:`run` advances it ``steps`` steps (an online method
    with ``estimator`` instead of METHODS' one for ``key``).

    ``readout`` (online methods): ``"autograd"`` takes ``dL/dh`` and the readout's gradients by autograd through the
    readout and ``mse_loss`` at each step (the figures this benchmark publishes); ``"closed_form"`` takes the same
    gradients with the library's ``readout_step``, as ``OnlineRNNModule`` runs its online step.
    """

    def __init__(self, key: str, problem: Problem, estimator=None, readout: str = "autograd") -> None:
        if readout not in ("autograd", "closed_form"):
            raise ValueError(f"Runner: readout must be 'autograd' or 'closed_form', got {readout!r}.")
        self.key, self.problem, self.t, self.readout = key, problem, 0, readout
        self.h = problem.h0
        self.estimator = self.state = None
        if key not in ("forward", "bptt"):
            self.estimator = estimator if estimator is not None else make_estimator(key, problem.cell)
            self.state = self.estimator.initial_state(problem.h0)
        params = [*problem.cell.parameters(), *problem.readout.parameters()]
        self.grads = [torch.zeros_like(p) for p in params]

    def run(self, steps: int) -> None:
        if self.key == "forward":
            self._forward(steps)
        elif self.key == "bptt":
            self._bptt(steps)
        else:
            self._online(steps)

    def _forward(self, steps: int) -> None:
        cell, h = self.problem.cell, self.h
        with torch.no_grad():
            for _ in range(steps):
                h = cell(self.problem.data(self.t)[0], h)
                self.t += 1
        self.h = h

    def _bptt(self, steps: int) -> None:
        cell, readout = self.problem.cell, self.problem.readout
        params = [*cell.parameters(), *readout.parameters()]
        h, total = self.h, 0.0
        for _ in range(steps):
            x, y = self.problem.data(self.t)
            h = cell(x, h)
            total = total + nn.functional.mse_loss(readout(h), y)
            self.t += 1
        grads = torch.autograd.grad(total, params)
        for acc, g in zip(self.grads, grads, strict=True):
            acc.add_(g)
        self.h = h.detach()

    def _online(self, steps: int) -> None:
        est, readout = self.estimator, self.problem.readout
        names = [n for n, _ in self.problem.cell.named_parameters()]
        state = self.state
        closed_form = self.readout == "closed_form"
        if closed_form:  # imported here: the memory benchmark's processes import lightning_ortho.online only
            from lightning_ortho.models.online.readout_step import readout_step

        for _ in range(steps):
            x, y = self.problem.data(self.t)
            h, state = est.step(x, state)
            if closed_form:
                # streams = b O / 2: the module's loss sum 0.5 ||o - y||^2 / streams is then mse_loss's mean; mask
                # None: every stream scores at every step, which the module reads from the chunk's mask
                _, grad_h, readout_grads = readout_step(readout, h, y, None, "mse", y.numel() / 2)
            else:
                h = h.detach().requires_grad_(True)
                loss = nn.functional.mse_loss(readout(h), y)
                grad_h, *readout_grads = torch.autograd.grad(loss, [h, *readout.parameters()])
            cell_grads = est.gradient(state, grad_h)
            for acc, g in zip(self.grads, [*(cell_grads[n] for n in names), *readout_grads], strict=True):
                acc.add_(g)
            self.t += 1
        self.state = state

    def state_bytes(self) -> int | None:
        if self.state is None:
            return None
        return self.state.h.nbytes + sum(t.nbytes for t in self.state.tensors.values())
