"""compress_linear announces its work before learning (planned block choices / stages, then a time estimate) and
shows a rich progress bar only where asked (or on a terminal). Every learner (B, M and S-DLA) reports its steps."""

import io
import logging
import warnings
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from torch import nn

from lightning_ortho.transforms import b_dla, compression, m_dla, progress, s_dla
from lightning_ortho.transforms.compression import compress_linear

LOGGER = "lightning_ortho.transforms.compression"


def layer(out=12, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(n, out).double()
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out, n, generator=g, dtype=torch.float64))
    return linear


def counting(monkeypatch, module, name):
    """Wrap ``module.name`` to count its calls (the learner's own unit of work)."""
    calls, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_the_planned_block_choices_are_announced_before_learning_and_are_those_made(monkeypatch, caplog):
    picks = counting(monkeypatch, b_dla, "_choose")  # one call per block choice (eq. 10)
    announced = []
    # iterations=2 sweeps: the stopping rule needs 3 sweeps, so every planned choice is made
    monkeypatch.setattr(b_dla, "greedy_init", _after_announcement(b_dla.greedy_init, caplog, announced))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        module = compress_linear(layer(), s=3, m=10, iterations=2, progress=False)
    assert announced == ["compress_linear: 12x16 layer, family 'b': up to 30 block choices."]
    assert len(picks) == 30 == module.report.planned_steps == module.report.steps  # m (1 greedy + 2 sweeps)
    estimates = [r.getMessage() for r in caplog.records if "per data pass" in r.getMessage()]
    assert len(estimates) == 2 and "provisional" in estimates[0] and "provisional" not in estimates[1]
    assert "greedy" in estimates[1] and "sweep" in estimates[1] and module.report.estimated_seconds > 0


def _after_announcement(function, caplog, announced):
    """Record what was logged before the first block is chosen."""

    def wrapper(*args, **kwargs):
        announced.extend(r.getMessage() for r in caplog.records if "up to" in r.getMessage())
        return function(*args, **kwargs)

    return wrapper


def test_m_transform_steps_are_its_stages(monkeypatch, caplog):
    stages = counting(monkeypatch, m_dla, "m_stage_from_cross")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        module = compress_linear(layer(), "m", s=3, q=3, iterations=2, progress=False)
    assert len(stages) == 6 == module.report.planned_steps == module.report.steps  # q rounds matchings
    assert any("up to 6 stages" in r.getMessage() for r in caplog.records)


def test_a_long_estimate_warns(monkeypatch):
    monkeypatch.setattr(compression, "SLOW_SECONDS", 0.0)
    with pytest.warns(UserWarning, match=r"will take at least .*\(30 block choices; per step: greedy .*Lower m"):
        compress_linear(layer(), s=3, m=10, iterations=2, progress=False)


def test_progress_false_and_auto_off_a_terminal_draw_nothing_and_true_draws_a_bar(capsys):
    for setting in (False, None):  # None: auto, and a file is no terminal
        buffer = io.StringIO()
        compress_linear(layer(), s=3, m=10, iterations=2, progress=setting, console=Console(file=buffer))
        assert buffer.getvalue() == ""
    buffer = io.StringIO()
    compress_linear(layer(), s=3, m=10, iterations=2, progress=True, console=Console(file=buffer, width=120))
    drawn = buffer.getvalue()
    assert "compress 12x16 (b)" in drawn and "30/30 block choices" in drawn and "━" in drawn
    assert capsys.readouterr() == ("", "")  # nothing on the test's own stdout or stderr
    compress_linear(layer(), s=3, m=10, iterations=2)  # the default: auto, and pytest's capture is no terminal
    assert capsys.readouterr() == ("", "")


def test_progress_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        compress_linear(layer(), s=3, m=4, progress="yes")


# ------------------------------------------------------------------------------ the time estimate, on a fake clock
class FakeClock:
    """Seconds that pass only when the test says so (no dependence on the machine's speed)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_estimate_times_each_kind_of_step_and_the_passes_on_their_own():
    clock, seen = FakeClock(), []
    plan = progress.WorkPlan(
        (progress.Segment("greedy", 4), *(progress.Segment("sweep", 4, w) for w in (1.0, 1.0, 2.0))),
        "picks",
        passes_before=2,
        passes_after=1,
        may_stop_early=True,
    )
    # set-up 2 s and two 5 s passes, greedy picks of 1 s, a 5 s pass before each sweep, sweep picks of 0.1 s
    # (twice that in the last, weight 2), a final 5 s pass: 2 + 10 + 4 + 3 * 5 + 0.4 + 0.4 + 0.8 + 5 = 37.6 s.
    with progress.WorkProgress(plan, "test", show=False, on_estimate=seen.append, clock=clock) as work:
        clock.now += 12.0
        for segment in plan.segments:
            for step in range(segment.steps):
                clock.now += (5.0 if step == 0 and segment.kind == "sweep" else 0.0) + (
                    1.0 if segment.kind == "greedy" else 0.1 * segment.weight
                )
                work.advance()
        clock.now += 5.0
    provisional, final = seen
    assert not provisional.final and provisional.step_seconds == {"greedy": pytest.approx(1.0)}
    # after the greedy picks (16 s): sweeps priced as greedy picks, passes as (12 s before the first pick) / 2
    assert provisional.seconds == pytest.approx(16 + (6 + 4) + (6 + 4) + (6 + 8) + 6)
    assert final.final and final.upper_bound
    assert final.step_seconds == {"greedy": pytest.approx(1.0), "sweep": pytest.approx(0.1)}
    assert final.pass_seconds == pytest.approx(5.0) and final.seconds == pytest.approx(37.6)
    assert work.estimated_seconds == pytest.approx(37.6) and clock.now == pytest.approx(37.6)


def test_a_stall_does_not_set_the_pace():
    clock, seen = FakeClock(), []
    with progress.WorkProgress(4, "test", show=False, on_estimate=seen.append, clock=clock) as work:
        for pause in (1.0, 30.0, 1.0, 1.0):  # the second step waited on something else
            clock.now += pause
            work.advance()
    (estimate,) = seen
    assert estimate.step_seconds == {"step": 1.0} and estimate.seconds == pytest.approx(33.0)


def test_the_b_plan_prices_the_sweeps_that_may_widen_and_says_when_it_may_stop_early():
    plan = compression.plan_work("b", 10, None, 5)
    assert [(s.kind, s.steps) for s in plan.segments] == [("greedy", 10)] + [("sweep", 10)] * 5
    assert [s.weight for s in plan.segments[1:]] == [1.0, 1.0, 1.0, 15 / 8, 15 / 8]  # 15 cores instead of 8
    assert plan.may_stop_early and not compression.plan_work("b", 10, None, 3).may_stop_early
    m_plan = compression.plan_work("m", None, 3, 2)
    assert [(s.kind, s.steps) for s in m_plan.segments] == [("stage", 3)] * 2 and not m_plan.may_stop_early


def timed_learner(monkeypatch, greedy_pick, sweep_pick, data_pass, family="b"):
    """Make a learner's work take fake seconds: each greedy pick, sweep re-pick and pass over the data."""
    learner, (init, sweep, pick_name), learner_class = {
        "b": (b_dla, ("greedy_init", "sweep", "_choose"), b_dla.BTransformLearner),
        "shear": (s_dla, ("shear_greedy_init", "shear_sweep", "_pick"), s_dla.ShearTransformLearner),
    }[family]
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

    original_pick, original_encode = getattr(learner, pick_name), learner_class.encode
    monkeypatch.setattr(learner, init, in_phase("greedy", getattr(learner, init)))
    monkeypatch.setattr(learner, sweep, in_phase("sweep", getattr(learner, sweep)))
    monkeypatch.setattr(learner, pick_name, pick)
    monkeypatch.setattr(learner_class, "encode", encode)
    return clock


def compress_and_warnings(**kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = compress_linear(layer(), s=3, m=10, progress=False, **kwargs)
    return module, [str(w.message) for w in caught if "will take" in str(w.message)]


def test_slow_greedy_picks_and_fast_sweeps_do_not_warn(monkeypatch):
    # 10 greedy picks of 1 s, 20 re-picks of 0.01 s, 5 passes of 0.5 s: 12.7 s, under the 20 s threshold (the
    # first pick's pace over all 30 picks would say 30 s).
    clock = timed_learner(monkeypatch, greedy_pick=1.0, sweep_pick=0.01, data_pass=0.5)
    monkeypatch.setattr(compression, "SLOW_SECONDS", 20.0)
    module, messages = compress_and_warnings(iterations=2)
    assert clock.now == pytest.approx(12.7) and not messages
    # the revised estimate: the work done plus the passes still to come (one more than the fake learner pays)
    assert clock.now <= module.report.estimated_seconds <= clock.now + 0.5 + 1e-9


def test_fast_greedy_picks_and_slow_sweeps_warn_with_an_upper_bound(monkeypatch):
    # 10 greedy picks of 0.01 s, then sweeps of 10 re-picks of 1 s: at most 5 sweeps, of which 4 and 5 may widen.
    # Timed 4 re-picks into sweep 1 (2 passes + 0.1 s + a pass + 4 s): 4.7 s, 6 re-picks left, sweeps 2 and 3 at
    # 0.2 + 10 s, sweeps 4 and 5 at 0.2 + 18.75 s (15 / 8 the pick), 2 passes after: 69.4 s at most.
    clock = timed_learner(monkeypatch, greedy_pick=0.01, sweep_pick=1.0, data_pass=0.2)
    monkeypatch.setattr(compression, "SLOW_SECONDS", 20.0)
    module, messages = compress_and_warnings(iterations=5)
    (message,) = messages
    assert "will take up to 69 s" in message and "stops early once converged" in message, message
    assert "greedy 0.01 s" in message and "sweep 1 s" in message and "per data pass 0.2 s" in message
    assert module.report.estimated_seconds == pytest.approx(69.4)
    assert module.report.estimated_seconds >= clock.now  # an upper bound of what it took


# ------------------------------------------------------------------ the shear learner reports its choices too
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


def test_slow_shear_sweeps_warn_with_the_time_they_take(monkeypatch):
    # 10 greedy picks of 0.01 s, then 5 sweeps of 10 re-picks of 1 s, a 0.2 s pass before each. Timed 4 re-picks
    # into sweep 1 (2 passes + 0.1 s + a pass + 4 s = 4.7 s): 6 re-picks left, 4 sweeps of 0.2 + 10 s, 2 passes
    # after: 51.9 s (every sweep runs: no "up to").
    clock = timed_learner(monkeypatch, greedy_pick=0.01, sweep_pick=1.0, data_pass=0.2, family="shear")
    monkeypatch.setattr(compression, "SLOW_SECONDS", 20.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = compress_linear(layer(), "shear", s=3, m=10, iterations=5, progress=False)
    (message,) = [str(w.message) for w in caught if "will take" in str(w.message)]
    assert "learning the 'shear' transform" in message and "will take about 52 s" in message, message
    assert "greedy 0.01 s" in message and "sweep 1 s" in message and "stops early" not in message
    assert module.report.estimated_seconds == pytest.approx(51.9)
    assert clock.now == pytest.approx(51.7)  # one pass fewer than planned: the final codes are not a timed pass
