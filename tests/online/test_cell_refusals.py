"""Which cells each estimator takes: a refusal gives the real reason and names the estimators that can train the
cell, and that list is exactly the estimators that construct on it (each estimator's own check, asked in one
place)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import (
    KFRTRL,
    RFLO,
    RTRL,
    UORO,
    DiagonalRTRL,
    GRUCell,
    InfluenceBalancingCell,
    LinearRecurrentUnit,
    ModReLURNNCell,
    SnAp,
    TanhRNNCell,
    TruncatedBPTT,
)
from lightning_ortho.online import estimator as estimator_module

DTYPE = torch.float64

#: Every estimator, built with the options it needs.
BUILDERS = {
    "DiagonalRTRL": DiagonalRTRL,
    "KFRTRL": lambda cell: KFRTRL(cell, generator=0),
    "RFLO": lambda cell: RFLO(cell, tau=2.0),
    "RTRL": RTRL,
    "SnAp": SnAp,
    "TruncatedBPTT": lambda cell: TruncatedBPTT(cell, k=2),
    "UORO": lambda cell: UORO(cell, generator=0),
}
REAL_STATE = [name for name in BUILDERS if name != "DiagonalRTRL"]
LRU_TRAINERS = (
    "Estimators that can train LinearRecurrentUnit: DiagonalRTRL (OnlineRNNModule's estimator='diagonal_rtrl')."
)


class DenseComplexCell(nn.Module):
    """``h' = A h + B x`` with a dense complex ``A``: a complex state that no estimator of the package trains (the
    real-state ones refuse a complex state; DiagonalRTRL needs a diagonal ``A``)."""

    complex_state = True

    def __init__(self, input_size: int = 2, hidden_size: int = 3) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.a_re = nn.Parameter(0.4 * torch.randn(hidden_size, hidden_size))
        self.a_im = nn.Parameter(0.4 * torch.randn(hidden_size, hidden_size))
        self.b = nn.Parameter(torch.randn(hidden_size, input_size) / math.sqrt(input_size))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return h @ torch.complex(self.a_re, self.a_im).T + (x @ self.b.T).to(h.dtype)


class UndeclaredComplexCell(nn.Module):
    """Returns a complex state from a real one without saying so (no ``complex_state``)."""

    def __init__(self) -> None:
        super().__init__()
        self.input_size, self.hidden_size = 2, 3
        self.weight = nn.Parameter(torch.randn(3, 2))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.complex(h + x @ self.weight.T, h)


class HalfLeakyTanh(TanhRNNCell):
    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * h + 0.5 * super().forward(x, h)


CELLS = {
    "tanh": lambda: TanhRNNCell(2, 3),
    "gru": lambda: GRUCell(2, 3),
    "modrelu": lambda: ModReLURNNCell(2, 3),
    "influence": lambda: InfluenceBalancingCell(units=4, positive=2, input_size=2),
    "ortho": lambda: OrthogonalRNNCell(2, 3, transition="cayley"),
    "half-leaky": lambda: HalfLeakyTanh(2, 3),
    "lru": lambda: LinearRecurrentUnit(2, 3),
    "dense-complex": lambda: DenseComplexCell(),
}


def make(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return CELLS[kind]().to(DTYPE)


# -- the linear recurrent unit and other complex states -----------------------------------------------------------
@pytest.mark.parametrize("name", REAL_STATE)
def test_every_estimator_of_real_states_refuses_the_lru_naming_diagonal_rtrl(name):
    with pytest.raises(ValueError) as info:
        BUILDERS[name](make("lru"))
    message = str(info.value)
    assert message.startswith(f"{name}: the state of LinearRecurrentUnit is complex (complex_state = True)"), message
    assert message.endswith(LRU_TRAINERS), message
    assert "convert it with .float()" not in message and "jacrev" not in message


def test_diagonal_rtrl_takes_the_lru():
    cell = make("lru")
    estimator = DiagonalRTRL(cell)
    state = estimator.initial_state(torch.zeros(2, 3, dtype=torch.complex128))
    h, state = estimator.step(torch.randn(2, 2, dtype=DTYPE), state)
    assert h.dtype == torch.complex128 and state.step == 1


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_complex_cell_that_no_estimator_trains_is_refused_by_all_saying_so(name):
    with pytest.raises(ValueError) as info:
        BUILDERS[name](make("dense-complex"))
    message = str(info.value)
    assert message.endswith("No estimator of lightning_ortho.online can train DenseComplexCell."), message
    reason = (
        "does not declare a diagonal recurrence"
        if name == "DiagonalRTRL"
        else "the state of DenseComplexCell is complex"
    )
    assert reason in message


def test_a_complex_h0_for_an_estimator_of_real_states_names_the_cause():
    estimator = UORO(make("tanh"), generator=0)
    with pytest.raises(ValueError, match="h0 is torch.complex128, but UORO takes real states.*DiagonalRTRL trains"):
        estimator.initial_state(torch.zeros(2, 3, dtype=torch.complex128))


def test_a_step_that_turns_the_state_complex_is_refused_at_the_step():
    cell = UndeclaredComplexCell().to(DTYPE)
    estimator = RTRL(cell)
    state = estimator.initial_state(torch.zeros(2, 3, dtype=DTYPE))
    with pytest.raises(ValueError, match="returned torch.complex128 states from h of torch.float64.*complex_state"):
        estimator.step(torch.zeros(2, 2, dtype=DTYPE), state)


# -- the list in a refusal is computed from the estimators' own checks -------------------------------------------
@pytest.mark.parametrize("kind", list(CELLS))
def test_a_refusal_names_exactly_the_estimators_that_construct_on_the_cell(kind):
    outcomes = {}
    for name, build in BUILDERS.items():
        try:
            build(make(kind))
            outcomes[name] = None
        except ValueError as error:
            outcomes[name] = str(error)
    takes = sorted(name for name, error in outcomes.items() if error is None)
    found = [cls.__name__ for cls in estimator_module.estimators_for(make(kind))]
    assert found == takes
    for error in outcomes.values():
        if error is None:
            continue
        if takes:
            assert f"Estimators that can train {type(make(kind)).__name__}: {', '.join(takes)} (" in error, error
        else:
            assert "No estimator of lightning_ortho.online can train" in error, error


def test_kf_rtrl_names_the_estimators_that_take_a_gru():
    with pytest.raises(ValueError) as info:
        KFRTRL(make("gru"), generator=0)
    message = str(info.value)
    assert (
        "GRUCell has no z = W a factorisation: it lacks preactivation(), activation(), preactivation_input(),"
        " preactivation_weights" in message
    )
    assert message.endswith(
        "Estimators that can train GRUCell: RFLO, RTRL, SnAp, TruncatedBPTT, UORO"
        " (OnlineRNNModule's estimator='rflo' | 'rtrl' | 'snap' | 'tbptt' | 'uoro')."
    )


def test_a_cell_without_parameters_is_refused_by_every_estimator():
    class Free(nn.Module):
        input_size, hidden_size = 2, 3

        def forward(self, x, h):
            return torch.tanh(h)

    assert estimator_module.estimators_for(Free()) == ()
