"""The fused steps and estimates of RFLO's and SnAp-1's factored traces on a TanhRNNCell (one C call each:
lightning_ortho._native.factored_traces) against the PyTorch path (``native_kernels(False)``): the same states,
traces and estimates over several steps, at one and several streams, across a parameter update and a checkpoint;
that the kernels run where they may and not where they must not; NaN/inf raised or recorded as before."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from lightning_ortho import _native
from lightning_ortho._native import factored_traces, native_kernels
from lightning_ortho.online import RFLO, SnAp, TanhRNNCell

INPUT, HIDDEN, STEPS = 3, 5, 6
TOL = {torch.float64: {"rtol": 1e-12, "atol": 1e-12}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}
ESTIMATORS = {
    "rflo": lambda cell: RFLO(cell, tau=2.0),
    "rflo_tau3": lambda cell: RFLO(cell, tau=3.0),
    "snap1": lambda cell: SnAp(cell, order=1),
    "snap1_dense": lambda cell: SnAp(cell, order=1, product="dense"),
}
ENTRY = {"rflo": "trace", "snap": "influence"}


@pytest.fixture(autouse=True)
def kernels_available(monkeypatch):
    """The kernels on (whatever ``LIGHTNING_ORTHO_NATIVE`` the suite runs with: these tests are about them)."""
    monkeypatch.setenv("LIGHTNING_ORTHO_NATIVE", "1")
    _native.load.cache_clear()
    if _native.load("factored_traces") is None:
        pytest.skip("the C kernels are not available on this machine (no C compiler)")
    yield
    _native.load.cache_clear()


@pytest.fixture
def calls(monkeypatch):
    """The names of the C functions called (``rflo_step``, ``snap1_step``, ``gradient``), in order."""
    seen: list[str] = []
    getter = factored_traces.factored_trace_kernels

    def spy(*tensors):
        kernels = getter(*tensors)
        if kernels is None:
            return None
        return tuple(
            _recording(seen, name, f) for name, f in zip(("rflo_step", "snap1_step", "gradient"), kernels, strict=True)
        )

    monkeypatch.setattr(factored_traces, "factored_trace_kernels", spy)
    return seen


def _recording(seen: list[str], name: str, function):
    def call(*args):
        seen.append(name)
        return function(*args)

    return call


def make_cell(dtype=torch.float64, cls=TanhRNNCell) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(INPUT, HIDDEN).to(dtype)


def data(streams: int, dtype=torch.float64, steps: int = STEPS):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, streams, INPUT, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.randn(steps, streams, HIDDEN, generator=g, dtype=torch.float64).to(dtype)
    h0 = (0.5 * torch.randn(streams, HIDDEN, generator=g, dtype=torch.float64)).to(dtype)
    return xs, grads, h0


def run(estimator, xs, grads, state, update_at: int | None = None):
    """Every step's ``h``, state entry and summed estimate (flat); the parameters move before step ``update_at``
    (in place, as an optimiser moves them)."""
    out = []
    for t in range(xs.shape[0]):
        if t == update_at:
            with torch.no_grad():
                for p in estimator.cell.parameters():
                    p.mul_(0.9).add_(0.05)
        h, state = estimator.step(xs[t], state)
        estimate = estimator.gradient(state, grads[t])
        (tensor,) = state.tensors.values()
        out.append({"h": h, "state": tensor, "estimate": estimator.layout.flatten(estimate, lead=0)})
    return out, state


def assert_same(fused, plain, dtype):
    for t, (a, b) in enumerate(zip(fused, plain, strict=True)):
        for name in a:
            torch.testing.assert_close(a[name], b[name], **TOL[dtype], msg=f"{name} at step {t + 1}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_the_fused_path_computes_what_the_pytorch_path_computes(name, streams, dtype, calls):
    xs, grads, h0 = data(streams, dtype)
    results = []
    for on in (True, False):
        cell = make_cell(dtype)
        estimator = ESTIMATORS[name](cell)
        assert estimator._fused is not None
        with native_kernels(on):
            results.append(run(estimator, xs, grads, estimator.initial_state(h0), update_at=3)[0])
    assert_same(*results, dtype)
    step = "snap1_step" if name.startswith("snap") else "rflo_step"
    assert calls == [step, "gradient"] * STEPS  # one C call per step, one per estimate; none with the kernels off
    assert results[0][-1]["estimate"].abs().max() > 0


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_a_checkpoint_resumes_the_same_on_either_path(name, calls):
    cell = make_cell()
    xs, grads, h0 = data(3)
    estimator = ESTIMATORS[name](cell)
    straight, _ = run(estimator, xs, grads, estimator.initial_state(h0))
    _, head = run(estimator, xs[:3], grads[:3], estimator.initial_state(h0))
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    for on in (True, False):
        resumed = ESTIMATORS[name](cell)
        state = resumed.initial_state(h0)
        state.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
        with native_kernels(on):
            tail, _ = run(resumed, xs[3:], grads[3:], state)
        assert_same(tail, straight[3:], torch.float64)


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_the_state_passed_in_is_left_as_it_was(name):
    estimator = ESTIMATORS[name](make_cell())
    xs, grads, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    before = {"h": state.h.clone(), **{k: v.clone() for k, v in state.tensors.items()}}
    for _ in range(2):  # twice from the same state: the same new state
        h, new = estimator.step(xs[1], state)
        torch.testing.assert_close(h, estimator.step(xs[1], state)[0], rtol=0, atol=0)
    assert torch.equal(state.h, before["h"])
    for key, value in state.tensors.items():
        assert torch.equal(value, before[key])
        assert new.tensors[key] is not value


def test_parameters_moved_or_converted_between_steps_are_read_afresh(calls):
    """The kernels remember the parameters they checked: a ``.data`` assignment (new memory) and ``cell.float()``
    (a dtype the state no longer has: the template then refuses the step, as on the PyTorch path) must be seen."""
    cell = make_cell()
    estimator = RFLO(cell, tau=2.0)
    xs, grads, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    with torch.no_grad():
        cell.weight_hh.data = 2 * cell.weight_hh.data  # new memory behind the same Parameter object
    fused = estimator.step(xs[1], state)
    with native_kernels(False):
        plain = estimator.step(xs[1], state)
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused[1].tensors["trace"], plain[1].tensors["trace"], rtol=1e-12, atol=1e-12)
    assert calls.count("rflo_step") == 2
    cell.float()
    with pytest.raises(Exception) as fused_error:
        estimator.step(xs[1], state)
    with native_kernels(False), pytest.raises(Exception) as plain_error:
        estimator.step(xs[1], state)
    assert type(fused_error.value) is type(plain_error.value)
    assert calls.count("rflo_step") == 2


class _ForwardOverridden(TanhRNNCell):
    """Another step than tanh(W_h h + W_x x + b): no fused path may take it."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * h + 0.5 * super().forward(x, h)


class _Doubled(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 2 * weight


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_the_fused_path_declines_where_it_must(name, calls):
    xs, grads, h0 = data(2)
    # the switch
    estimator = ESTIMATORS[name](make_cell())
    with native_kernels(False):
        run(estimator, xs[:2], grads[:2], estimator.initial_state(h0))
    assert calls == []
    # a cell whose step is another, the generic path, a parametrisation registered after construction
    assert ESTIMATORS[name](make_cell(cls=_ForwardOverridden))._fused is None
    generic = RFLO(make_cell(), tau=2.0, closed_form=False) if name == "rflo" else SnAp(make_cell(), closed_form=False)
    assert generic._fused is None
    cell = make_cell()
    estimator = ESTIMATORS[name](cell)
    state = estimator.initial_state(h0)
    before = estimator.step(xs[0], state)[0]
    assert len(calls) == 1
    torch.nn.utils.parametrize.register_parametrization(cell, "weight_hh", _Doubled())
    outcomes = []
    for on in (True, False):  # the PyTorch path's answer (today an error: the closed form reads weight_hh)
        with native_kernels(on):
            try:
                outcomes.append(estimator.step(xs[0], state)[0])
            except Exception as error:  # noqa: BLE001 - compared below
                outcomes.append(type(error))
    assert len(calls) == 1  # declined: the class changed, W_h is no longer the parameter
    if isinstance(outcomes[0], torch.Tensor):
        torch.testing.assert_close(outcomes[0], outcomes[1], rtol=0, atol=0)
        assert not torch.allclose(outcomes[0], before)
    else:
        assert outcomes[0] is outcomes[1]
    # non-contiguous input
    calls.clear()
    estimator = ESTIMATORS[name](make_cell())
    x = torch.randn(INPUT, 2, dtype=torch.float64).T
    estimator.step(x, estimator.initial_state(h0))
    assert calls == []


def test_snap_with_a_pattern_other_than_the_factored_trace_is_not_fused():
    class Declared(TanhRNNCell):
        """Declares that no unit reads itself (W_h's diagonal kept at zero)."""

        def jacobian_pattern(self):
            state = ~torch.eye(HIDDEN, dtype=torch.bool)
            parameter = torch.zeros(HIDDEN, HIDDEN * (HIDDEN + INPUT + 1), dtype=torch.bool)
            for k in range(HIDDEN):
                parameter[k, k * HIDDEN : (k + 1) * HIDDEN] = True
                parameter[k, HIDDEN * HIDDEN + k * INPUT : HIDDEN * HIDDEN + (k + 1) * INPUT] = True
                parameter[k, HIDDEN * (HIDDEN + INPUT) + k] = True
            return state, parameter

    assert SnAp(make_cell(cls=Declared), order=1)._fused is None
    assert SnAp(make_cell(cls=Declared), order=2)._fused is None  # reach through J: other kept entries
    assert SnAp(make_cell(), order=2)._fused is None  # a dense W_h: SnAp-2 is RTRL


def test_a_compiled_step_takes_the_pytorch_path(calls):
    estimator = RFLO(make_cell(), tau=2.0)
    estimator.check_every = None
    xs, grads, h0 = data(2)
    state = estimator.initial_state(h0)

    def step_and_gradient(x, state, grad_h):
        h, state = estimator.step(x, state)
        return h, state, estimator.gradient(state, grad_h)

    compiled = torch.compile(step_and_gradient, backend="eager")
    h, new, estimate = compiled(xs[0], state, grads[0])
    assert calls == []
    with native_kernels(False):
        expected = step_and_gradient(xs[0], state, grads[0])
    torch.testing.assert_close(h, expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(estimate, expected[2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["rflo", "snap1"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_input_raises_at_once_and_leaves_the_state_as_it_was(name, bad, calls):
    estimator = ESTIMATORS[name](make_cell())
    xs, _, h0 = data(3)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    before = {k: v.clone() for k, v in state.tensors.items()}
    x = xs[1].clone()
    x[2, 1] = bad
    with pytest.raises(ValueError, match=f"{type(estimator).__name__}: x holds NaN or inf values"):
        estimator.step(x, state)
    assert calls.count("gradient") == 0 and len(calls) == 2  # the fused step ran, and found it
    for key, value in before.items():
        assert torch.equal(state.tensors[key], value)


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_a_nan_parameter_is_named(name, calls):
    cell = make_cell()
    estimator = ESTIMATORS[name](cell)
    xs, _, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    with torch.no_grad():
        cell.weight_ih[1, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 2.*\['weight_ih'\]"):
        estimator.step(xs[1], state)
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_recorded_failures_name_their_step(name, calls):
    estimator = ESTIMATORS[name](make_cell())
    estimator.check_every = None
    xs, grads, h0 = data(2)
    xs[2, 1, 0] = float("nan")  # step 3
    state = estimator.initial_state(h0)
    for t in range(STEPS):
        _, state = estimator.step(xs[t], state)
    with pytest.raises(ValueError, match=r"step: x held NaN or inf values at step 3\b"):
        estimator.check(state)
    assert calls.count("rflo_step" if name == "rflo" else "snap1_step") == STEPS


@pytest.mark.parametrize("name", ["rflo", "snap1"])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_a_nan_grad_h_raises_the_gradient_s_error(name, bad, calls):
    estimator = ESTIMATORS[name](make_cell())
    xs, grads, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    grad_h = grads[0].clone()
    grad_h[1, 3] = bad
    with pytest.raises(ValueError, match=f"{type(estimator).__name__}: grad_h holds NaN or inf values"):
        estimator.gradient(state, grad_h)
    assert calls[-1] == "gradient"


def test_a_finite_trace_whose_sum_overflows_is_no_error():
    cell = make_cell(torch.float32)
    estimator = RFLO(cell, tau=2.0)
    xs, grads, h0 = data(2, torch.float32)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    state.tensors["trace"].fill_(3e38)  # the next trace is 1.5e38 + (d a) / 2 entry by entry: finite, its sum not
    _, state = estimator.step(xs[1], state)
    assert torch.isfinite(state.tensors["trace"]).all()
    estimate = estimator.gradient(state, torch.full_like(grads[0], 1e-3))
    assert all(torch.isfinite(v).all() for v in estimate.values())


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_state_tensors_moved_in_place_are_never_read_at_their_old_address(name, calls):
    """The kernels remember the tensors of the state they made; ``set_`` (or ``resize_``) moves one to new memory:
    the step must not read the old address (it declines to the PyTorch path, which reads the new one)."""
    estimator = ESTIMATORS[name](make_cell())
    xs, grads, h0 = data(2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    (key,) = state.tensors
    moved = state.tensors[key].clone()
    state.tensors[key].set_(moved.clone())  # the same values at another address; the old memory is freed
    state.h.set_(state.h.clone())
    with native_kernels(False):
        expected_h, expected = estimator.step(xs[1], state)
        expected_estimate = estimator.gradient(state, grads[1])
    h, new = estimator.step(xs[1], state)
    estimate = estimator.gradient(state, grads[1])
    assert calls == ["rflo_step" if name == "rflo" else "snap1_step"]  # the first step only: then declined
    torch.testing.assert_close(h, expected_h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new.tensors[key], expected.tensors[key], rtol=1e-12, atol=1e-12)
    for part, value in estimate.items():
        torch.testing.assert_close(value, expected_estimate[part], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_a_copied_or_pickled_estimator_steps_on_its_own_cell(name, calls):
    estimator = ESTIMATORS[name](make_cell())
    xs, grads, h0 = data(2)
    expected, _ = run(estimator, xs[:3], grads[:3], estimator.initial_state(h0))
    for other in (copy.deepcopy(estimator), pickle.loads(pickle.dumps(estimator))):
        assert other._fused.cell is other.cell is not estimator.cell
        got, _ = run(other, xs[:3], grads[:3], other.initial_state(h0))
        assert_same(got, expected, torch.float64)
    assert len(calls) == 3 * 2 * 3


@pytest.mark.parametrize("name", ["rflo", "snap1"])
def test_under_cpu_autocast_the_pytorch_path_runs(name, calls):
    """Autocast changes what the PyTorch path computes (bfloat16 products, which the step refuses as a change of
    dtype): the kernels, which would step on in float32, stand aside."""
    estimator = ESTIMATORS[name](make_cell(torch.float32))
    xs, _, h0 = data(2, torch.float32)
    state = estimator.initial_state(h0)
    outcomes = []
    for on in (True, False):
        with native_kernels(on), torch.autocast("cpu", dtype=torch.bfloat16):
            try:
                outcomes.append(estimator.step(xs[0], state)[0])
            except ValueError as error:
                outcomes.append(str(error))
    assert calls == []
    assert outcomes[0] == outcomes[1] if isinstance(outcomes[0], str) else torch.equal(outcomes[0], outcomes[1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_the_common_case_runs_in_c_and_computes_what_the_python_path_computes(name, dtype, monkeypatch):
    """The steps after the first (the state made at the last step, the parameters as armed, also after an in-place
    update) and every estimate are answered by the extension's C call, bit for bit what the Python path computes."""
    if factored_traces.fastcall() is None:
        pytest.skip("the extension is not available here (no Python.h or no C compiler): the Python path runs")
    answered = {"step": 0, "gradient": 0}
    arm = factored_traces.FactoredTanhTrace._arm_fast

    def counting_arm(self, *args):
        arm(self, *args)
        step, gradient = self._fast_step, self._fast_gradient
        if step is None:  # (the run without the extension)
            return

        def counted(kind, call):
            def answer(*arguments):
                done = call(*arguments)
                answered[kind] += done is not None
                return done

            return answer

        self._fast_step, self._fast_gradient = counted("step", step), counted("gradient", gradient)

    xs, grads, h0 = data(2, dtype)
    results = []
    for extension in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(factored_traces.FactoredTanhTrace, "_arm_fast", counting_arm)
            if not extension:
                patch.setattr(factored_traces, "fastcall", lambda: None)
            estimator = ESTIMATORS[name](make_cell(dtype))
            results.append(run(estimator, xs, grads, estimator.initial_state(h0), update_at=3)[0])
    assert answered == {"step": STEPS - 1, "gradient": STEPS}
    for t, (a, b) in enumerate(zip(*results, strict=True)):
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key} at step {t + 1}"
