"""compress_linear(family="shear") reports its block choices as the B and M learners do: the S-DLA learner calls
on_step after each greedy pick and each sweep re-pick, so its bar moves, its time is estimated and a long run warns."""

import logging
import warnings
from types import SimpleNamespace

import pytest

from lightning_ortho.transforms import compression, progress, s_dla
from lightning_ortho.transforms.compression import compress_linear
from tests.transforms.test_compression_progress import LOGGER, FakeClock, counting, layer


def test_shear_steps_are_its_block_choices_and_its_time_is_estimated(monkeypatch, caplog):
    picks = counting(monkeypatch, s_dla, "_pick")  # one call per greedy pick and per sweep re-pick
    with caplog.at_level(logging.INFO, logger=LOGGER):
        module = compress_linear(layer(), "shear", s=3, m=6, iterations=2, progress=False)
    assert len(picks) == 18 == module.report.planned_steps == module.report.steps  # m (1 greedy + 2 sweeps)
    estimates = [r.getMessage() for r in caplog.records if "per data pass" in r.getMessage()]
    assert len(estimates) == 2 and "provisional" in estimates[0] and "provisional" not in estimates[1]
    assert "greedy" in estimates[1] and "sweep" in estimates[1] and module.report.estimated_seconds > 0
    assert "about" in estimates[1] and "at most" not in estimates[1]  # S-DLA without tol runs every sweep


def test_the_shear_plan_runs_every_sweep():
    plan = compression.plan_work("shear", 10, None, 5)
    assert [(s.kind, s.steps, s.weight) for s in plan.segments] == [("greedy", 10, 1.0)] + [("sweep", 10, 1.0)] * 5
    assert not plan.may_stop_early


def timed_shear_learner(monkeypatch, greedy_pick, sweep_pick, data_pass):
    """Make the S-DLA learner's work take fake seconds: each greedy pick, sweep re-pick and pass over the data."""
    clock, phase = FakeClock(), ["greedy"]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=clock))

    def in_phase(name, function):
        def wrapper(*args, **kwargs):
            phase[0] = name
            return function(*args, **kwargs)

        return wrapper

    def pick(*args, **kwargs):
        clock.now += greedy_pick if phase[0] == "greedy" else sweep_pick
        return original_pick(*args, **kwargs)

    def encode(self, data):
        clock.now += data_pass
        return original_encode(self, data)

    original_pick, original_encode = s_dla._pick, s_dla.ShearTransformLearner.encode
    monkeypatch.setattr(s_dla, "shear_greedy_init", in_phase("greedy", s_dla.shear_greedy_init))
    monkeypatch.setattr(s_dla, "shear_sweep", in_phase("sweep", s_dla.shear_sweep))
    monkeypatch.setattr(s_dla, "_pick", pick)
    monkeypatch.setattr(s_dla.ShearTransformLearner, "encode", encode)
    return clock


def test_slow_shear_sweeps_warn_with_the_time_they_take(monkeypatch):
    # 10 greedy picks of 0.01 s, then 5 sweeps of 10 re-picks of 1 s, a 0.2 s pass before each. Timed 4 re-picks
    # into sweep 1 (2 passes + 0.1 s + a pass + 4 s = 4.7 s): 6 re-picks left, 4 sweeps of 0.2 + 10 s, 2 passes
    # after: 51.9 s (every sweep runs: no "up to").
    clock = timed_shear_learner(monkeypatch, greedy_pick=0.01, sweep_pick=1.0, data_pass=0.2)
    monkeypatch.setattr(compression, "SLOW_SECONDS", 20.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = compress_linear(layer(), "shear", s=3, m=10, iterations=5, progress=False)
    (message,) = [str(w.message) for w in caught if "will take" in str(w.message)]
    assert "learning the 'shear' transform" in message and "will take about 52 s" in message, message
    assert "greedy 0.01 s" in message and "sweep 1 s" in message and "stops early" not in message
    assert module.report.estimated_seconds == pytest.approx(51.9)
    assert clock.now == pytest.approx(51.7)  # one pass fewer than planned: the final codes are not a timed pass
