"""TruncatedBPTT's fused step and gradient on a TanhRNNCell (one C call each, lightning_ortho._native.tbptt) against
the PyTorch path (the same estimator with the kernels off) and against autograd through the window: windows filling
and full, one stream and several, resets, parameter updates between steps (in place, and behind the version counter),
checkpoints; where the fused path must decline; NaN/inf errors as before."""

from __future__ import annotations

import io

import pytest
import torch

import lightning_ortho._native.tbptt as native_tbptt
from lightning_ortho._native import native_kernels
from lightning_ortho.online import TanhRNNCell, TruncatedBPTT
from lightning_ortho.online import tbptt as tbptt_module

from . import references as ref

INPUT, HIDDEN, STEPS = 3, 5, 7
TOL = {
    torch.float64: {"rtol": 1e-12, "atol": 1e-13},
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
}


@pytest.fixture(autouse=True)
def kernels_on():
    """The kernels on whatever LIGHTNING_ORTHO_NATIVE says (CI runs these files again with it set to 0); they must
    build here (a C compiler), else the fused path cannot be tested."""
    with native_kernels(True):
        if tbptt_module.tbptt_tanh_kernels(torch.zeros(1, dtype=torch.float64)) is None:
            pytest.skip("the C kernels are not available on this machine (no C compiler)")
        yield


@pytest.fixture
def calls(monkeypatch):
    """``{"step": n, "gradient": n}``: how often the fused step and the fused gradient ran."""
    counts = {"step": 0, "gradient": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(tbptt_module, "fused_step", counted("step", tbptt_module.fused_step))
    monkeypatch.setattr(tbptt_module, "summed_gradient", counted("gradient", tbptt_module.summed_gradient))
    return counts


def make_cell(dtype=torch.float64, cls=TanhRNNCell) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(INPUT, HIDDEN).to(dtype)


def data(streams: int, dtype=torch.float64, steps: int = STEPS, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(steps, streams, INPUT, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.randn(steps, streams, HIDDEN, generator=g, dtype=torch.float64).to(dtype)
    h0 = (0.5 * torch.randn(streams, HIDDEN, generator=g, dtype=torch.float64)).to(dtype)
    return xs, grads, h0


def update_parameters(cell, t: int, how: str) -> None:
    """Change the parameters between steps: ``"in_place"`` as an optimiser does (the version counter counts it),
    ``"data"`` through ``.data`` (it does not), ``"replace"`` with new ``Parameter`` objects."""
    if how == "none":
        return
    g = torch.Generator().manual_seed(100 + t)
    for name, p in list(cell.named_parameters()):
        step = 0.05 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        if how == "in_place":
            with torch.no_grad():
                p.add_(step)
        elif how == "data":
            p.data.add_(step)
        else:
            setattr(cell, name, torch.nn.Parameter(p.detach() + step))


def assert_same_step(ours, theirs, dtype, t):
    (h, state), (h_ref, state_ref) = ours, theirs
    torch.testing.assert_close(h, h_ref, **TOL[dtype], msg=f"h at step {t}")
    assert state.tensors.keys() == state_ref.tensors.keys()
    for name, value in state_ref.tensors.items():
        assert state.tensors[name].shape == value.shape and state.tensors[name].dtype == value.dtype, name
        torch.testing.assert_close(state.tensors[name], value, **TOL[dtype], msg=f"{name} at step {t}")


def assert_same_gradient(ours, theirs, dtype, what):
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name].shape == value.shape, name
        torch.testing.assert_close(ours[name], value, **TOL[dtype], msg=f"gradient of {name} {what}")


def lockstep(cell, k, xs, grads, h0, *, update="none", reset_at=None, every_gradient=True):
    """The fused estimator and the same estimator with the kernels off, step by step from the same states, the
    parameters updated between steps (both see the update); returns the number of compared steps."""
    fused, plain = TruncatedBPTT(cell, k), TruncatedBPTT(cell, k)
    dtype = h0.dtype
    ours, theirs = fused.initial_state(h0), plain.initial_state(h0)
    for t in range(xs.shape[0]):
        if t and t % 2 == 0:
            update_parameters(cell, t, update)
        if t == reset_at:
            mask = torch.zeros(h0.shape[0], dtype=torch.bool)
            mask[-1] = True
            ours = fused.reset(ours, mask, h0[0])
            theirs = plain.reset(theirs, mask, h0[0])
        stepped = fused.step(xs[t], ours)
        with native_kernels(False):
            stepped_ref = plain.step(xs[t], theirs)
        assert_same_step(stepped, stepped_ref, dtype, t + 1)
        ours, theirs = stepped[1], stepped_ref[1]
        if every_gradient or t == xs.shape[0] - 1:
            gradient = fused.gradient(ours, grads[t])
            with native_kernels(False):
                gradient_ref = plain.gradient(theirs, grads[t])
            assert_same_gradient(gradient, gradient_ref, dtype, f"at step {t + 1}")
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("k", [1, 3, STEPS + 2])  # a window that fills and slides, and one that never fills
@pytest.mark.parametrize("update", ["none", "in_place", "data", "replace"])
def test_the_fused_path_gives_what_the_pytorch_path_gives(dtype, streams, k, update, calls):
    cell = make_cell(dtype)
    xs, grads, h0 = data(streams, dtype)
    lockstep(cell, k, xs, grads, h0, update=update)
    assert calls == {"step": STEPS, "gradient": STEPS}  # the kernels ran; the PyTorch path ran apart


@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("k", [2, 4])
def test_a_reset_inside_the_window_cuts_the_fused_gradient_as_the_pytorch_path_does(streams, k, calls):
    cell = make_cell()
    xs, grads, h0 = data(streams)
    lockstep(cell, k, xs, grads, h0, reset_at=3)
    lockstep(cell, k, xs, grads, h0, reset_at=3, update="in_place")
    assert calls["step"] == calls["gradient"] == 2 * STEPS


@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("k", [2, STEPS, STEPS + 3])  # full windows, and windows never full (BPTT exactly)
@pytest.mark.parametrize("reset", [False, True])
def test_the_fused_gradient_is_autograd_through_the_window(streams, k, reset, calls):
    cell = make_cell()
    xs, h0, cots = ref.sequence(cell, STEPS, streams, seed=3)
    resets = None
    if reset:
        mask = torch.zeros(streams, dtype=torch.bool)
        mask[0] = True
        resets = {4: (mask, torch.full((HIDDEN,), 0.25, dtype=torch.float64))}
    expected = ref.truncated_gradient(cell, xs, h0, cots, k, resets=resets)
    estimator = TruncatedBPTT(cell, k)
    state, total = estimator.initial_state(h0), 0.0
    for t in range(STEPS):
        if resets and t in resets:
            state = estimator.reset(state, *resets[t])
        _, state = estimator.step(xs[t], state)
        total = total + ref.flatten_dict(estimator.gradient(state, cots[t]), cell)
    torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-13)
    assert state.tensors["inputs"].shape == (streams, min(k, STEPS), INPUT)
    assert calls == {"step": STEPS, "gradient": STEPS}


def test_a_gradient_on_an_earlier_state_or_a_branch_replays_its_own_window(calls):
    """The window holds the states of the current parameters only for the state the last step returned: any other
    state (an earlier one, a sibling stepped from the same state) gets its window replayed."""
    cell = make_cell()
    xs, grads, h0 = data(3)
    estimator = TruncatedBPTT(cell, 3)
    states = [estimator.initial_state(h0)]
    for t in range(5):
        states.append(estimator.step(xs[t], states[-1])[1])
    _, sibling = estimator.step(xs[6], states[4])  # a branch: states[5] is no longer the last state stepped
    update_parameters(cell, 0, "data")  # behind the version counter: only the bits tell
    with native_kernels(False):
        expected = [estimator.gradient(s, grads[0]) for s in (*states[1:], sibling)]
    for s, want in zip((*states[1:], sibling), expected, strict=True):
        assert_same_gradient(estimator.gradient(s, grads[0]), want, torch.float64, "on a stored state")
    assert calls["gradient"] == 6


def test_a_state_changed_in_place_after_its_step_is_replayed(calls):
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 3)
    state = estimator.initial_state(h0)
    for t in range(4):
        _, state = estimator.step(xs[t], state)
    state.tensors["inputs"].mul_(2)  # the stored states no longer follow from the window
    with native_kernels(False):
        expected = estimator.gradient(state, grads[0])
    assert_same_gradient(estimator.gradient(state, grads[0]), expected, torch.float64, "after an in-place change")


@pytest.mark.parametrize("k", [2, 4])
def test_a_checkpoint_resumes_the_same_run_on_either_path(k, calls):
    cell = make_cell()
    xs, grads, h0 = data(3)
    estimator = TruncatedBPTT(cell, k)
    straight, gradients = estimator.initial_state(h0), []
    for t in range(STEPS):
        _, straight = estimator.step(xs[t], straight)
        gradients.append(estimator.gradient(straight, grads[t]))
        if t == 2:
            buffer = io.BytesIO()
            torch.save(straight.state_dict(), buffer)
    for native in (True, False):
        resumed = estimator.initial_state(h0)
        resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
        with native_kernels(native):
            for t in range(3, STEPS):
                _, resumed = estimator.step(xs[t], resumed)
                assert_same_gradient(estimator.gradient(resumed, grads[t]), gradients[t], torch.float64, "resumed")
    for name, value in straight.tensors.items():
        torch.testing.assert_close(resumed.tensors[name], value, rtol=1e-13, atol=1e-14, msg=name)


def test_a_state_stepped_by_the_pytorch_path_continues_on_the_fused_path(calls):
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 3)
    state = estimator.initial_state(h0)
    with native_kernels(False):
        for t in range(2):
            _, state = estimator.step(xs[t], state)
    ours, theirs = state, state
    for t in range(2, STEPS):
        ours = estimator.step(xs[t], ours)[1]
        gradient = estimator.gradient(ours, grads[t])
        with native_kernels(False):
            theirs = estimator.step(xs[t], theirs)[1]
            assert_same_gradient(gradient, estimator.gradient(theirs, grads[t]), torch.float64, f"at step {t + 1}")
    assert calls == {"step": STEPS - 2, "gradient": STEPS - 2}


def test_the_fused_step_leaves_the_state_it_was_given_as_it_was(calls):
    cell = make_cell()
    xs, _, h0 = data(3)
    estimator = TruncatedBPTT(cell, 2)
    state = estimator.initial_state(h0)
    for t in range(3):
        _, state = estimator.step(xs[t], state)
    before = {name: value.clone() for name, value in state.tensors.items()}
    h_before = state.h.clone()
    for t in range(3, 5):
        estimator.step(xs[t], state)
    assert torch.equal(state.h, h_before)
    for name, value in before.items():
        assert torch.equal(state.tensors[name], value), name


def test_steps_and_gradients_under_inference_mode(calls):
    """Inference tensors have no version counter: every gradient replays its window (and the PyTorch path, whose
    replay needs autograd, cannot run there at all)."""
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 3)
    with torch.inference_mode():
        state, total = estimator.initial_state(h0), 0.0
        for t in range(STEPS):
            h, state = estimator.step(xs[t], state)
            total = total + ref.flatten_dict(estimator.gradient(state, grads[t]), cell)
        assert h.is_inference()
    torch.testing.assert_close(total.clone(), ref.truncated_gradient(cell, xs, h0, grads, 3), rtol=1e-12, atol=1e-13)
    assert calls == {"step": STEPS, "gradient": STEPS}


# -- where the fused path declines -------------------------------------------------------------------------------------
class _ScaledTanh(TanhRNNCell):
    """Another step than tanh(W_h h + W_x x + b): the fused path must not take it."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * super().forward(x, h)


def _steps(estimator, xs, grads, h0):
    state, out = estimator.initial_state(h0), []
    for t in range(xs.shape[0]):
        h, state = estimator.step(xs[t], state)
        out.append((h, estimator.gradient(state, grads[t])))
    return out


@pytest.mark.parametrize("case", ["switched_off", "subclass", "closed_form_off", "large", "non_contiguous"])
def test_the_fused_path_declines_and_the_pytorch_path_runs(case, calls, monkeypatch):
    cell = make_cell(cls=_ScaledTanh if case == "subclass" else TanhRNNCell)
    xs, grads, h0 = data(3)
    if case == "non_contiguous":
        xs = torch.randn(STEPS, INPUT, 3, dtype=torch.float64).transpose(1, 2)
    if case == "large":
        monkeypatch.setattr(tbptt_module, "FUSED_MAX_WORK", 3 * HIDDEN * (HIDDEN + INPUT) - 1)
    estimator = TruncatedBPTT(cell, 3, closed_form=case != "closed_form_off")
    if case == "switched_off":
        with native_kernels(False):
            got = _steps(estimator, xs, grads, h0)
    else:
        got = _steps(estimator, xs, grads, h0)
    # (the PyTorch step's window is contiguous until it slides: the gradient takes the kernel while it is)
    assert calls["step"] == 0 and (calls["gradient"] == 0 or case == "non_contiguous")
    expected = ref.truncated_gradient(cell, xs, h0, grads, 3)
    total = sum(ref.flatten_dict(g, cell) for _, g in got)
    torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-13)


def test_one_stream_takes_the_fused_path_at_any_size(calls, monkeypatch):
    """One stream has no batch for PyTorch's products to gain from: no size limit."""
    monkeypatch.setattr(tbptt_module, "FUSED_MAX_WORK", 1)
    cell = make_cell()
    xs, grads, h0 = data(1)
    lockstep(cell, 3, xs, grads, h0)
    assert calls == {"step": STEPS, "gradient": STEPS}


def test_a_scratch_too_large_for_the_kernels_stack_comes_from_the_caller(calls, monkeypatch):
    monkeypatch.setattr(native_tbptt, "SMALL_SCRATCH", 0)  # every scratch counts as large
    cell = make_cell()
    xs, grads, h0 = data(3)
    lockstep(cell, 3, xs, grads, h0, update="in_place", reset_at=3)
    assert calls == {"step": STEPS, "gradient": STEPS}


def test_the_fused_path_declines_under_torch_compile(calls):
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 2)
    estimator.check_every = None

    def step_and_gradient(x, state, grad_h):
        h, state = estimator.step(x, state)
        return h, state, estimator.gradient(state, grad_h)

    compiled = torch.compile(step_and_gradient, backend="eager")
    state, total = estimator.initial_state(h0), 0.0
    for t in range(4):
        _, state, gradient = compiled(xs[t], state, grads[t])
        total = total + ref.flatten_dict(gradient, cell)
    estimator.check(state)
    assert calls == {"step": 0, "gradient": 0}
    torch.testing.assert_close(total, ref.truncated_gradient(cell, xs[:4], h0, grads[:4], 2), rtol=1e-12, atol=1e-13)


# -- NaN/inf -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_input_is_a_value_error_at_once_and_leaves_the_state_as_it_was(bad, calls):
    cell = make_cell()
    xs, _, h0 = data(3)
    estimator = TruncatedBPTT(cell, 2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    before = {name: value.clone() for name, value in state.tensors.items()}
    x = xs[1].clone()
    x[1, 2] = bad
    with pytest.raises(ValueError, match="TruncatedBPTT: x holds NaN or inf values"):
        estimator.step(x, state)
    for name, value in before.items():
        assert torch.equal(state.tensors[name], value), name
    assert calls["step"] == 2  # the fused step ran, and its verdict sent the step to the template's checks


def test_a_nan_parameter_is_named_by_the_step_and_by_the_gradient(calls):
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    with torch.no_grad():
        cell.weight_hh[1, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"gradient: the estimate holds NaN/inf at step 1.*\['weight_hh'\]"):
        estimator.gradient(state, grads[0])
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 2.*\['weight_hh'\]"):
        estimator.step(xs[1], state)
    assert calls == {"step": 2, "gradient": 1}


def test_a_recorded_failure_names_its_step(calls):
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 2)
    estimator.check_every = None
    state = estimator.initial_state(h0)
    x = xs[2].clone()
    x[0, 0] = float("nan")
    for t, step_input in enumerate((xs[0], xs[1], x, xs[3])):
        _, state = estimator.step(step_input, state)
        estimator.gradient(state, grads[t])
    with pytest.raises(ValueError, match="x held NaN or inf values at step 3"):
        estimator.check(state)
    assert calls == {"step": 4, "gradient": 4}


@pytest.mark.parametrize("empty_window", [False, True])
def test_a_nan_in_grad_h_is_the_gradient_value_error(empty_window, calls):
    cell = make_cell()
    xs, grads, h0 = data(3)
    estimator = TruncatedBPTT(cell, 2)
    state = estimator.initial_state(h0)
    if not empty_window:
        _, state = estimator.step(xs[0], state)
        state = estimator.reset(state, torch.tensor([False, False, True]))  # NaN in a reset stream counts too
    grad_h = grads[0].clone()
    grad_h[2, 1] = float("nan")
    with pytest.raises(ValueError, match="TruncatedBPTT: grad_h holds NaN or inf values"):
        estimator.gradient(state, grad_h)
    assert calls["gradient"] == 1


@pytest.mark.parametrize("update", ["none", "data"])
def test_the_gradient_reads_the_stored_states_only_while_the_parameters_are_those_of_the_window(update, calls):
    """White box: the states of the window, changed behind its version counter, show in the estimate exactly when the
    gradient takes them instead of replaying (no parameter change since the window's steps, bit for bit)."""
    cell = make_cell()
    xs, grads, h0 = data(2)
    estimator = TruncatedBPTT(cell, 3)
    state = estimator.initial_state(h0)
    for t in range(5):
        _, state = estimator.step(xs[t], state)
    update_parameters(cell, 0, update)
    with native_kernels(False):
        replayed = estimator.gradient(state, grads[0])
    state.tensors["starts"].data[:, 1:] += 0.1  # (.data: a tensor of its own version counter)
    fused = estimator.gradient(state, grads[0])
    if update == "none":
        assert not torch.allclose(fused["weight_hh"], replayed["weight_hh"])
    else:
        assert_same_gradient(fused, replayed, torch.float64, "after a change of the parameters' bits")
