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


# -- the template's fast lane (OnlineGradientEstimator._fused_step / _fused_gradient) ---------------------------------
def spied(estimator):
    """``{"step": n, "gradient": n}``: the calls that the fast lane took (``_fused_step`` / ``_fused_gradient``
    answered), counted on the instance."""
    counts = {"step": 0, "gradient": 0}
    step, gradient = estimator._fused_step, estimator._fused_gradient

    def fused_step(x, state):
        answer = step(x, state)
        counts["step"] += answer is not None
        return answer

    def fused_gradient(state, grad_h):
        answer = gradient(state, grad_h)
        counts["gradient"] += answer is not None
        return answer

    estimator._fused_step, estimator._fused_gradient = fused_step, fused_gradient
    return counts


def gradient_trace(estimator, xs, grads, state, update_at=None):
    """Per step ``h`` and every entry of the estimate as ``gradient()`` returns it (names, order, shapes)."""
    trace = []
    for t in range(xs.shape[0]):
        if t == update_at:
            with torch.no_grad():
                for p in estimator.cell.parameters():
                    p.mul_(0.9).add_(0.01)
        h, state = estimator.step(xs[t], state)
        trace.append((h, estimator.gradient(state, grads[t])))
    return trace, state


def assert_gradient_traces_close(ours, theirs, dtype):
    for step, ((h, grads), (h_ref, grads_ref)) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(h, h_ref, **TOLERANCE[dtype], msg=f"step {step}: h")
        assert list(grads) == list(grads_ref)  # the names in the order of cell.named_parameters()
        for name, value in grads.items():
            assert value.shape == grads_ref[name].shape and value.is_contiguous(), name
            torch.testing.assert_close(value, grads_ref[name], **TOLERANCE[dtype], msg=f"step {step}: {name}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
def test_the_fast_lane_gives_what_the_pytorch_path_gives_by_parameter(dtype, streams):
    xs, grads, h0 = data(streams, dtype)
    traces = []
    for kernels in (True, False):
        estimator = UORO(make_cell(dtype), generator=3)
        counts = spied(estimator)
        with native.native_kernels(kernels):
            traces.append(gradient_trace(estimator, xs, grads, estimator.initial_state(h0), update_at=3)[0])
        assert counts == ({"step": STEPS, "gradient": STEPS} if kernels else {"step": 0, "gradient": 0})
    assert_gradient_traces_close(*traces, dtype)
    assert [name for name, _ in make_cell().named_parameters()] == list(traces[0][0][1])


def test_the_fast_lane_follows_the_cell_to_float64():
    xs, grads, h0 = data(2)
    traces = []
    for kernels in (True, False):
        cell = make_cell(torch.float32)
        estimator = UORO(cell, generator=5)
        counts = spied(estimator)
        with native.native_kernels(kernels):
            _, state = gradient_trace(estimator, xs[:2].float(), grads[:2].float(), estimator.initial_state(h0.float()))
            cell.double()  # the same parameter objects, new memory of another dtype
            state = estimator.initial_state(h0)
            traces.append(gradient_trace(estimator, xs, grads, state)[0])
        assert counts == ({"step": STEPS + 2, "gradient": STEPS + 2} if kernels else {"step": 0, "gradient": 0})
    assert_gradient_traces_close(*traces, torch.float64)


def test_the_estimate_of_any_cell_is_one_pass_by_parameter():
    """The summed estimate serves every cut with a (B, P) w_tilde: here the parameter cut, whose step is generic."""
    xs, grads, h0 = data(3)
    traces = []
    for kernels in (True, False):
        estimator = UORO(make_cell(), projection="parameter", generator=2)
        counts = spied(estimator)
        with native.native_kernels(kernels):
            traces.append(gradient_trace(estimator, xs, grads, estimator.initial_state(h0))[0])
        assert counts == {"step": 0, "gradient": STEPS if kernels else 0}
    assert_gradient_traces_close(*traces, torch.float64)


def started(streams: int = 3, check_every=1):
    xs, grads, h0 = data(streams)
    estimator = UORO(make_cell(), generator=0)
    estimator.check_every = check_every
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    return estimator, state, xs, grads


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("3-D x", "x must be"),
        ("x of another dtype", "x is torch.float32"),
        ("x of another width", r"x must have shape \(3, 3\)"),
        ("x of other streams", r"x must have shape \(3, "),
    ],
)
def test_the_fast_lane_declines_an_input_the_template_refuses(case, message):
    estimator, state, xs, _ = started()
    x = {
        "3-D x": xs[1][None],
        "x of another dtype": xs[1].float(),
        "x of another width": torch.cat([xs[1], xs[1]], 1),
        "x of other streams": xs[1][:2],
    }[case]
    generator = state.generator.get_state()
    assert estimator._fused_step(x, state) is None
    assert torch.equal(state.generator.get_state(), generator)  # nothing drawn
    with pytest.raises(ValueError, match=message):
        estimator.step(x, state)


@pytest.mark.parametrize("case", ["another shape", "another dtype", "3-D", "not a tensor"])
def test_the_fast_lane_declines_a_grad_h_the_template_refuses(case):
    estimator, state, _, grads = started()
    grad_h = {
        "another shape": grads[1][:2],
        "another dtype": grads[1].float(),
        "3-D": grads[1][None],
        "not a tensor": grads[1].tolist(),
    }[case]
    assert estimator._fused_gradient(state, grad_h) is None
    with pytest.raises(ValueError, match="grad_h"):
        estimator.gradient(state, grad_h)


@pytest.mark.parametrize("name", ["h", "h_tilde", "w_tilde"])
def test_a_state_made_by_hand_with_a_strided_tensor_takes_the_pytorch_path(name):
    estimator, state, xs, grads = started()
    # copies (the PyTorch path updates w_tilde in place) with one tensor strided: the same values, every other
    # column of a wider tensor
    tensors = {"h": state.h, **state.tensors}
    tensors = {key: value.clone() for key, value in tensors.items()}
    tensors[name] = torch.stack([tensors[name], tensors[name]], -1).flatten(1)[:, ::2]
    assert not tensors[name].is_contiguous() and torch.equal(tensors[name], (state.tensors | {"h": state.h})[name])
    by_hand = state.replace(h=tensors.pop("h"), tensors=tensors)
    assert estimator._fused_step(xs[1], by_hand) is None
    if name != "h":
        assert estimator._fused_gradient(by_hand, grads[1]) is None
    generator = state.generator.get_state()  # (shared by both states)
    ours = gradient_trace(estimator, xs[1:3], grads[1:3], by_hand)[0]
    state.generator.set_state(generator)
    with native.native_kernels(False):
        theirs = gradient_trace(estimator, xs[1:3], grads[1:3], state)[0]
    assert_gradient_traces_close(ours, theirs, torch.float64)


def test_the_fast_lane_is_off_with_the_kernels_and_for_a_step_of_its_own():
    estimator, state, xs, grads = started()
    with native.native_kernels(False):
        assert estimator._fused_step(xs[1], state) is None
        assert estimator._fused_gradient(state, grads[0]) is None

    class OwnStep(UORO):
        def _advance_step(self, x, state):
            return super()._advance_step(x, state)

    class OwnEstimate(UORO):
        def _gradient_summed(self, state, grad_h):
            return super()._gradient_summed(state, grad_h)

    own = OwnStep(make_cell(), generator=0)
    assert own._one_call_step is None and own._estimate is not None
    assert OwnEstimate(make_cell(), generator=0)._estimate is None
    own_forward = UORO(make_cell(cls=_OwnForward), generator=0)  # the summed estimate still applies
    counts = spied(own_forward)
    gradient_trace(own_forward, xs, grads, own_forward.initial_state(state.h))
    assert counts == {"step": 0, "gradient": STEPS}


def test_a_parametrised_cell_leaves_the_fast_lane():
    from torch.nn.utils import parametrize  # noqa: PLC0415

    class Scaled(torch.nn.Module):
        def forward(self, weight):
            return 2 * weight

    xs, grads, h0 = data(2)
    estimator = UORO(make_cell(), generator=1)
    counts = spied(estimator)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    parametrize.register_parametrization(estimator.cell, "weight_hh", Scaled())
    assert estimator._fused_step(xs[1], state) is None  # the class is swapped: the weights are no longer these
    assert counts["step"] == 1


def test_a_nan_input_recorded_names_its_step():
    estimator, state, xs, grads = started(check_every=None)
    counts = spied(estimator)
    x = xs[1].clone()
    x[0, 1] = float("nan")
    for t, value in enumerate([x, xs[2], xs[3]]):
        _, state = estimator.step(value, state)  # recorded, not raised
        estimator.gradient(state, grads[1 + t])
    assert counts["step"] == 3  # the one call ran and its NaN verdict went to the template
    with pytest.raises(ValueError, match=r"x held NaN or inf values at step 2\b"):
        estimator.check(state)


def test_a_nan_verdict_is_settled_by_the_template_from_the_one_draw(one_calls):
    estimator, state, xs, _ = started()
    x = xs[1].clone()
    x[1, 0] = float("inf")
    generator = state.generator.get_state()
    with pytest.raises(ValueError, match="UORO: x holds NaN or inf values"):
        estimator.step(x, state)
    after = state.generator.get_state()
    state.generator.set_state(generator)
    estimator._noise_bits(state, HIDDEN, x)  # one draw: what the failed step drew
    assert torch.equal(state.generator.get_state(), after)
    assert one_calls["one_call"] == 2


def test_the_estimate_of_a_cell_of_four_parameters_is_one_pass_by_parameter():
    from lightning_ortho.online import GRUCell  # noqa: PLC0415

    xs, _, h0 = data(3)
    grads = torch.randn(STEPS, 3, HIDDEN, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    traces = []
    for kernels in (True, False):
        torch.manual_seed(0)
        estimator = UORO(GRUCell(INPUT, HIDDEN).double(), generator=2)
        counts = spied(estimator)
        with native.native_kernels(kernels):
            traces.append(gradient_trace(estimator, xs, grads, estimator.initial_state(h0))[0])
        assert counts == {"step": 0, "gradient": STEPS if kernels else 0}
    assert_gradient_traces_close(*traces, torch.float64)
    assert len(traces[0][0][1]) == 4


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_estimator_steps_on_as_the_original(how):
    import copy  # noqa: PLC0415
    import pickle  # noqa: PLC0415

    xs, grads, h0 = data(2)
    estimator = UORO(make_cell(), generator=6)
    _, state = gradient_trace(estimator, xs[:2], grads[:2], estimator.initial_state(h0))
    copied = copy.deepcopy(estimator) if how == "deepcopy" else pickle.loads(pickle.dumps(estimator))
    counts = spied(copied)
    saved = state.state_dict()
    ours = gradient_trace(estimator, xs[2:], grads[2:], state)[0]
    resumed = copied.initial_state(h0)
    resumed.load_state_dict(saved)
    theirs = gradient_trace(copied, xs[2:], grads[2:], resumed)[0]
    assert counts == {"step": STEPS - 2, "gradient": STEPS - 2}
    assert_gradient_traces_close(ours, theirs, torch.float64)
