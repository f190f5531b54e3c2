"""compress_linear announces its work before learning (planned block choices / stages, then a time estimate) and
shows a rich progress bar only where asked (or on a terminal)."""

import io
import logging

import pytest
import torch
from rich.console import Console
from torch import nn

from lightning_ortho.transforms import b_dla, compression, m_dla
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
    picks = counting(monkeypatch, b_dla, "best_block")  # one call per block choice (eq. 10)
    announced = []
    # iterations=2 sweeps: the stopping rule needs 3 sweeps, so every planned choice is made
    monkeypatch.setattr(b_dla, "greedy_init", _after_announcement(b_dla.greedy_init, caplog, announced))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        module = compress_linear(layer(), s=3, m=10, iterations=2, progress=False)
    assert announced == ["compress_linear: 12x16 layer, family 'b': up to 30 block choices."]
    assert len(picks) == 30 == module.report.planned_steps == module.report.steps  # m (1 greedy + 2 sweeps)
    (estimate,) = [r.getMessage() for r in caplog.records if "s per step" in r.getMessage()]
    seconds, per_step = (float(part.split(" s")[0]) for part in estimate.split("about ")[1].split("("))
    assert 0 < 0.99 * 28 * per_step <= seconds < 60  # set-up and 2 steps timed, 28 more at the measured pace


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
    with pytest.warns(UserWarning, match=r"will take about .*\(30 block choices at .* s each.*Lower m"):
        compress_linear(layer(), s=3, m=10, iterations=2, progress=False)


def test_progress_false_and_auto_off_a_terminal_draw_nothing_and_true_draws_a_bar(capsys):
    for progress in (False, None):  # None: auto, and a file is no terminal
        buffer = io.StringIO()
        compress_linear(layer(), s=3, m=10, iterations=2, progress=progress, console=Console(file=buffer))
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
