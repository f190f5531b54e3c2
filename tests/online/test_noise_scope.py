"""The randomised estimators' noise under ``torch.compile``: ``noise_scope`` makes compiled calls draw the state's own
numbers (those of the eager run), leaves the state's generator where the eager run leaves it (so a checkpoint resumes
exactly) and gives the default generator its own state back; and the rows of a split state are decided when it is
made, so its steps read nothing on the host."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.online import KFRTRL, UORO, TanhRNNCell
from tests.sync_counter import HostSyncCounter

INPUT, HIDDEN, STREAMS, STEPS = 3, 4, 2, 4

ESTIMATORS = {
    "uoro-fused": lambda cell: UORO(cell, generator=5),
    "uoro-unfused": lambda cell: UORO(cell, generator=5, fused=False),
    "kf_rtrl": lambda cell: KFRTRL(cell, generator=5),
}


def _data():
    with torch.random.fork_rng(devices=[]):  # the default generator is left as it was (the tests watch it)
        torch.manual_seed(0)
        cell = TanhRNNCell(INPUT, HIDDEN).double()
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, STREAMS, INPUT, generator=g, dtype=torch.float64)
    grad_hs = torch.randn(STEPS, STREAMS, HIDDEN, generator=g, dtype=torch.float64)
    return cell, xs, grad_hs


def _step_and_gradient(estimator, x, state, grad_h):
    h, state = estimator.step(x, state)
    return h, state, estimator.gradient(state, grad_h)


def _run(name, call, scoped):
    cell, xs, grad_hs = _data()
    estimator = ESTIMATORS[name](cell)
    estimator.check_every = None
    state = estimator.initial_state(torch.zeros(STREAMS, HIDDEN, dtype=torch.float64))
    out = []
    scope = estimator.noise_scope(state) if scoped else None
    if scope is not None:
        scope.__enter__()
    try:
        for t in range(STEPS):
            h, state, grads = call(estimator, xs[t], state, grad_hs[t])
            out.append(torch.cat([h.flatten(), *(v.flatten() for v in grads.values())]))
    finally:
        if scope is not None:
            scope.__exit__(None, None, None)
    estimator.check(state)
    return torch.stack(out), state


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_compiled_run_in_the_scope_draws_the_eager_noise_and_leaves_the_generators_as_eager(name):
    torch.manual_seed(123)
    default_before = torch.default_generator.get_state()
    eager, eager_state = _run(name, _step_and_gradient, scoped=False)
    assert torch.equal(torch.default_generator.get_state(), default_before)  # eager draws from the state's own
    torch._dynamo.reset()
    compiled_call = torch.compile(_step_and_gradient, fullgraph=True, backend="aot_eager", dynamic=False)
    compiled, compiled_state = _run(name, compiled_call, scoped=True)
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    # the state's generator stands where the eager run left it: a checkpoint resumes the same noise
    assert torch.equal(compiled_state.generator.get_state(), eager_state.generator.get_state())
    assert torch.equal(torch.default_generator.get_state(), default_before)  # given back its own state


@pytest.mark.parametrize("name", ESTIMATORS)
def test_eager_calls_inside_the_scope_draw_what_they_draw_outside(name):
    plain, plain_state = _run(name, _step_and_gradient, scoped=False)
    scoped, scoped_state = _run(name, _step_and_gradient, scoped=True)
    assert torch.equal(scoped, plain)
    assert torch.equal(scoped_state.generator.get_state(), plain_state.generator.get_state())


def test_the_scope_draws_from_the_default_generator_and_restores_it_after_an_error():
    cell, xs, _ = _data()
    estimator = UORO(cell, generator=5)
    state = estimator.initial_state(torch.zeros(STREAMS, HIDDEN, dtype=torch.float64))
    own = state.generator.get_state()
    torch.manual_seed(7)
    default_before = torch.default_generator.get_state()
    with pytest.raises(RuntimeError, match="boom"), estimator.noise_scope(state):
        # inside, the default generator holds the state's stream: its next draw is the state's next draw
        assert torch.equal(torch.default_generator.get_state(), own)
        estimator.step(xs[0], state)
        raise RuntimeError("boom")
    assert torch.equal(torch.default_generator.get_state(), default_before)
    assert not torch.equal(state.generator.get_state(), own)  # the step's draws were taken from the stream


def test_the_scope_refuses_a_state_without_a_generator():
    cell, _, _ = _data()
    estimator = UORO(cell, generator=5)
    state = estimator.initial_state(torch.zeros(STREAMS, HIDDEN, dtype=torch.float64))
    state.generator = None
    with pytest.raises(ValueError, match="no noise generator"), estimator.noise_scope(state):
        pass


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_split_state_steps_without_host_reads_and_draws_its_rows_of_the_whole_draw(name):
    """Streams 3 and 1 of 4 (as one DDP process holds them) draw rows 3 and 1 of the 4-stream run's noise, with no
    host read after the state is made; a state loaded from a checkpoint (new tensors) is read once, then none."""
    cell, xs, grad_hs = _data()
    whole = ESTIMATORS[name](cell)
    split = ESTIMATORS[name](cell)
    whole.check_every = split.check_every = None
    x4 = torch.cat([xs, xs.flip(-1)], 1)  # (STEPS, 4, INPUT)
    rows = torch.tensor([3, 1])
    state = whole.initial_state(torch.zeros(4, HIDDEN, dtype=torch.float64))
    part = split.initial_state(torch.zeros(2, HIDDEN, dtype=torch.float64), stream_ids=rows, total_streams=4)
    key = "w_tilde" if isinstance(whole, UORO) else "hidden_factor"
    for t in range(STEPS - 1):
        h, state = whole.step(x4[t], state)
        with HostSyncCounter() as counter:
            h_part, part = split.step(x4[t][rows], part)
        assert counter.reads == []
        torch.testing.assert_close(h_part, h[rows], rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(part.tensors[key], state.tensors[key][rows], rtol=1e-13, atol=1e-14)
    loaded = split.initial_state(torch.zeros(2, HIDDEN, dtype=torch.float64), stream_ids=rows, total_streams=4)
    loaded.load_state_dict(part.state_dict())
    with HostSyncCounter() as counter:
        split.step(x4[-1][rows], loaded)
    assert counter.reads  # the loaded entries are new tensors: their rows are read once ...
    with HostSyncCounter() as counter:
        _, again = split.step(x4[-1][rows], loaded)
        split.step(x4[-1][rows], again)
    assert counter.reads == []  # ... and kept
