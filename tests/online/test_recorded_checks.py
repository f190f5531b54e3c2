"""NaN/inf checks recorded on the device (``check_every != 1``) and read by ``check``: the error names the step
and the tensor where NaN/inf first appeared, as the checks read at every call do."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.online import RFLO, RTRL, DiagonalRTRL, LinearRecurrentUnit, SnAp, TanhRNNCell
from lightning_ortho.online.health import read_failure

INPUT, HIDDEN, STREAMS = 3, 4, 2

ESTIMATORS = {
    "rtrl": lambda: RTRL(TanhRNNCell(INPUT, HIDDEN).double()),
    "rflo": lambda: RFLO(TanhRNNCell(INPUT, HIDDEN).double(), tau=2.0),
    "snap-1": lambda: SnAp(TanhRNNCell(INPUT, HIDDEN).double(), order=1),
    "diagonal_rtrl": lambda: DiagonalRTRL(LinearRecurrentUnit(INPUT, HIDDEN).double()),
}


def start(name: str, check_every):
    torch.manual_seed(0)
    estimator = ESTIMATORS[name]()
    estimator.check_every = check_every
    state = estimator.initial_state(torch.zeros(STREAMS, HIDDEN, dtype=torch.float64))
    return estimator, state


def inputs(steps: int, nan_at: int | None = None) -> torch.Tensor:
    xs = torch.randn(steps, STREAMS, INPUT, dtype=torch.float64)
    if nan_at is not None:
        xs[nan_at - 1, 1, 0] = float("nan")  # step s reads xs[s - 1]
    return xs


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_a_nan_input_is_recorded_and_named_with_its_step(name):
    estimator, state = start(name, None)
    for x in inputs(6, nan_at=3):  # no error while recording: the NaN spreads into later steps
        _, state = estimator.step(x, state)
    with pytest.raises(ValueError, match=r"step: x held NaN or inf values at step 3\b"):
        estimator.check(state)


@pytest.mark.parametrize("name", ["rtrl", "rflo", "snap-1"])
def test_a_diverged_parameter_is_named_with_the_step(name):
    estimator, state = start(name, None)
    xs = inputs(5)
    for t in range(2):
        _, state = estimator.step(xs[t], state)
    with torch.no_grad():
        estimator.cell.weight_hh[0, 0] = float("nan")  # a diverged update: the state is NaN from step 3 on
    for t in range(2, 5):
        _, state = estimator.step(xs[t], state)
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 3\b.*weight_hh"):
        estimator.check(state)


def test_a_nan_grad_h_is_recorded_by_gradient_with_its_step():
    estimator, state = start("rtrl", None)
    xs = inputs(4)
    for t in range(4):
        _, state = estimator.step(xs[t], state)
        grad_h = torch.ones(STREAMS, HIDDEN, dtype=torch.float64)
        if t == 2:
            grad_h[0, 1] = float("inf")
        estimator.gradient(state, grad_h)  # no error while recording
    with pytest.raises(ValueError, match=r"grad_h held NaN or inf values at step 3\b"):
        estimator.check(state)


def test_only_the_first_failure_is_kept():
    estimator, state = start("rflo", None)
    xs = inputs(6, nan_at=4)
    xs[1, 0, 0] = float("inf")  # step 2 fails first
    for x in xs:
        _, state = estimator.step(x, state)
    assert read_failure(state.health)[0] == 2


def test_check_every_k_reads_at_every_kth_step():
    estimator, state = start("rtrl", 3)
    xs = inputs(6, nan_at=4)
    for t in range(5):  # steps 1..5: the record is read at step 3 (clean), then next at step 6
        _, state = estimator.step(xs[t], state)
    with pytest.raises(ValueError, match=r"at step 4\b"):
        estimator.step(xs[5], state)


def test_check_every_1_raises_at_the_step_itself():
    estimator, state = start("rtrl", 1)
    xs = inputs(3, nan_at=2)
    _, state = estimator.step(xs[0], state)
    with pytest.raises(ValueError, match="x holds NaN or inf"):
        estimator.step(xs[1], state)


def test_a_clean_run_checks_clean_and_finite_entries_whose_sum_overflows_are_no_failure():
    estimator, state = start("rflo", None)
    for x in inputs(4):
        _, state = estimator.step(x, state)
    big = torch.full((STREAMS, HIDDEN), torch.finfo(torch.float64).max / 2, dtype=torch.float64)
    estimator.gradient(state, big)  # every entry finite; their sum is not
    estimator.check(state)  # nothing recorded
    assert read_failure(state.health) is None


def test_the_record_travels_with_the_state_dict():
    estimator, state = start("rtrl", None)
    for x in inputs(3, nan_at=2):
        _, state = estimator.step(x, state)
    saved = state.state_dict()
    assert read_failure(saved["health"]) is not None
    fresh = estimator.initial_state(torch.zeros(STREAMS, HIDDEN, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN/inf"):  # a diverged state cannot be loaded at all
        fresh.load_state_dict(saved)
    clean_estimator, clean = start("rtrl", None)
    for x in inputs(2):
        _, clean = clean_estimator.step(x, clean)
    old = clean.state_dict()
    del old["health"]  # saved before records existed
    fresh.health[0] = 7  # whatever it held: a state without a record loads as clean
    fresh.load_state_dict(old)
    assert read_failure(fresh.health) is None
    bad = clean.state_dict()
    bad["health"] = torch.zeros(2)
    with pytest.raises(ValueError, match="int64 \\(3,\\) record"):
        fresh.load_state_dict(bad)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1"])
def test_check_every_must_be_a_positive_int_or_none(value):
    estimator, _ = start("rtrl", None)
    with pytest.raises(ValueError, match="check_every must be a positive int"):
        estimator.check_every = value


def test_a_compiled_step_records_and_check_reads_afterwards():
    estimator, state = start("rflo", 1)  # check_every=1, but a compiled region cannot read: it records

    def step(x, state):
        return estimator.step(x, state)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=False)
    for x in inputs(4, nan_at=2):
        _, state = compiled(x, state)
    with pytest.raises(ValueError, match=r"x held NaN or inf values at step 2\b"):
        estimator.check(state)
