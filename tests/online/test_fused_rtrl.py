"""RTRL's fused step on a TanhRNNCell (the GEMM ``W_h M`` and one C pass, lightning_ortho._native.rtrl) and its C
summed estimate, against the PyTorch path (``native_kernels(False)``) and the generic ``torch.func`` path: the same
states, influence and estimates over several steps, across a parameter update and a checkpoint; the kernels run where
they should and nowhere else; NaN/inf is refused or recorded as before."""

from __future__ import annotations

import io

import pytest
import torch

from lightning_ortho._native import native_kernels
from lightning_ortho._native import rtrl as native_rtrl
from lightning_ortho.online import RTRL, TanhRNNCell
from lightning_ortho.online import rtrl as rtrl_module

INPUT, HIDDEN, STEPS = 3, 5, 6
TOL = {torch.float64: {"rtol": 1e-12, "atol": 1e-12}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}


@pytest.fixture
def calls(monkeypatch):
    """How often the step's and the gradient's C kernels ran (spies on the bindings that RTRL calls)."""
    counts = {"step": 0, "gradient": 0}
    step, gradient = rtrl_module.tanh_step, rtrl_module.summed_estimate

    def spy_step(*args):
        counts["step"] += 1
        return step(*args)

    def spy_gradient(*args):
        counts["gradient"] += 1
        return gradient(*args)

    monkeypatch.setattr(rtrl_module, "tanh_step", spy_step)
    monkeypatch.setattr(rtrl_module, "summed_estimate", spy_gradient)
    return counts


@pytest.fixture(autouse=True)
def kernels_available():
    if native_rtrl.rtrl_gradient_kernel(torch.zeros(1, dtype=torch.float64)) is None:
        pytest.skip("the C kernels are not available on this machine (no C compiler)")


def make_cell(dtype=torch.float64, cls=TanhRNNCell) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(INPUT, HIDDEN).to(dtype)


def data(streams: int, dtype=torch.float64, steps: int = STEPS):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, streams, INPUT, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.randn(steps, streams, HIDDEN, generator=g, dtype=torch.float64).to(dtype)
    h0 = (0.5 * torch.randn(streams, HIDDEN, generator=g, dtype=torch.float64)).to(dtype)
    return xs, grads, h0


def run(estimator, xs, grads, h0, update_at: int | None = 3, state=None, start: int = 0):
    """Every step's ``h``, influence and summed estimate (flat), from ``state`` (else ``h0``); the cell's weights
    move at step ``update_at`` (an optimiser's update between steps), by the same amount on every run."""
    state = estimator.initial_state(h0) if state is None else state
    trace = []
    for t in range(start, xs.shape[0]):
        if t == update_at:
            with torch.no_grad():
                for p in estimator.cell.parameters():
                    p.add_(0.01 * torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape).cos())
        h, state = estimator.step(xs[t], state)
        summed = estimator.gradient(state, grads[t])
        trace.append((h.clone(), state.tensors["influence"].clone(), estimator.layout.flatten(summed, lead=0)))
    return trace, state


def assert_traces_close(a, b, dtype):
    for t, (one, other) in enumerate(zip(a, b, strict=True)):
        for name, x, y in zip(("h", "influence", "estimate"), one, other, strict=True):
            torch.testing.assert_close(x, y, **TOL[dtype], msg=f"{name} at step {t + 1}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
def test_the_fused_step_gives_what_the_pytorch_paths_give(dtype, streams, calls):
    xs, grads, h0 = data(streams, dtype)
    fused, _ = run(RTRL(make_cell(dtype)), xs, grads, h0)
    assert calls == {"step": STEPS, "gradient": STEPS}  # the path under test is the one taken
    with native_kernels(False):
        plain, _ = run(RTRL(make_cell(dtype)), xs, grads, h0)
    generic, _ = run(RTRL(make_cell(dtype), closed_form=False), xs, grads, h0)
    assert calls["step"] == STEPS
    assert_traces_close(fused, plain, dtype)
    assert_traces_close(fused, generic, dtype)
    assert fused[-1][1].abs().max() > 0.1  # the influence is not trivially small


def test_the_per_stream_estimate_and_a_reset_agree_with_the_summed_one(calls):
    cell = make_cell()
    xs, grads, h0 = data(3)
    estimator = RTRL(cell)
    state = estimator.initial_state(h0)
    for t in range(STEPS):
        if t == 2:
            state = estimator.reset(state, torch.tensor([False, True, False]))
        _, state = estimator.step(xs[t], state)
        summed = estimator.layout.flatten(estimator.gradient(state, grads[t]), lead=0)
        per_stream = estimator.layout.flatten(estimator.gradient(state, grads[t], per_stream=True), lead=1)
        torch.testing.assert_close(per_stream.sum(0), summed, **TOL[torch.float64])
    assert calls == {"step": STEPS, "gradient": STEPS}


def test_a_checkpoint_resumes_identically():
    cell = make_cell()
    xs, grads, h0 = data(3)
    straight, _ = run(RTRL(cell), xs, grads, h0, update_at=None)
    _, head = run(RTRL(cell), xs[:3], grads[:3], h0, update_at=None)
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()))
    for native in (True, False):
        estimator = RTRL(cell)
        resumed = estimator.initial_state(h0)
        resumed.load_state_dict(saved)
        with native_kernels(native):
            rest, _ = run(estimator, xs, grads, h0, update_at=None, state=resumed, start=3)
        if native:
            for (h, m, e), (h2, m2, e2) in zip(rest, straight[3:], strict=True):
                assert torch.equal(h, h2) and torch.equal(m, m2) and torch.equal(e, e2)
        else:
            assert_traces_close(rest, straight[3:], torch.float64)


def test_the_step_reads_the_state_and_leaves_it_as_it_was():
    estimator = RTRL(make_cell())
    xs, _, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    before = (state.h.clone(), state.tensors["influence"].clone())
    _, new = estimator.step(xs[1], state)
    assert torch.equal(state.h, before[0]) and torch.equal(state.tensors["influence"], before[1])
    assert new.tensors["influence"].data_ptr() != state.tensors["influence"].data_ptr()


class _ScaledTanh(TanhRNNCell):
    """Another step than tanh(W_h h + W_x x + b): the fused step must not take it."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(0.5 * (self.preactivation(x, h)))


def test_it_declines_where_it_must(calls):
    xs, grads, h0 = data(2)
    with native_kernels(False):
        run(RTRL(make_cell()), xs, grads, h0)
    assert calls == {"step": 0, "gradient": 0}
    # a subclass that changes the step: the generic step (exact), the estimate still in C (it holds for any cell)
    cell = make_cell(cls=_ScaledTanh)
    ours, _ = run(RTRL(cell), xs, grads, h0, update_at=None)
    generic, _ = run(RTRL(cell, closed_form=False), xs, grads, h0, update_at=None)
    assert_traces_close(ours, generic, torch.float64)
    assert calls["step"] == 0
    # closed_form=False, and dtypes the kernels do not take
    run(RTRL(make_cell(), closed_form=False), xs, grads, h0)
    assert calls["step"] == 0
    xs16, grads16, h016 = data(2, torch.bfloat16)
    before = calls["gradient"]
    low, _ = run(RTRL(make_cell(torch.bfloat16)), xs16, grads16, h016)
    assert calls["step"] == 0 and calls["gradient"] == before
    assert low[-1][0].dtype == low[-1][1].dtype == torch.bfloat16


def test_non_contiguous_inputs_take_the_pytorch_path_and_agree(calls):
    xs, grads, h0 = data(2)
    fused, _ = run(RTRL(make_cell()), xs, grads, h0)
    strided_xs = xs.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, column-major steps
    strided_grads = grads.transpose(1, 2).contiguous().transpose(1, 2)
    calls.update(step=0, gradient=0)
    strided, _ = run(RTRL(make_cell()), strided_xs, strided_grads, h0)
    assert calls == {"step": 0, "gradient": 0}
    assert_traces_close(strided, fused, torch.float64)


def test_under_torch_compile_the_pytorch_path_is_traced(calls):
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = RTRL(cell)
    estimator.check_every = None

    def step_and_gradient(x, state, grad_h):
        h, state = estimator.step(x, state)
        return h, state, estimator.gradient(state, grad_h)

    torch._dynamo.reset()
    compiled = torch.compile(step_and_gradient, fullgraph=True, backend="eager")
    state, trace = estimator.initial_state(h0), []
    for t in range(3):
        h, state, grads_t = compiled(xs[t], state, grads[t])
        trace.append((h, state.tensors["influence"], estimator.layout.flatten(grads_t, lead=0)))
    estimator.check(state)
    assert calls == {"step": 0, "gradient": 0}
    eager, _ = run(RTRL(cell), xs[:3], grads[:3], h0, update_at=None)
    assert_traces_close(trace, eager, torch.float64)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_input_is_the_same_value_error_at_once(bad, calls):
    estimator = RTRL(make_cell())
    xs, _, h0 = data(3)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    x = xs[1].clone()
    x[2, 1] = bad
    with pytest.raises(ValueError, match="RTRL: x holds NaN or inf values"):
        estimator.step(x, state)
    assert calls["step"] == 2


def test_a_nan_parameter_is_named():
    cell = make_cell()
    estimator = RTRL(cell)
    xs, _, h0 = data(1)
    state = estimator.initial_state(h0)
    with torch.no_grad():
        cell.weight_ih[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 1.*\['weight_ih'\]"):
        estimator.step(xs[0], state)


def test_an_overflowed_influence_is_named():
    cell = make_cell(torch.float32)
    estimator = RTRL(cell)
    xs, _, h0 = data(1, torch.float32)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    with torch.no_grad():
        cell.weight_hh.fill_(0.5)
    state.tensors["influence"].fill_(3e38)  # finite; W_h M (5 * 0.5 * 3e38) overflows
    with pytest.raises(FloatingPointError, match="influence approximation 'influence' overflowed at step 2"):
        estimator.step(xs[1], state)


def test_recorded_failures_name_the_step():
    cell = make_cell()
    estimator = RTRL(cell)
    estimator.check_every = None
    xs, grads, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    x = xs[1].clone()
    x[0, 0] = float("nan")
    _, state = estimator.step(x, state)  # recorded, not raised
    _, state = estimator.step(xs[2], state)
    with pytest.raises(ValueError, match="x held NaN or inf values at step 2"):
        estimator.check(state)
    estimator = RTRL(cell)
    estimator.check_every = None
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    bad = grads[0].clone()
    bad[1, 2] = float("inf")
    estimator.gradient(state, bad)
    with pytest.raises(ValueError, match="grad_h held NaN or inf values at step 1"):
        estimator.check(state)


def test_a_nan_grad_h_is_the_gradients_value_error():
    estimator = RTRL(make_cell())
    xs, grads, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    bad = grads[0].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="RTRL: grad_h holds NaN or inf values"):
        estimator.gradient(state, bad)


def test_finite_float32_entries_near_the_top_of_the_range_are_no_error():
    estimator = RTRL(make_cell(torch.float32))
    xs, grads, h0 = data(1, torch.float32)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    state.tensors["influence"].fill_(1e38)  # the float32 sum of the entries overflows, the double sum does not
    estimate = estimator.gradient(state, torch.full_like(grads[0], 1e-3))
    assert all(torch.isfinite(v).all() for v in estimate.values())
