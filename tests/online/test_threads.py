"""Every estimator runs its step and gradient on one CPU thread for small cells (num_threads="auto"), gives the
process its count back (also after an error), and leaves a count that the user chose."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho._native import native_kernels
from lightning_ortho.online import RTRL, UORO, TanhRNNCell, TruncatedBPTT, threads

ESTIMATORS = {
    "uoro": lambda cell: UORO(cell, generator=0),  # the fused tanh step
    "uoro-parameter": lambda cell: UORO(cell, projection="parameter", generator=0),
    "rtrl": lambda cell: RTRL(cell),
    "tbptt": lambda cell: TruncatedBPTT(cell, 2),
}
START = 2  # torch's count "at import" in these tests


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """A process that imported the package with torch's count START and no OMP_NUM_THREADS (the suite runs with
    OMP_NUM_THREADS=1, which is a choice "auto" keeps)."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_START_COUNT", START)
    monkeypatch.setattr(threads, "_ENVIRONMENT_CHOSE", False)
    torch.set_num_threads(START)
    yield
    torch.set_num_threads(before)


def recording(estimator):
    """The thread counts seen inside the estimator's step and gradient calls."""
    seen = []
    for name in ("_step", "_gradient"):
        inner = getattr(estimator, name)

        def wrapped(*args, inner=inner, **kwargs):
            seen.append(torch.get_num_threads())
            return inner(*args, **kwargs)

        setattr(estimator, name, wrapped)
    return seen


def run(estimator, hidden=4, steps=3):
    """Steps and gradients on the PyTorch path: a call that one C call settles (the template's fast lane,
    ``OnlineGradientEstimator._fused_step`` / ``_fused_gradient``) runs outside the call context, on the caller's
    count, and reaches neither ``_step`` nor ``_gradient``."""
    state = estimator.initial_state(torch.zeros(2, hidden))
    with native_kernels(False):
        for _ in range(steps):
            _, state = estimator.step(torch.randn(2, 3), state)
            estimator.gradient(state, torch.randn(2, hidden))
    return state


@pytest.mark.parametrize("kind", list(ESTIMATORS))
def test_auto_runs_every_call_of_a_small_cell_on_one_thread_and_gives_the_count_back(kind):
    estimator = ESTIMATORS[kind](TanhRNNCell(3, 4))
    assert estimator.num_threads == "auto"
    seen = recording(estimator)
    run(estimator)
    assert seen == [1] * 6 and torch.get_num_threads() == START


@pytest.mark.parametrize(
    ("setting", "count", "inside"),
    [("auto", 3, 3), (None, START, START), (3, START, 3), (1, 3, 1)],
    ids=["count-set-after-import", "none", "three", "one"],
)
def test_a_count_the_user_chose_is_kept(setting, count, inside):
    torch.set_num_threads(count)
    estimator = UORO(TanhRNNCell(3, 4), generator=0)
    estimator.num_threads = setting
    seen = recording(estimator)
    run(estimator)
    assert set(seen) == {inside} and torch.get_num_threads() == count


def test_auto_keeps_the_count_of_omp_num_threads(monkeypatch):
    monkeypatch.setattr(threads, "_ENVIRONMENT_CHOSE", True)
    estimator = RTRL(TanhRNNCell(3, 4))
    seen = recording(estimator)
    run(estimator)
    assert set(seen) == {START}


def test_auto_leaves_large_cells_on_torchs_count():
    hidden = threads.AUTO_MAX_HIDDEN + 1
    estimator = UORO(TanhRNNCell(3, hidden), generator=0)
    seen = recording(estimator)
    run(estimator, hidden=hidden, steps=1)
    assert set(seen) == {START}


def test_the_count_is_given_back_when_a_call_raises():
    estimator = UORO(TanhRNNCell(3, 4), generator=0)
    state = estimator.initial_state(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="x holds NaN"):
        estimator.step(torch.full((2, 3), float("nan")), state)
    assert torch.get_num_threads() == START
    with pytest.raises(ValueError, match="grad_h"):
        estimator.gradient(state, torch.zeros(3, 4))
    assert torch.get_num_threads() == START


@pytest.mark.parametrize("value", [0, -2, "one", 1.5, True])
def test_a_bad_num_threads_is_refused_naming_the_estimator(value):
    estimator = RTRL(TanhRNNCell(3, 4))
    with pytest.raises(ValueError, match="RTRL: num_threads must be 'auto'"):
        estimator.num_threads = value
