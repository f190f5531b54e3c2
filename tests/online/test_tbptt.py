import pytest
import torch

from lightning_ortho.online import RTRL, TruncatedBPTT

from . import references as ref
from .references import CELLS, DTYPE

T, B = 6, 2
TOL = dict(rtol=1e-10, atol=1e-10)


def _run(est, xs, h0, cots, resets=None, per_stream=False):
    state = est.initial_state(h0)
    total = 0.0
    for t in range(len(xs)):
        if resets and t in resets:
            mask, h_reset = resets[t]
            state = est.reset(state, mask, h_reset)
        _, state = est.step(xs[t], state)
        g = est.gradient(state, cots[t], per_stream=per_stream)
        total = total + ref.flatten_dict(g, est.cell, lead=1 if per_stream else 0)
    return total, state


@pytest.mark.parametrize("name", CELLS)
def test_long_window_equals_bptt(name):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B)
    expected = ref.bptt_gradient(cell, xs, h0, cots)
    for k in (T, T + 3):
        got, state = _run(TruncatedBPTT(cell, k), xs, h0, cots)
        torch.testing.assert_close(got, expected, **TOL)
    assert state.tensors["inputs"].shape == (B, T, cell.input_size)


@pytest.mark.parametrize("name", ["tanh", "gru", "influence", "ortho-aux-modrelu", "ortho-cayley-tanh"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_short_window_equals_truncated_reference(name, k):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B, seed=4)
    expected = ref.truncated_gradient(cell, xs, h0, cots, k)
    got, state = _run(TruncatedBPTT(cell, k), xs, h0, cots)
    torch.testing.assert_close(got, expected, **TOL)
    assert state.tensors["inputs"].shape[1] == k  # the window holds k steps, not T
    # truncation matters here
    assert not torch.allclose(got, ref.bptt_gradient(cell, xs, h0, cots), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("k", [1, 3])
def test_influence_balancing_short_window_has_the_wrong_sign(k):
    """The cell's reason to exist: near the fixed point, with a loss on the first unit, truncated gradients
    point the wrong way while the full (RTRL) gradient does not."""
    cell = ref.make_cell("influence")  # 5 units, 2 positive: total influence 2 * (2*2 - 5) < 0
    steps = 60
    xs = torch.zeros(steps, 1, cell.input_size, dtype=DTYPE)
    cots = torch.zeros(steps, 1, cell.hidden_size, dtype=DTYPE)
    cots[-1, 0, 0] = 1.0  # L = h_T[0]
    h0 = torch.zeros(1, cell.hidden_size, dtype=DTYPE)
    truncated, _ = _run(TruncatedBPTT(cell, k), xs, h0, cots)
    full, _ = _run(RTRL(cell), xs, h0, cots)
    assert truncated.item() > 0 > full.item()
    assert full.item() == pytest.approx(2 * (2 * 2 - 5), rel=1e-6)  # d(fixed point)/d theta


@pytest.mark.parametrize("name", ["tanh", "gru", "ortho-householder-modrelu"])
@pytest.mark.parametrize("k", [2, T])
def test_per_stream_rows(name, k):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B, seed=5)
    rows, _ = _run(TruncatedBPTT(cell, k), xs, h0, cots, per_stream=True)
    summed, _ = _run(TruncatedBPTT(cell, k), xs, h0, cots)
    assert rows.shape == (B, ref.param_count(cell))
    torch.testing.assert_close(rows.sum(0), summed, rtol=0, atol=1e-12)
    for b in range(B):
        own = ref.truncated_gradient(cell, xs[:, b : b + 1], h0[b : b + 1], cots[:, b : b + 1], k)
        torch.testing.assert_close(rows[b], own, **TOL)


@pytest.mark.parametrize("name", ["tanh", "gru", "ortho-aux-tanh"])
@pytest.mark.parametrize("k", [2, 3, T])
def test_reset_cuts_the_gradient(name, k):
    cell = ref.make_cell(name)
    xs, h0, cots = ref.sequence(cell, T, B, seed=6)
    h_reset = torch.randn(cell.hidden_size, dtype=DTYPE)
    resets = {3: (torch.tensor([False, True]), h_reset)}
    expected = ref.truncated_gradient(cell, xs, h0, cots, k, resets=resets)
    got, _ = _run(TruncatedBPTT(cell, k), xs, h0, cots, resets=resets)
    torch.testing.assert_close(got, expected, **TOL)
    rows, _ = _run(TruncatedBPTT(cell, k), xs, h0, cots, resets=resets, per_stream=True)
    for b in range(B):
        own = ref.truncated_gradient(cell, xs, h0, cots, k, resets=resets, streams=[b])
        torch.testing.assert_close(rows[b], own, **TOL)
    if k == T:  # a full window with a reset is BPTT with the cut, and RTRL agrees
        torch.testing.assert_close(got, ref.bptt_gradient(cell, xs, h0, cots, resets=resets), **TOL)
        rtrl = RTRL(cell)
        state, total = rtrl.initial_state(h0), 0.0
        for t in range(T):
            if t in resets:
                state = rtrl.reset(state, *resets[t])
            _, state = rtrl.step(xs[t], state)
            total = total + ref.flatten_dict(rtrl.gradient(state, cots[t]), cell)
        torch.testing.assert_close(got, total, **TOL)
    if k >= 3:  # the window reaches across the reset: the cut changes the result
        uncut = ref.truncated_gradient(cell, xs, h0, cots, k)
        assert not torch.allclose(rows[1], ref.truncated_gradient(cell, xs, h0, cots, k, streams=[1]))
        assert not torch.allclose(got, uncut)


def test_reset_twice_and_consecutive_resets():
    cell = ref.make_cell("tanh")
    xs, h0, cots = ref.sequence(cell, T, B, seed=7)
    resets = {
        1: (torch.tensor([True, False]), torch.zeros(cell.hidden_size, dtype=DTYPE)),
        2: (torch.tensor([True, True]), torch.full((cell.hidden_size,), 0.3, dtype=DTYPE)),
        4: (torch.tensor([False, True]), torch.zeros(cell.hidden_size, dtype=DTYPE)),
    }
    for k in (2, 4, T):
        expected = ref.truncated_gradient(cell, xs, h0, cots, k, resets=resets)
        got, _ = _run(TruncatedBPTT(cell, k), xs, h0, cots, resets=resets)
        torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("per_stream", [False, True])
def test_gradient_right_after_reset_is_zero_for_the_reset_stream(per_stream):
    """As for RTRL (influence zeroed): the reset stream's state is now a constant h0."""
    cell = ref.make_cell("tanh")
    xs, h0, cots = ref.sequence(cell, 3, B)
    est = TruncatedBPTT(cell, 2)
    state = est.initial_state(h0)
    for t in range(3):
        _, state = est.step(xs[t], state)
    before = est.gradient(state, cots[2], per_stream=True)
    reset = est.reset(state, torch.tensor([False, True]))
    after = est.gradient(reset, cots[2], per_stream=True)
    for n in before:
        torch.testing.assert_close(after[n][0], before[n][0], rtol=0, atol=1e-15)
        torch.testing.assert_close(after[n][1], torch.zeros_like(after[n][1]), rtol=0, atol=0)
    summed = est.gradient(reset, cots[2])
    for n in before:
        torch.testing.assert_close(summed[n], before[n][0], rtol=0, atol=1e-14)


def test_gradient_before_any_step_is_zero():
    cell = ref.make_cell("gru")
    est = TruncatedBPTT(cell, 3)
    state = est.initial_state(torch.zeros(B, cell.hidden_size, dtype=DTYPE))
    g = torch.randn(B, cell.hidden_size, dtype=DTYPE)
    for per_stream in (False, True):
        grads = est.gradient(state, g, per_stream=per_stream)
        for n, p in cell.named_parameters():
            assert grads[n].shape == ((B,) if per_stream else ()) + tuple(p.shape)
            assert not grads[n].any()


@pytest.mark.parametrize("k", [0, -2, 1.5, True, "3", None])
def test_bad_k_raises(k):
    with pytest.raises(ValueError, match="k must be a positive integer"):
        TruncatedBPTT(ref.make_cell("tanh"), k)


def test_changing_input_width_raises():
    cell = ref.make_cell("influence")  # ignores its input, so only the estimator can object
    cell.input_size = None  # a cell that declares no input width: the window itself must notice the change
    est = TruncatedBPTT(cell, 3)
    state = est.initial_state(torch.zeros(B, cell.hidden_size, dtype=DTYPE))
    _, state = est.step(torch.zeros(B, 2, dtype=DTYPE), state)
    with pytest.raises(ValueError, match="x has 3 features, earlier steps had 2"):
        est.step(torch.zeros(B, 3, dtype=DTYPE), state)


def test_compiled_gradient_across_a_reset_equals_the_truncated_reference():
    """Under ``torch.compile`` (one graph: the reverse pass is ``torch.func.vjp``) the summed gradient of a window
    that reaches across a reset is the independent truncated-backprop reference's, as in eager."""
    cell = ref.make_cell("tanh")
    k = 3
    xs, h0, cots = ref.sequence(cell, T, B, seed=6)
    resets = {3: (torch.tensor([False, True]), torch.randn(cell.hidden_size, dtype=DTYPE))}
    est = TruncatedBPTT(cell, k)
    est.check_every = None
    torch._dynamo.reset()
    gradient = torch.compile(est.gradient, fullgraph=True, backend="aot_eager", dynamic=False)
    state, total = est.initial_state(h0), 0.0
    for t in range(T):
        if t in resets:
            state = est.reset(state, *resets[t])
        _, state = est.step(xs[t], state)
        total = total + ref.flatten_dict(gradient(state, cots[t]), cell)
    est.check(state)
    torch.testing.assert_close(total, ref.truncated_gradient(cell, xs, h0, cots, k, resets=resets), **TOL)
