"""UORO's GIR step on a TanhRNNCell as one C call (``TanhUOROStep.whole_gir``, ``_native/uoro.c``'s
``uoro_tanh_gir_step``) and the summed estimate's one C pass, against the PyTorch path (``native_kernels(False)``):
the same numbers over steps and gradients (float64 to ~1e-12, float32 to ~1e-5; one and three streams, both cut
vertices), after a parameter update, across a checkpoint; the one call runs where it should, declines where it must
(kernels off, a cell whose forward is its own, a split of the streams, more streams than it takes, under
``torch.compile``), draws the noise as the PyTorch path does and leaves the state passed in as it was; NaN/inf are
reported as before."""

from __future__ import annotations

import io

import pytest
import torch

import lightning_ortho._native as native
from lightning_ortho.online import UORO, TanhRNNCell, uoro_fused

INPUT, HIDDEN, STEPS = 3, 5, 6
TOLERANCE = {torch.float64: {"rtol": 1e-12, "atol": 1e-12}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}

pytestmark = pytest.mark.skipif(
    uoro_fused.uoro_tanh_kernels(torch.zeros(1, dtype=torch.float64)) is None,
    reason="the C kernels are not available (no C compiler, or LIGHTNING_ORTHO_NATIVE=0)",
)


@pytest.fixture
def one_calls(monkeypatch):
    """How many times the one-call step ran, and the row pass of the path around PyTorch's GEMMs."""
    calls = {"one_call": 0, "rows": 0}

    def counting(name, original):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(uoro_fused, "gir_step", counting("one_call", uoro_fused.gir_step))
    monkeypatch.setattr(uoro_fused, "gir_rows", counting("rows", uoro_fused.gir_rows))
    return calls


def make_cell(dtype=torch.float64, cls=TanhRNNCell) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(INPUT, HIDDEN).to(dtype)


def data(streams: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, streams, INPUT, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.randn(STEPS, streams, HIDDEN, generator=g, dtype=torch.float64).to(dtype)
    h0 = (0.5 * torch.randn(streams, HIDDEN, generator=g, dtype=torch.float64)).to(dtype)
    return xs, grads, h0


def run(estimator, xs, grads, state, update_at: int | None = None):
    """Per step ``(h, h_tilde, w_tilde, summed estimate)`` (clones) and the last state; the cell's parameters move
    (as an optimiser would move them, in place) before step ``update_at``."""
    trace = []
    for t in range(xs.shape[0]):
        if t == update_at:
            with torch.no_grad():
                for p in estimator.cell.parameters():
                    p.mul_(0.9).add_(0.01)
        h, state = estimator.step(xs[t], state)
        estimate = estimator.layout.flatten(estimator.gradient(state, grads[t]), lead=0)
        tensors = state.tensors
        trace.append((h.clone(), tensors["h_tilde"].clone(), tensors["w_tilde"].clone(), estimate.clone()))
    return trace, state


def assert_traces_close(ours, theirs, dtype, exact: bool = False):
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for name, mine, other in zip(("h", "h_tilde", "w_tilde", "estimate"), a, b, strict=True):
            if exact:
                assert torch.equal(mine, other), (step, name)
            else:
                torch.testing.assert_close(mine, other, **TOLERANCE[dtype], msg=f"step {step}: {name}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("projection", ["state", "preactivation"])
def test_the_one_call_computes_the_pytorch_path_with_an_update_between_steps(dtype, streams, projection, one_calls):
    xs, grads, h0 = data(streams, dtype)
    traces = []
    for kernels in (True, False):
        cell = make_cell(dtype)
        estimator = UORO(cell, projection=projection, generator=3)
        with native.native_kernels(kernels):
            traces.append(run(estimator, xs, grads, estimator.initial_state(h0), update_at=3)[0])
        assert one_calls == {"one_call": STEPS, "rows": 0}  # the one call ran at every step; then no kernel ran
    assert_traces_close(*traces, dtype)
    assert traces[0][-1][3].abs().max() > 0


def test_the_one_call_leaves_the_state_passed_in_as_it_was_and_draws_what_the_pytorch_path_draws(one_calls):
    xs, _, h0 = data(3)
    cell = make_cell()
    estimator = UORO(cell, generator=4)
    state = estimator.initial_state(h0)
    _, state = estimator.step(xs[0], state)
    before = {name: value.clone() for name, value in state.tensors.items()}
    generator = state.generator.get_state()
    _, after = estimator.step(xs[1], state)
    assert one_calls["one_call"] == 2
    for name, value in before.items():  # new tensors: nothing written into the state stepped from
        assert torch.equal(state.tensors[name], value), name
    assert after.tensors["w_tilde"].data_ptr() != state.tensors["w_tilde"].data_ptr()
    drawn = after.generator.get_state()
    # the PyTorch path from the same state and generator draws the same numbers (one randn, one randint)
    state.generator.set_state(generator)
    with native.native_kernels(False):
        _, other = estimator.step(xs[1], state)
    assert torch.equal(other.generator.get_state(), drawn)
    for name in ("h_tilde", "w_tilde"):
        torch.testing.assert_close(after.tensors[name], other.tensors[name], **TOLERANCE[torch.float64])


def test_a_loaded_checkpoint_steps_on_exactly(one_calls):
    xs, grads, h0 = data(2)
    cell = make_cell()
    estimator = UORO(cell, generator=9)
    straight, _ = run(estimator, xs, grads, estimator.initial_state(h0))
    _, head = run(estimator, xs[:3], grads[:3], estimator.initial_state(h0))
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    resumed = UORO(cell, generator=0)  # another seed: the saved generator state wins
    state = resumed.initial_state(h0)
    state.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    tail, _ = run(resumed, xs[3:], grads[3:], state)
    assert_traces_close(tail, straight[3:], torch.float64, exact=True)
    assert one_calls["rows"] == 0


class _OwnForward(TanhRNNCell):
    """The same step written by hand: a forward of its own is not the plain cell's, so nothing is fused."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ self.weight_hh.T + x @ self.weight_ih.T + self.bias)


def test_the_one_call_declines_where_it_must(one_calls):
    xs, grads, h0 = data(3)
    # a cell whose forward is its own: not fused at all
    estimator = UORO(make_cell(cls=_OwnForward), generator=1)
    run(estimator, xs, grads, estimator.initial_state(h0))
    assert estimator._fused is None and one_calls == {"one_call": 0, "rows": 0}
    # more streams than the one call takes: the GEMMs and the row pass
    estimator = UORO(make_cell(), generator=1)
    estimator._fused.one_call_streams[torch.float64] = 2
    large, _ = run(estimator, xs, grads, estimator.initial_state(h0))
    assert one_calls == {"one_call": 0, "rows": STEPS}
    estimator._fused.one_call_streams[torch.float64] = 3
    small, _ = run(estimator, xs, grads, estimator.initial_state(h0))
    assert one_calls == {"one_call": STEPS, "rows": STEPS}
    assert_traces_close(small, large, torch.float64)
    # the deprecated per-estimator switch
    with pytest.warns(DeprecationWarning):
        estimator.native = False
    run(estimator, xs, grads, estimator.initial_state(h0))
    assert one_calls == {"one_call": STEPS, "rows": STEPS}


def test_a_split_of_the_streams_declines_and_draws_its_rows_of_the_whole_draw(one_calls):
    xs, grads, h0 = data(4)
    estimator = UORO(make_cell(), generator=6)
    whole, _ = run(estimator, xs, grads, estimator.initial_state(h0))
    assert one_calls["one_call"] == STEPS
    rows = torch.tensor([1, 3])
    state = estimator.initial_state(h0[rows], stream_ids=rows, total_streams=4)
    for t in range(STEPS):
        h, state = estimator.step(xs[t][rows], state)
        torch.testing.assert_close(h, whole[t][0][rows], **TOLERANCE[torch.float64])
        torch.testing.assert_close(state.tensors["w_tilde"], whole[t][2][rows], **TOLERANCE[torch.float64])
    assert one_calls == {"one_call": STEPS, "rows": STEPS}


def test_the_one_call_does_not_run_under_torch_compile(one_calls):
    xs, _, h0 = data(2)
    estimator = UORO(make_cell(), generator=2)
    eager, _ = run(estimator, xs[:2], torch.zeros(2, 2, HIDDEN, dtype=torch.float64), estimator.initial_state(h0))
    calls = one_calls["one_call"]
    estimator.check_every = None  # a compiled call records its verdict
    step = torch.compile(estimator.step, backend="eager", fullgraph=False)
    state = estimator.initial_state(h0)
    with estimator.noise_scope(state):
        for t in range(2):
            h, state = step(xs[t], state)
            torch.testing.assert_close(h, eager[t][0], **TOLERANCE[torch.float64])
            torch.testing.assert_close(state.tensors["w_tilde"], eager[t][2], **TOLERANCE[torch.float64])
    estimator.check(state)
    assert one_calls["one_call"] == calls


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_input_is_the_same_value_error_and_leaves_the_state_as_it_was(bad, one_calls):
    xs, _, h0 = data(3)
    estimator = UORO(make_cell(), generator=0)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    before = {name: value.clone() for name, value in state.tensors.items()}
    x = xs[1].clone()
    x[2, 1] = bad
    with pytest.raises(ValueError, match="UORO: x holds NaN or inf values"):
        estimator.step(x, state)
    assert one_calls["one_call"] == 2
    for name, value in before.items():
        assert torch.equal(state.tensors[name], value), name


def test_nan_parameters_are_named_at_once_or_recorded():
    xs, _, h0 = data(1)
    cell = make_cell()
    estimator = UORO(cell, generator=0)
    state = estimator.initial_state(h0)
    _, state = estimator.step(xs[0], state)
    with torch.no_grad():
        cell.weight_ih[1, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 2.*\['weight_ih'\]"):
        estimator.step(xs[1], state)
    estimator.check_every = None
    _, recorded = estimator.step(xs[1], state)  # recorded, not raised
    _, recorded = estimator.step(xs[2], recorded)
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 2.*\['weight_ih'\]"):
        estimator.check(recorded)


def test_nan_in_grad_h_is_the_gradients_value_error():
    xs, grads, h0 = data(3)
    estimator = UORO(make_cell(), generator=0)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    grad_h = grads[0].clone()
    grad_h[1, 2] = float("nan")
    with pytest.raises(ValueError, match="grad_h holds NaN or inf values"):
        estimator.gradient(state, grad_h)
    estimator.check_every = None
    estimator.gradient(state, grad_h)
    with pytest.raises(ValueError, match="grad_h held NaN or inf values at step 1"):
        estimator.check(state)


def test_the_draw_buffers_are_per_thread_and_shape():
    import threading  # noqa: PLC0415

    xs, _, h0 = data(2)
    estimator = UORO(make_cell(), generator=7)
    results = {}

    def stepping(name: str, streams: int) -> None:
        state = estimator.initial_state(h0[:streams])
        for t in range(3):
            _, state = estimator.step(xs[t][:streams], state)
        results[name] = state.tensors["h_tilde"].clone()

    threads = [threading.Thread(target=stepping, args=(f"t{i}", 1 + i % 2)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stepping("here-1", 1)
    stepping("here-2", 2)
    for i in range(4):
        assert torch.equal(results[f"t{i}"], results[f"here-{1 + i % 2}"])


def test_steps_in_and_out_of_inference_mode(one_calls):
    xs, grads, h0 = data(2)
    estimator = UORO(make_cell(), generator=8)
    straight, _ = run(estimator, xs[:3], grads[:3], estimator.initial_state(h0))
    fresh = UORO(make_cell(), generator=8)  # its draw buffers are first made inside inference mode
    state = fresh.initial_state(h0)
    with torch.inference_mode():
        _, state = fresh.step(xs[0], state)
    assert state.tensors["w_tilde"].is_inference()
    for t in (1, 2):
        _, state = fresh.step(xs[t], state)
        assert torch.equal(state.tensors["w_tilde"], straight[t][2])
    assert one_calls["one_call"] == 6


def test_the_summed_estimate_of_many_streams_takes_its_scratch_off_the_stack():
    streams = 600  # more per-stream scales than the kernel keeps on its stack (512)
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(2, streams, INPUT, generator=g, dtype=torch.float64)
    grads = torch.randn(2, streams, HIDDEN, generator=g, dtype=torch.float64)
    h0 = torch.zeros(streams, HIDDEN, dtype=torch.float64)
    traces = []
    for kernels in (True, False):
        estimator = UORO(make_cell(), generator=5)
        with native.native_kernels(kernels):
            traces.append(run(estimator, xs, grads, estimator.initial_state(h0))[0])
    assert_traces_close(*traces, torch.float64)
