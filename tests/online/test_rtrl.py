import pytest
import torch

from lightning_ortho.online import RTRL

from . import references as ref
from .references import CELLS, DTYPE

T, B = 6, 2
TOL = dict(rtol=1e-10, atol=1e-10)


def _run(est, xs, h0, cots, resets=None, per_stream=False):
    """Sum over t of est.gradient(state_t, dL_t/dh_t), flattened; also the states the estimator produced."""
    state = est.initial_state(h0)
    total, hs = 0.0, []
    for t in range(len(xs)):
        if resets and t in resets:
            mask, h_reset = resets[t]
            state = est.reset(state, mask, h_reset)
        h, state = est.step(xs[t], state)
        hs.append(h)
        g = est.gradient(state, cots[t], per_stream=per_stream)
        total = total + ref.flatten_dict(g, est.cell, lead=1 if per_stream else 0)
    return total, hs, state


@pytest.mark.parametrize("name", CELLS)
def test_rtrl_sum_equals_bptt(name):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B)
    expected = ref.bptt_gradient(cell, xs, h0, cots)
    assert expected.abs().sum() > 0
    got, hs, state = _run(RTRL(cell), xs, h0, cots)
    torch.testing.assert_close(got, expected, **TOL)
    assert state.step == T
    # the states are the cell's own
    h = h0
    with torch.no_grad():
        for t in range(T):
            h = cell(xs[t], h)
            torch.testing.assert_close(hs[t], h, rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", ["tanh", "gru", "ortho-aux-modrelu", "ortho-householder-tanh"])
def test_rtrl_with_a_readout_mse_loss_equals_bptt(name):
    """L_t = mean((V h_t + c - y_t)^2): dL_t/dh_t computed from the estimator's h_t."""
    cell = ref.make_cell(name)
    xs, h0, _ = ref.sequence(cell, T, B)
    readout = torch.randn(2, cell.hidden_size, dtype=DTYPE)
    targets = torch.randn(T, B, 2, dtype=DTYPE)
    loss = lambda h, t: ((h @ readout.T + 0.1 - targets[t]) ** 2).mean()  # noqa: E731

    est = RTRL(cell)
    state, got = est.initial_state(h0), 0.0
    for t in range(T):
        h, state = est.step(xs[t], state)
        hh = h.clone().requires_grad_(True)
        (dh,) = torch.autograd.grad(loss(hh, t), hh)
        got = got + ref.flatten_dict(est.gradient(state, dh), cell)

    params = ref.parameters(cell)
    h, total = h0, 0.0
    for t in range(T):
        h = cell(xs[t], h)
        total = total + loss(h, t)
    expected = ref.flat(torch.autograd.grad(total, params, allow_unused=True), params)
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("name", ["tanh", "ortho-cayley-modrelu"])
def test_rtrl_closed_form_and_generic_agree(name):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B)
    fast, _, s_fast = _run(RTRL(cell, closed_form=True), xs, h0, cots)
    generic, _, s_gen = _run(RTRL(cell, closed_form=False), xs, h0, cots)
    torch.testing.assert_close(fast, generic, rtol=0, atol=1e-12)
    torch.testing.assert_close(s_fast.tensors["influence"], s_gen.tensors["influence"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", CELLS)
def test_rtrl_per_stream_rows(name):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B, seed=2)
    rows, _, _ = _run(RTRL(cell), xs, h0, cots, per_stream=True)
    summed, _, _ = _run(RTRL(cell), xs, h0, cots)
    assert rows.shape == (B, ref.param_count(cell))
    torch.testing.assert_close(rows.sum(0), summed, rtol=0, atol=1e-12)
    for b in range(B):  # each stream's own BPTT, run alone
        own = ref.bptt_gradient(cell, xs[:, b : b + 1], h0[b : b + 1], cots[:, b : b + 1])
        torch.testing.assert_close(rows[b], own, **TOL)
    assert not torch.allclose(rows[0], rows[1])


def test_rtrl_per_stream_shapes():
    cell = ref.make_cell("ortho-aux-tanh")
    est = RTRL(cell)
    xs, h0, cots = ref.sequence(cell, 2, B)
    _, state = est.step(xs[0], est.initial_state(h0))
    grads = est.gradient(state, cots[0], per_stream=True)
    assert {n: tuple(g.shape) for n, g in grads.items()} == {n: (B, *p.shape) for n, p in cell.named_parameters()}
    assert state.tensors["influence"].shape == (B, cell.hidden_size, ref.param_count(cell))


@pytest.mark.parametrize("name", ["tanh", "gru", "influence", "ortho-aux-modrelu", "ortho-matrix_exp-tanh"])
@pytest.mark.parametrize("reset_to", ["zeros", "vector", "matrix"])
def test_rtrl_reset_mid_sequence_equals_bptt_with_a_cut(name, reset_to):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B, seed=3)
    mask = torch.tensor([True, False])
    hidden = cell.hidden_size
    given = {
        "zeros": None,
        "vector": torch.randn(hidden, dtype=DTYPE),
        "matrix": torch.randn(B, hidden, dtype=DTYPE),
    }[reset_to]
    effective = torch.zeros(hidden, dtype=DTYPE) if given is None else given
    resets_est = {3: (mask, given)}
    resets_ref = {3: (mask, effective)}
    expected = ref.bptt_gradient(cell, xs, h0, cots, resets=resets_ref)
    got, hs, _ = _run(RTRL(cell), xs, h0, cots, resets=resets_est)
    torch.testing.assert_close(got, expected, **TOL)
    # the cut matters: without it the gradient differs
    assert not torch.allclose(got, ref.bptt_gradient(cell, xs, h0, cots), rtol=1e-6, atol=1e-8)
    # states follow the reset
    pre = ref.forward_states(cell, xs, h0, resets_ref)
    with torch.no_grad():
        torch.testing.assert_close(hs[3], cell(xs[3], pre[3]), rtol=0, atol=1e-14)
    # per stream: the untouched stream is unaffected by the reset
    rows, _, _ = _run(RTRL(cell), xs, h0, cots, resets=resets_est, per_stream=True)
    own = ref.bptt_gradient(cell, xs[:, 1:], h0[1:], cots[:, 1:])
    torch.testing.assert_close(rows[1], own, **TOL)


def test_rtrl_gradient_right_after_reset_is_zero_for_the_reset_stream():
    cell = ref.make_cell("tanh")
    xs, h0, cots = ref.sequence(cell, 3, B)
    est = RTRL(cell)
    state = est.initial_state(h0)
    for t in range(3):
        _, state = est.step(xs[t], state)
    before = est.gradient(state, cots[2], per_stream=True)
    state = est.reset(state, torch.tensor([False, True]))
    after = est.gradient(state, cots[2], per_stream=True)
    for n in before:
        torch.testing.assert_close(after[n][0], before[n][0], rtol=0, atol=0)
        torch.testing.assert_close(after[n][1], torch.zeros_like(after[n][1]), rtol=0, atol=0)
    torch.testing.assert_close(state.h[1], torch.zeros(cell.hidden_size, dtype=DTYPE), rtol=0, atol=0)
