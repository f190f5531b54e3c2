"""Bad inputs to the online estimators are clear errors that name the argument and what to do, for every kind."""

import pytest
import torch
from torch import nn

from lightning_ortho.online import RTRL, UORO, TanhRNNCell, TruncatedBPTT

DTYPE = torch.float64
B, INPUT, HIDDEN = 2, 2, 3

ESTIMATORS = {
    "rtrl": lambda cell: RTRL(cell),
    "tbptt": lambda cell: TruncatedBPTT(cell, 3),
    "uoro-state-gir": lambda cell: UORO(cell, generator=0),
    "uoro-preactivation": lambda cell: UORO(cell, projection="preactivation", generator=0),
    "uoro-parameter-fixed": lambda cell: UORO(cell, projection="parameter", rescaling=(0.5, None), generator=0),
    "uoro-none": lambda cell: UORO(cell, projection="none", generator=0),
}
KINDS = list(ESTIMATORS)


def make(kind):
    torch.manual_seed(0)
    cell = TanhRNNCell(INPUT, HIDDEN).to(DTYPE)
    return cell, ESTIMATORS[kind](cell)


def started(kind, steps=2):
    cell, est = make(kind)
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    for _ in range(steps):
        _, state = est.step(torch.randn(B, INPUT, dtype=DTYPE), state)
    return cell, est, state


@pytest.mark.parametrize("kind", KINDS)
def test_zero_streams_are_refused_at_initial_state(kind):
    _, est = make(kind)
    with pytest.raises(ValueError, match=r"initial_state: h0 must have shape \(streams >= 1, 3\).*got \(0, 3\)"):
        est.initial_state(torch.zeros(0, HIDDEN, dtype=DTYPE))


@pytest.mark.parametrize("kind", KINDS)
def test_h0_of_another_hidden_size_is_refused_at_initial_state(kind):
    _, est = make(kind)
    with pytest.raises(ValueError, match=r"h0 must have shape \(streams >= 1, 3\).*got \(2, 4\).*cell.hidden_size"):
        est.initial_state(torch.zeros(B, HIDDEN + 1, dtype=DTYPE))


@pytest.mark.parametrize("kind", KINDS)
def test_x_of_another_width_is_refused_at_step(kind):
    _, est, state = started(kind, steps=0)
    with pytest.raises(ValueError, match=r"step: x must have shape \(2, 2\) \(streams, the cell's input_size\).*"):
        est.step(torch.zeros(B, INPUT + 3, dtype=DTYPE), state)


class _PlainCell(nn.Module):
    """A cell that declares neither input_size nor hidden_size (any nn.Module with cell(x, h) is allowed)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(HIDDEN, HIDDEN + INPUT, dtype=DTYPE))

    def forward(self, x, h):
        return torch.tanh(torch.cat([h, x], 1)[:, : HIDDEN + INPUT] @ self.weight.T)


@pytest.mark.parametrize("kind", ["rtrl", "tbptt", "uoro-state-gir", "uoro-parameter-fixed"])
def test_a_cell_that_returns_another_shape_than_h0_is_a_clear_error(kind):
    # Without a declared hidden_size the mismatch shows in the first step: the cell maps (B, 4) to (B, 3).
    est = ESTIMATORS[kind](_PlainCell())
    state = est.initial_state(torch.zeros(B, HIDDEN + 1, dtype=DTYPE))
    with pytest.raises(ValueError, match=r"the cell returned shape \(2, 3\) from h of shape \(2, 4\)"):
        est.step(torch.zeros(B, INPUT, dtype=DTYPE), state)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_reset_to_a_nan_or_inf_state_is_refused(kind, bad):
    _, est, state = started(kind)
    h0 = torch.zeros(HIDDEN, dtype=DTYPE)
    h0[1] = bad
    with pytest.raises(ValueError, match=r"reset: h0 holds NaN or inf values"):
        est.reset(state, torch.tensor([True, False]), h0)
    with pytest.raises(ValueError, match=r"reset: h0 must be floating point, got torch.int64"):
        est.reset(state, torch.tensor([True, False]), torch.zeros(HIDDEN, dtype=torch.long))


@pytest.mark.parametrize("projection, size", [("state", HIDDEN), ("preactivation", HIDDEN), ("parameter", 18)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_q0_with_nan_or_inf_is_refused(projection, size, bad):
    cell = TanhRNNCell(INPUT, HIDDEN).to(DTYPE)
    q0 = torch.eye(size, dtype=DTYPE)
    q0[0, 1] = bad
    with pytest.raises(ValueError, match=r"Q0 must be a finite floating-point matrix, got torch.float64 with 1 NaN"):
        UORO(cell, projection=projection, rescaling=(1.0, q0))


@pytest.mark.parametrize("per_stream", [False, True])
def test_truncated_bptt_gradient_with_a_nan_parameter_names_it(per_stream):
    # TruncatedBPTT replays its window with the current parameters (RTRL and UORO read only their state).
    cell, est, state = started("tbptt")
    with torch.no_grad():
        cell.weight_hh[0, 1] = float("nan")
    with pytest.raises(FloatingPointError, match=r"gradient: the estimate holds NaN/inf.*\['weight_hh'\] hold NaN"):
        est.gradient(state, torch.ones(B, HIDDEN, dtype=DTYPE), per_stream=per_stream)


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_with_a_nan_parameter_names_it_instead_of_blaming_the_learning_rate(kind):
    cell, est, state = started(kind)
    with torch.no_grad():
        cell.bias[2] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 3: the cell's parameters \['bias'\] hold"):
        est.step(torch.zeros(B, INPUT, dtype=DTYPE), state)


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_with_nan_grad_h_still_names_grad_h(kind):
    _, est, state = started(kind)
    grad_h = torch.ones(B, HIDDEN, dtype=DTYPE)
    grad_h[1, 0] = float("nan")
    with pytest.raises(ValueError, match="grad_h holds NaN or inf values"):
        est.gradient(state, grad_h)
