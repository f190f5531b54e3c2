"""DiagonalRTRL takes only recurrences that are diagonal by construction (declared ``diagonal_recurrence = True``
and checked at the current parameters and after a random move of them), because training moves the parameters:
a recurrence that is diagonal only at its current weights becomes dense at the first step. References: backprop
through time by autograd over the unrolled cell in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_ortho.online import DiagonalRTRL, TanhRNNCell

from . import references as ref

DTYPE = torch.float64
INPUT, HIDDEN, T, B = 3, 4, 6, 2


def sequence(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``(T, B, I)`` and the cotangents ``dL_t/dh_t`` ``(T, B, H)`` of ``L = sum_t <cots[t], h_t>``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, INPUT, generator=g, dtype=DTYPE), torch.randn(T, B, HIDDEN, generator=g, dtype=DTYPE)


def bptt(cell: nn.Module, xs: torch.Tensor, cots: torch.Tensor) -> torch.Tensor:
    """The flat gradient of ``L = sum_t <cots[t], h_t>`` from ``h_0 = 0`` by autograd through the unrolled cell."""
    return ref.bptt_gradient(cell, xs, torch.zeros(B, HIDDEN, dtype=DTYPE), cots)


def online(est: DiagonalRTRL, xs: torch.Tensor, cots: torch.Tensor) -> dict[str, torch.Tensor]:
    """``sum_t est.gradient(state_t, cots[t])`` from ``h_0 = 0``, ``{name: tensor}``."""
    state, total = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE)), {}
    for t in range(T):
        _, state = est.step(xs[t], state)
        for name, g in est.gradient(state, cots[t]).items():
            total[name] = total[name] + g if name in total else g
    return total


def diagonal_tanh_cell() -> TanhRNNCell:
    """A ``TanhRNNCell`` whose ``weight_hh`` is diagonal now (its recurrence is diagonal at these weights only)."""
    torch.manual_seed(0)
    cell = TanhRNNCell(INPUT, HIDDEN).to(DTYPE)
    with torch.no_grad():
        cell.weight_hh.copy_(torch.diag(torch.tensor([0.5, -0.3, 0.8, 0.2], dtype=DTYPE)))
    return cell


class DeclaredTanhCell(TanhRNNCell):
    """A ``TanhRNNCell`` that declares a diagonal recurrence, which its matrix ``weight_hh`` cannot keep."""

    diagonal_recurrence = True


class GatedDecayCell(nn.Module):
    """``h' = tanh(w * (v * h) + U x + b)`` with vectors ``w``, ``v``: diagonal for every value of the parameters.
    ``v`` starts at zero, so ``w`` has no influence on ``h'`` at the initial weights; it gains one after a step."""

    diagonal_recurrence = True

    def __init__(self) -> None:
        super().__init__()
        self.input_size, self.hidden_size = INPUT, HIDDEN
        self.w = nn.Parameter(torch.empty(HIDDEN, dtype=DTYPE).uniform_(-1.2, 1.2))
        self.v = nn.Parameter(torch.zeros(HIDDEN, dtype=DTYPE))
        self.U = nn.Parameter(torch.randn(HIDDEN, INPUT, dtype=DTYPE) / INPUT**0.5)
        self.b = nn.Parameter(0.3 * torch.randn(HIDDEN, dtype=DTYPE))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w * (self.v * h) + x @ self.U.T + self.b)


def test_a_recurrence_diagonal_only_at_the_current_weights_is_refused():
    cell = diagonal_tanh_cell()
    xs, cots = sequence()
    # Why: the exact (BPTT) gradient of weight_hh has every off-diagonal entry nonzero, so one SGD step on it makes
    # the recurrence dense, where DiagonalRTRL's traces (which drop the off-diagonal influence) no longer hold.
    grad = bptt(cell, xs, cots)[: HIDDEN * HIDDEN].view(HIDDEN, HIDDEN)
    off_diagonal = grad[~torch.eye(HIDDEN, dtype=torch.bool)]
    assert off_diagonal.abs().min() > 1e-6
    with pytest.raises(ValueError, match=r"TanhRNNCell does not declare a diagonal recurrence.*RTRL \(exact\)"):
        DiagonalRTRL(cell)
    with pytest.raises(ValueError, match="does not declare a diagonal recurrence"):
        DiagonalRTRL(cell, closed_form=False)


def test_a_declaration_that_a_move_of_the_parameters_breaks_is_refused():
    cell = DeclaredTanhCell(INPUT, HIDDEN).to(DTYPE)
    with torch.no_grad():
        cell.weight_hh.copy_(diagonal_tanh_cell().weight_hh)
    with pytest.raises(ValueError, match="diagonal at its current parameters but not after a small random move"):
        DiagonalRTRL(cell)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"is not diagonal \(unit i reads other units"):
        DiagonalRTRL(DeclaredTanhCell(INPUT, HIDDEN).to(DTYPE))  # dense weight_hh: not diagonal now either


def test_a_declared_diagonal_cell_stays_exact_through_training():
    """Three SGD updates on DiagonalRTRL's own estimate; before each, the estimate equals BPTT's gradient in float64.
    ``w`` has zero influence at the initial weights (``v = 0``) and a nonzero one after the first update: the entries
    a parameter enters are read at a move of the parameters too, not only at the current values."""
    torch.manual_seed(0)
    cell = GatedDecayCell()
    est = DiagonalRTRL(cell)
    lr = 0.2
    for update in range(3):
        xs, cots = sequence(10 + update)
        got, expected = online(est, xs, cots), bptt(cell, xs, cots)
        after = f"after {update} updates"
        torch.testing.assert_close(ref.flatten_dict(got, cell), expected, rtol=1e-10, atol=1e-12, msg=after)
        if update > 0:  # w's gradient is zero before v moves, nonzero after
            assert expected[:HIDDEN].abs().min() > 1e-6
        with torch.no_grad():
            for name, p in cell.named_parameters():
                p -= lr * got[name]
