"""KF-RTRL's fused step and estimate on a TanhRNNCell (``lightning_ortho._native.kf_rtrl``: one C call each)
against its PyTorch path: the same draws give the same states, estimates and checkpoints; the fused path runs where
it should and declines elsewhere; NaN/inf is refused and named as on the PyTorch path."""

from __future__ import annotations

import io

import pytest
import torch

from lightning_ortho import _native
from lightning_ortho._native import kf_rtrl as native
from lightning_ortho.online import KFRTRL, TanhRNNCell
from lightning_ortho.online import kf_rtrl as module

INPUT, STEPS = 3, 6
#: Largest difference from the PyTorch path, relative to the largest entry of the compared tensor.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.fixture(autouse=True)
def kernels_available():
    if native.kf_rtrl_kernels(torch.zeros(1, dtype=torch.float64)) is None:
        pytest.skip("the C kernels are not available on this machine (no C compiler)")


@pytest.fixture
def calls(monkeypatch):
    """``{"step": n, "gradient": n, "blas": n}``: the fused calls the estimator makes (spies on the bindings it
    calls; ``blas`` counts the steps whose product ``W_h A`` is a BLAS product)."""
    counts = {"step": 0, "gradient": 0, "blas": 0}
    step, estimate = module.step, module.summed_estimate

    def spy_step(*args):
        counts["step"] += 1
        counts["blas"] += args[8] is not None  # step(kernels, addresses, h, u, A, bits, eps, sizes, weight_hh)
        return step(*args)

    def spy_estimate(*args):
        counts["gradient"] += 1
        return estimate(*args)

    monkeypatch.setattr(module, "step", spy_step)
    monkeypatch.setattr(module, "summed_estimate", spy_estimate)
    return counts


def make_cell(hidden: int, dtype: torch.dtype, cls: type = TanhRNNCell) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(INPUT, hidden).to(dtype)


def data(streams: int, hidden: int, dtype: torch.dtype, steps: int = STEPS):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, streams, INPUT, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.randn(steps, streams, hidden, generator=g, dtype=torch.float64).to(dtype)
    h0 = (0.5 * torch.randn(streams, hidden, generator=g, dtype=torch.float64)).to(dtype)
    return xs, grads, h0


def update(cell: torch.nn.Module) -> None:
    """An optimiser's step, the same on every copy of the cell."""
    with torch.no_grad():
        for index, parameter in enumerate(cell.parameters()):
            parameter.mul_(0.9).add_(0.01 * (index + 1))


def run(estimator, state, xs, grads, update_at: int | None = None):
    """``(trace (steps, n), state)``: each step's ``h``, factors and summed estimate (flat), side by side; the
    cell's parameters move before step ``update_at`` (0-based)."""
    rows = []
    for t in range(len(xs)):
        if t == update_at:
            update(estimator.cell)
        h, state = estimator.step(xs[t], state)
        estimate = estimator.layout.flatten(estimator.gradient(state, grads[t]), lead=0)
        factors = [state.tensors[name].flatten() for name in ("input_factor", "hidden_factor")]
        rows.append(torch.cat([h.flatten(), *factors, estimate]))
    return torch.stack(rows), state


def pytorch_path(hidden, dtype, streams, xs, grads, seed=3, update_at=None, **kwargs):
    """The trace of the PyTorch path (the C kernels off) on a fresh copy of the cell."""
    with _native.native_kernels(False):
        estimator = KFRTRL(make_cell(hidden, dtype), generator=seed, **kwargs)
        h0 = data(streams, hidden, dtype)[2]
        return run(estimator, estimator.initial_state(h0), xs, grads, update_at)[0]


def assert_agree(fused: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    for t, (a, b) in enumerate(zip(fused, reference, strict=True)):
        error = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        assert error <= TOLERANCE[dtype], f"step {t + 1}: relative difference {error:.3g}"


# -- the same numbers --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("hidden", [4, 16, 37])  # 37: rows and columns past the last full tile of the product
def test_the_fused_path_gives_what_the_pytorch_path_gives(dtype, streams, hidden, calls):
    xs, grads, h0 = data(streams, hidden, dtype)
    estimator = KFRTRL(make_cell(hidden, dtype), generator=3)
    fused, _ = run(estimator, estimator.initial_state(h0), xs, grads, update_at=3)  # parameters move at step 4
    assert calls == {"step": STEPS, "gradient": STEPS, "blas": 0}
    reference = pytorch_path(hidden, dtype, streams, xs, grads, update_at=3)
    assert calls["step"] == STEPS  # the PyTorch path made no fused call
    assert_agree(fused, reference, dtype)
    assert fused[-1, -hidden:].abs().max() > 0  # the estimate moves


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_blas_product_gives_the_same_numbers(dtype, calls, monkeypatch):
    monkeypatch.setattr(module, "BLAS_PRODUCT_MIN", 1)  # every H takes W_h A from torch.matmul
    xs, grads, h0 = data(3, 9, dtype)
    estimator = KFRTRL(make_cell(9, dtype), generator=3)
    fused, _ = run(estimator, estimator.initial_state(h0), xs, grads)
    assert calls["blas"] == STEPS
    assert_agree(fused, pytorch_path(9, dtype, 3, xs, grads), dtype)


def test_an_estimate_with_its_rows_in_a_scratch_tensor_gives_the_same_numbers(calls, monkeypatch):
    monkeypatch.setattr(native, "STACK_ROWS", 4)  # H = 9 passes a scratch tensor instead of the C stack
    xs, grads, h0 = data(3, 9, torch.float64)
    estimator = KFRTRL(make_cell(9, torch.float64), generator=3)
    fused, _ = run(estimator, estimator.initial_state(h0), xs, grads)
    assert calls["gradient"] == STEPS
    assert_agree(fused, pytorch_path(9, torch.float64, 3, xs, grads), torch.float64)


def test_streams_split_over_processes_draw_the_signs_of_one_process(calls):
    xs, grads, h0 = data(4, 6, torch.float64)
    estimator = KFRTRL(make_cell(6, torch.float64), generator=5)
    together, _ = run(estimator, estimator.initial_state(h0), xs, grads)
    with _native.native_kernels(False):
        rows = torch.tensor([1, 3])
        state = estimator.initial_state(h0[rows], stream_ids=rows, total_streams=4)
        reference, _ = run(estimator, state, xs[:, rows], grads[:, rows])
    state = estimator.initial_state(h0[rows], stream_ids=rows, total_streams=4)
    alone, _ = run(estimator, state, xs[:, rows], grads[:, rows])
    assert calls["step"] == 2 * STEPS
    assert_agree(alone, reference, torch.float64)
    h_of_rows = together[:, :24].view(STEPS, 4, 6)[:, rows].reshape(STEPS, -1)
    torch.testing.assert_close(alone[:, :12], h_of_rows, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("continue_fused", [True, False])
def test_a_checkpoint_resumes_exactly(continue_fused, calls):
    xs, grads, h0 = data(2, 8, torch.float64)
    estimator = KFRTRL(make_cell(8, torch.float64), generator=9)
    straight, _ = run(estimator, estimator.initial_state(h0), xs, grads)
    head, state = run(estimator, estimator.initial_state(h0), xs[:3], grads[:3])
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    resumed = KFRTRL(make_cell(8, torch.float64), generator=0).initial_state(h0)  # the saved generator wins
    resumed.load_state_dict(torch.load(buffer))
    with _native.native_kernels(continue_fused):
        tail, _ = run(estimator, resumed, xs[3:], grads[3:])
    if continue_fused:
        assert torch.equal(torch.cat([head, tail]), straight)
    else:
        assert_agree(torch.cat([head, tail]), straight, torch.float64)
    assert calls["step"] == 2 * STEPS if continue_fused else STEPS + 3


# -- where it runs -----------------------------------------------------------------------------------------------
class SameForward(TanhRNNCell):
    """A subclass whose ``forward`` is its own (the same function): the fused step must not assume it."""

    def forward(self, x, h):
        return torch.tanh(self.preactivation(x, h))


class OwnSigns(KFRTRL):
    """A subclass with signs of its own (the same ones): the fused step, which draws them itself, must not run."""

    def _signs(self, state, like):
        return super()._signs(state, like)


@pytest.mark.parametrize("case", ["switched off", "own forward", "generic products", "own signs", "strided input"])
def test_the_pytorch_path_runs_where_the_kernels_do_not_apply(case, calls):
    dtype, hidden = torch.float64, 5
    xs, grads, h0 = data(2, hidden, dtype)
    cell = make_cell(hidden, dtype, SameForward if case == "own forward" else TanhRNNCell)
    kind = OwnSigns if case == "own signs" else KFRTRL
    estimator = kind(cell, generator=3, closed_form=case != "generic products")
    if case == "strided input":
        xs = [torch.cat([x, x], 1)[:, ::2] for x in xs]  # every other column of a wider tensor
        assert not xs[0].is_contiguous()
    with _native.native_kernels(case != "switched off"):
        trace, _ = run(estimator, estimator.initial_state(h0), xs, grads)
    assert calls["step"] == 0
    # The estimate reads only u, A and grad_h: fused wherever the PyTorch step made them C-contiguous (the generic
    # torch.func products, for a forward of its own too, leave A strided).
    assert calls["gradient"] == (STEPS if case in ("own signs", "strided input") else 0)
    assert_agree(trace, pytorch_path(hidden, dtype, 2, xs, grads), dtype)


def test_a_half_precision_state_takes_the_pytorch_path(calls):
    estimator = KFRTRL(make_cell(4, torch.float16), generator=3)
    state = estimator.initial_state(torch.zeros(2, 4, dtype=torch.float16))
    _, state = estimator.step(torch.ones(2, INPUT, dtype=torch.float16), state)
    estimator.gradient(state, torch.ones(2, 4, dtype=torch.float16))
    assert calls["step"] == calls["gradient"] == 0


def test_a_compiled_step_takes_the_pytorch_path(calls):
    xs, grads, h0 = data(2, 4, torch.float64, steps=3)
    estimator = KFRTRL(make_cell(4, torch.float64), generator=3)
    eager, _ = run(estimator, estimator.initial_state(h0), xs, grads)
    calls["step"] = calls["gradient"] = 0
    step = torch.compile(estimator.step, backend="eager")
    state = estimator.initial_state(h0)
    rows = []
    with estimator.noise_scope(state):
        for t in range(xs.shape[0]):
            h, state = step(xs[t], state)
            rows.append(h.flatten())
    assert calls["step"] == 0
    torch.testing.assert_close(torch.stack(rows), eager[:, :8], rtol=1e-12, atol=1e-12)


# -- NaN/inf -----------------------------------------------------------------------------------------------------
def started(check_every=1, steps: int = 2):
    xs, grads, h0 = data(2, 6, torch.float64)
    estimator = KFRTRL(make_cell(6, torch.float64), generator=3)
    estimator.check_every = check_every
    _, state = run(estimator, estimator.initial_state(h0), xs[:steps], grads[:steps])
    return estimator, state, xs, grads


def test_a_nan_input_raises_at_once(calls):
    estimator, state, xs, _ = started()
    x = xs[2].clone()
    x[1, 0] = float("nan")
    with pytest.raises(ValueError, match="x holds NaN or inf"):
        estimator.step(x, state)
    assert calls["step"] == 3  # the fused step met it


def test_a_nan_parameter_is_named(calls):
    estimator, state, xs, _ = started()
    with torch.no_grad():
        estimator.cell.weight_hh[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 3\b.*weight_hh"):
        estimator.step(xs[2], state)
    assert calls["step"] == 3


def test_a_recorded_failure_names_its_step(calls):
    estimator, state, xs, grads = started(check_every=None)
    x = xs[2].clone()
    x[0, 1] = float("inf")
    for t, value in enumerate([x, xs[3], xs[4]]):
        _, state = estimator.step(value, state)  # no error while recording: the NaN spreads into later steps
        estimator.gradient(state, grads[2 + t])
    assert calls["step"] == 5
    with pytest.raises(ValueError, match=r"x held NaN or inf values at step 3\b"):
        estimator.check(state)


def test_a_nan_grad_h_raises(calls):
    estimator, state, _, grads = started()
    grad_h = grads[2].clone()
    grad_h[1, 2] = float("nan")
    with pytest.raises(ValueError, match="grad_h holds NaN or inf"):
        estimator.gradient(state, grad_h)
    assert calls["gradient"] == 3


def test_a_finite_step_returns_its_verdict():
    estimator, state, xs, _ = started()
    advance = estimator._fused_step(xs[2], state)
    t = advance.tensors
    expected = sum(float(v.sum()) for v in (xs[2], advance.h_new, t["input_factor"], t["hidden_factor"]))
    assert advance.verdict == pytest.approx(expected, rel=1e-12, abs=1e-12)


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


def by_parameter(estimator, state, xs, grads, update_at=None):
    """``([(h, gradient() as returned)] per step, state)``; the parameters move before step ``update_at``."""
    trace = []
    for t in range(len(xs)):
        if t == update_at:
            update(estimator.cell)
        h, state = estimator.step(xs[t], state)
        trace.append((h, estimator.gradient(state, grads[t])))
    return trace, state


def assert_by_parameter_agree(ours, theirs, dtype):
    for t, ((h, grads), (h_ref, grads_ref)) in enumerate(zip(ours, theirs, strict=True)):
        assert_agree(h[None], h_ref[None], dtype)
        assert list(grads) == list(grads_ref), t  # the names in the order of cell.named_parameters()
        for name, value in grads.items():
            assert value.shape == grads_ref[name].shape and value.is_contiguous(), (t, name)
            assert_agree(value.flatten()[None], grads_ref[name].flatten()[None], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
def test_the_fast_lane_gives_what_the_pytorch_path_gives_by_parameter(dtype, streams):
    xs, grads, h0 = data(streams, 7, dtype)
    traces = []
    for kernels in (True, False):
        estimator = KFRTRL(make_cell(7, dtype), generator=3)
        counts = spied(estimator)
        with _native.native_kernels(kernels):
            traces.append(by_parameter(estimator, estimator.initial_state(h0), xs, grads, update_at=3)[0])
        assert counts == ({"step": STEPS, "gradient": STEPS} if kernels else {"step": 0, "gradient": 0})
    assert_by_parameter_agree(*traces, dtype)
    assert list(traces[0][0][1]) == [name for name, _ in make_cell(7, dtype).named_parameters()]


def test_the_fast_lane_follows_the_cell_to_float64():
    xs, grads, h0 = data(2, 6, torch.float64)
    traces = []
    for kernels in (True, False):
        cell = make_cell(6, torch.float32)
        estimator = KFRTRL(cell, generator=5)
        counts = spied(estimator)
        with _native.native_kernels(kernels):
            state = estimator.initial_state(h0.float())
            by_parameter(estimator, state, xs[:2].float(), grads[:2].float())
            cell.double()  # the same parameter objects, new memory of another dtype
            traces.append(by_parameter(estimator, estimator.initial_state(h0), xs, grads)[0])
        assert counts == ({"step": STEPS + 2, "gradient": STEPS + 2} if kernels else {"step": 0, "gradient": 0})
    assert_by_parameter_agree(*traces, torch.float64)


def test_a_blas_product_runs_in_the_call_context_not_in_the_fast_lane(calls, monkeypatch):
    """From BLAS_PRODUCT_MIN the step's W_h A is a PyTorch op: the fast lane declines it and the template's
    _advance_step runs it, autograd off, on the estimator's thread count."""
    monkeypatch.setattr(module, "BLAS_PRODUCT_MIN", 1)
    xs, grads, h0 = data(2, 5, torch.float64)
    estimator = KFRTRL(make_cell(5, torch.float64), generator=3)
    counts = spied(estimator)
    state = estimator.initial_state(h0)
    assert estimator._fused_step(xs[0], state) is None
    for t in range(3):
        _, state = estimator.step(xs[t], state)
        estimator.gradient(state, grads[t])
    assert calls["blas"] == 3 and counts == {"step": 0, "gradient": 3}
    assert all(value.grad_fn is None and not value.requires_grad for value in state.tensors.values())


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("3-D x", "x must be"),
        ("x of another dtype", "x is torch.float32"),
        ("x of another width", r"x must have shape \(2, 3\)"),
        ("x of other streams", r"x must have shape \(2, "),
    ],
)
def test_the_fast_lane_declines_an_input_the_template_refuses(case, message):
    estimator, state, xs, _ = started()
    x = {
        "3-D x": xs[2][None],
        "x of another dtype": xs[2].float(),
        "x of another width": torch.cat([xs[2], xs[2]], 1),
        "x of other streams": xs[2][:1],
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
        "another shape": grads[2][:1],
        "another dtype": grads[2].float(),
        "3-D": grads[2][None],
        "not a tensor": grads[2].tolist(),
    }[case]
    assert estimator._fused_gradient(state, grad_h) is None
    with pytest.raises(ValueError, match="grad_h"):
        estimator.gradient(state, grad_h)


@pytest.mark.parametrize("name", ["h", "input_factor", "hidden_factor"])
def test_a_state_made_by_hand_with_a_strided_tensor_takes_the_pytorch_path(name):
    estimator, state, xs, grads = started()
    tensors = {"h": state.h, **state.tensors}
    value = tensors[name]
    strided = torch.stack([value, value], -1).flatten(-2)[..., ::2]  # the same values, every other column
    assert not strided.is_contiguous() and torch.equal(strided, value)
    tensors[name] = strided
    by_hand = state.replace(h=tensors.pop("h"), tensors=tensors)
    assert estimator._fused_step(xs[2], by_hand) is None
    if name != "h":
        assert estimator._fused_gradient(by_hand, grads[2]) is None
    generator = state.generator.get_state()  # (shared by both states)
    ours = by_parameter(estimator, by_hand, xs[2:4], grads[2:4])[0]
    state.generator.set_state(generator)
    with _native.native_kernels(False):
        theirs = by_parameter(estimator, state, xs[2:4], grads[2:4])[0]
    assert_by_parameter_agree(ours, theirs, torch.float64)


def test_the_fast_lane_is_off_for_a_step_or_an_estimate_of_its_own():
    class OwnStep(KFRTRL):
        def _advance_step(self, x, state):
            return super()._advance_step(x, state)

    class OwnEstimate(KFRTRL):
        def _gradient_estimate(self, state, grad_h):
            return super()._gradient_estimate(state, grad_h)

    own_step = OwnStep(make_cell(4, torch.float64), generator=0)
    assert not own_step._fused and own_step._fuses_gradient
    own_estimate = OwnEstimate(make_cell(4, torch.float64), generator=0)
    assert own_estimate._fused and not own_estimate._fuses_gradient
    state = own_step.initial_state(torch.zeros(2, 4, dtype=torch.float64))
    assert own_step._fused_step(torch.zeros(2, INPUT, dtype=torch.float64), state) is None


def test_a_parametrised_cell_leaves_the_fast_lane():
    from torch.nn.utils import parametrize  # noqa: PLC0415

    class Scaled(torch.nn.Module):
        def forward(self, weight):
            return 2 * weight

    estimator, state, xs, _ = started()
    parametrize.register_parametrization(estimator.cell, "weight_hh", Scaled())
    assert estimator._fused_step(xs[2], state) is None  # the class is swapped: the weights are no longer these


def test_a_nan_verdict_is_settled_by_the_template_from_the_one_draw(calls):
    estimator, state, xs, _ = started()
    x = xs[2].clone()
    x[1, 0] = float("inf")
    generator = state.generator.get_state()
    with pytest.raises(ValueError, match="x holds NaN or inf"):
        estimator.step(x, state)
    after = state.generator.get_state()
    state.generator.set_state(generator)
    estimator._sign_bits(state, x)  # one draw: what the failed step drew
    assert torch.equal(state.generator.get_state(), after)
    assert calls["step"] == 3


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_estimator_steps_on_as_the_original(how):
    import copy  # noqa: PLC0415
    import pickle  # noqa: PLC0415

    estimator, state, xs, grads = started()
    copied = copy.deepcopy(estimator) if how == "deepcopy" else pickle.loads(pickle.dumps(estimator))
    counts = spied(copied)
    saved = state.state_dict()
    ours = by_parameter(estimator, state, xs[2:], grads[2:])[0]
    resumed = copied.initial_state(state.h)
    resumed.load_state_dict(saved)
    theirs = by_parameter(copied, resumed, xs[2:], grads[2:])[0]
    assert counts == {"step": STEPS - 2, "gradient": STEPS - 2}
    for (h, grads_ours), (h_ref, grads_ref) in zip(ours, theirs, strict=True):
        assert torch.equal(h, h_ref) and all(torch.equal(grads_ours[n], grads_ref[n]) for n in grads_ref)
