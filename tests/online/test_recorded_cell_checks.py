"""A step that records its NaN/inf verdict (``check_every != 1``) runs the cell without the layers' own checks: the
record covers the cell's output, the step reads nothing on the host, and the error comes from ``check`` with the
step where NaN first appeared."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.nn._checks import finite_checks_enabled
from lightning_ortho.online import RTRL, TruncatedBPTT
from tests.sync_counter import HostSyncCounter


def _nan_after_the_first_step(estimator_type, **options):
    """An estimator on an orthogonal cell whose bias turns NaN after step 1, its state after step 1, and inputs."""
    torch.manual_seed(0)
    cell = OrthogonalRNNCell(3, 4).double()
    estimator = estimator_type(cell, **options)
    estimator.check_every = None
    xs = torch.randn(3, 2, 3, dtype=torch.float64)
    _, state = estimator.step(xs[0], estimator.initial_state(torch.zeros(2, 4, dtype=torch.float64)))
    with torch.no_grad():
        cell.bias[0] = float("nan")
    return estimator, state, xs


@pytest.mark.parametrize(("estimator_type", "options"), [(RTRL, {}), (TruncatedBPTT, {"k": 3})])
def test_nan_in_the_cell_is_recorded_not_raised_by_its_layers(estimator_type, options):
    estimator, state, xs = _nan_after_the_first_step(estimator_type, **options)
    grad_h = torch.ones(2, 4, dtype=torch.float64)
    with HostSyncCounter() as counter:
        for x in xs[1:]:  # step 2 makes NaN states; step 3 feeds them to the transition's reflection
            _, state = estimator.step(x, state)
            estimator.gradient(state, grad_h)  # TruncatedBPTT's replays the cell too
    assert counter.reads == []
    with pytest.raises(FloatingPointError, match=r"the cell produced NaN/inf states at step 2"):
        estimator.check(state)


def test_the_layers_check_again_after_a_recording_step():
    estimator, state, xs = _nan_after_the_first_step(RTRL)
    estimator.step(xs[1], state)
    assert finite_checks_enabled()


def test_a_step_that_reads_at_once_keeps_the_layers_checks(monkeypatch):
    torch.manual_seed(0)
    cell = OrthogonalRNNCell(3, 4).double()
    estimator = RTRL(cell, closed_form=False)  # check_every = 1; the generic products call forward
    seen = []
    forward = cell.forward

    def spy(x, h):
        seen.append(finite_checks_enabled())
        return forward(x, h)

    monkeypatch.setattr(cell, "forward", spy)
    estimator.step(torch.randn(2, 3, dtype=torch.float64), estimator.initial_state(torch.zeros(2, 4).double()))
    estimator.check_every = 2
    estimator.step(torch.randn(2, 3, dtype=torch.float64), estimator.initial_state(torch.zeros(2, 4).double()))
    assert seen and seen[0] is True and seen[-1] is False
