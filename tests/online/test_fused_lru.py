"""DiagonalRTRL's fused step and gradient on the linear recurrent unit (``lightning_ortho/_native/lru.c``, called
through the template's fast lane: ``_fused_step`` / ``_fused_gradient``): the same states, traces and estimates as
the PyTorch path (``LRUTraces``), where the kernel runs and where it declines, and the same NaN/inf errors and
records."""

from __future__ import annotations

import copy
import io
import math
import pickle
import threading

import pytest
import torch
from torch import nn

from lightning_ortho import _native
from lightning_ortho._native import lru as lru_binding
from lightning_ortho._native import native_kernels
from lightning_ortho.online.diagonal_rtrl import DiagonalRTRL
from lightning_ortho.online.lru import LinearRecurrentUnit

INPUT, HIDDEN = 3, 5
COMPLEX = {torch.float64: torch.complex128, torch.float32: torch.complex64}
#: Relative to the largest entry of each tensor: the kernel sums B x in another order than BLAS.
RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """The kernels on, whatever ``LIGHTNING_ORTHO_NATIVE`` the suite runs with (these tests are about them)."""
    monkeypatch.delenv("LIGHTNING_ORTHO_NATIVE", raising=False)
    _native.load.cache_clear()
    with native_kernels(True):
        if lru_binding.lru_kernels(torch.zeros(1, dtype=torch.float64)) is None:
            pytest.skip("the C kernels are not available on this machine (no C compiler)")
        yield
    _native.load.cache_clear()


@pytest.fixture
def fused_calls(monkeypatch) -> dict[str, int]:
    """How often DiagonalRTRL's fused step and gradient ran (the binding answered a result, not ``None``)."""
    counts = {"step": 0, "gradient": 0}

    def counted(name, function):
        def wrapper(*args):
            result = function(*args)
            counts[name] += result is not None
            return result

        return wrapper

    monkeypatch.setattr(lru_binding.FusedLRU, "step", counted("step", lru_binding.FusedLRU.step))
    monkeypatch.setattr(lru_binding.FusedLRU, "gradient", counted("gradient", lru_binding.FusedLRU.gradient))
    return counts


def make_lru(dtype: torch.dtype = torch.float64, seed: int = 0) -> LinearRecurrentUnit:
    torch.manual_seed(seed)
    return LinearRecurrentUnit(INPUT, HIDDEN, r_min=0.5, r_max=0.99).to(dtype)


def data(dtype: torch.dtype, streams: int, steps: int, seed: int = 1):
    """``h0`` ``(B, H)`` complex, inputs ``(T, B, I)`` real, cotangents ``(T, B, H)`` complex."""
    g = torch.Generator().manual_seed(seed)
    h0 = torch.complex(*(0.5 * torch.randn(2, streams, HIDDEN, generator=g, dtype=dtype)))
    xs = torch.randn(steps, streams, INPUT, generator=g, dtype=dtype)
    grads = torch.complex(*torch.randn(2, steps, streams, HIDDEN, generator=g, dtype=dtype))
    return h0, xs, grads


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    scale = max(float(theirs.abs().max()), 1e-30)
    assert float((ours - theirs).abs().max()) <= RTOL[dtype] * scale


def run(estimator, state, xs, grads, native: bool):
    """Steps and gradients from ``state``: ``(states, gradients)``, each step's new state and ``{name: grad}``."""
    states, gradients = [], []
    with native_kernels(native):
        for x, g in zip(xs, grads, strict=True):
            _, state = estimator.step(x, state)
            states.append(state)
            gradients.append(estimator.gradient(state, g))
    return states, gradients


def assert_same_runs(fused, plain, dtype) -> None:
    for ours, theirs in zip(fused[0], plain[0], strict=True):
        assert ours.step == theirs.step
        assert_close(ours.h, theirs.h, dtype)
        assert set(ours.tensors) == set(theirs.tensors) == {"e_units", "e_B"}
        for name in ours.tensors:
            assert_close(ours.tensors[name], theirs.tensors[name], dtype)
    for ours, theirs in zip(fused[1], plain[1], strict=True):
        assert list(ours) == list(theirs)
        for name in ours:
            if name in ("C_re", "C_im", "D"):  # outside the recurrence: zeros on both paths
                assert not ours[name].any() and not theirs[name].any()
            else:
                assert_close(ours[name], theirs[name], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("streams", [1, 3])
def test_the_fused_path_gives_the_pytorch_paths_states_traces_and_estimates(dtype, streams, fused_calls):
    estimator = DiagonalRTRL(make_lru(dtype))
    h0, xs, grads = data(dtype, streams, steps=12)
    fused = run(estimator, estimator.initial_state(h0), xs, grads, native=True)
    assert fused_calls == {"step": 12, "gradient": 12}
    plain = run(estimator, estimator.initial_state(h0), xs, grads, native=False)
    assert fused_calls == {"step": 12, "gradient": 12}  # native_kernels(False): the binding declined
    assert_same_runs(fused, plain, dtype)
    # per_stream=True keeps the PyTorch path; it sums to the fused estimate
    state = fused[0][-1]
    per_stream = estimator.gradient(state, grads[-1], per_stream=True)
    for name, value in fused[1][-1].items():
        assert_close(value, per_stream[name].sum(0), dtype)


def test_more_units_than_one_chunk_of_the_kernel(fused_calls):
    """The kernel takes the units in chunks of 64 (LRU_CHUNK in lru.c): 150 units are two full chunks and a part."""
    torch.manual_seed(0)
    estimator = DiagonalRTRL(LinearRecurrentUnit(INPUT, 150, r_min=0.5, r_max=0.99).double())
    g = torch.Generator().manual_seed(2)
    h0 = torch.complex(*(0.5 * torch.randn(2, 2, 150, generator=g, dtype=torch.float64)))
    xs = torch.randn(5, 2, INPUT, generator=g, dtype=torch.float64)
    grads = torch.complex(*torch.randn(2, 5, 2, 150, generator=g, dtype=torch.float64))
    fused = run(estimator, estimator.initial_state(h0), xs, grads, native=True)
    plain = run(estimator, estimator.initial_state(h0), xs, grads, native=False)
    assert fused_calls == {"step": 5, "gradient": 5}
    assert_same_runs(fused, plain, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_parameter_updates_between_steps_are_seen(dtype, fused_calls):
    """An optimizer step (in place), an update through ``.data`` (no version bump) and a replaced parameter."""
    results = {}
    for native in (True, False):
        cell = make_lru(dtype)
        estimator = DiagonalRTRL(cell)
        optimizer = torch.optim.SGD(cell.parameters(), lr=1e-3)  # larger steps make exp(theta_log) chaotic
        h0, xs, grads = data(dtype, 2, steps=9)
        state, states, gradients = estimator.initial_state(h0), [], []
        with native_kernels(native):
            for t, (x, g) in enumerate(zip(xs, grads, strict=True)):
                _, state = estimator.step(x, state)
                estimate = estimator.gradient(state, g)
                states.append(state)
                gradients.append(estimate)
                for name, p in cell.named_parameters():
                    p.grad = estimate[name].clone()
                optimizer.step()
                if t == 3:
                    cell.nu_log.data.add_(0.1)
                if t == 5:
                    cell.theta_log = nn.Parameter(cell.theta_log.detach() * 0.9)
        results[native] = (states, gradients)
    assert fused_calls == {"step": 9, "gradient": 9}
    assert_same_runs(results[True], results[False], dtype)


def test_a_saved_state_continues_bit_for_bit(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 2, steps=10)
    first = run(estimator, estimator.initial_state(h0), xs[:4], grads[:4], native=True)
    buffer = io.BytesIO()
    torch.save(first[0][-1].state_dict(), buffer)
    buffer.seek(0)
    resumed = estimator.initial_state(torch.zeros_like(h0))
    resumed.load_state_dict(torch.load(buffer))
    uninterrupted = run(estimator, first[0][-1], xs[4:], grads[4:], native=True)
    after_load = run(estimator, resumed, xs[4:], grads[4:], native=True)
    assert fused_calls == {"step": 16, "gradient": 16}
    for ours, theirs in zip(after_load[0], uninterrupted[0], strict=True):
        assert ours.step == theirs.step
        assert torch.equal(ours.h, theirs.h)
        assert all(torch.equal(ours.tensors[k], theirs.tensors[k]) for k in theirs.tensors)
    for ours, theirs in zip(after_load[1], uninterrupted[1], strict=True):
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_the_kernels_decline_where_they_must(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 3, steps=2)
    state = estimator.initial_state(h0)
    with native_kernels(False):
        estimator.gradient(estimator.step(xs[0], state)[1], grads[0])
    assert fused_calls == {"step": 0, "gradient": 0}
    # A conjugated grad_h (its memory holds conj(g): the kernel must not read it; the PyTorch path that takes it
    # over cannot view it as real either, as before this kernel), a strided grad_h, a state whose traces are not
    # contiguous: the PyTorch path, with the right answer.
    _, stepped = estimator.step(xs[0], state)
    assert estimator._fused_gradient(stepped, grads[0].conj()) is None
    strided_g = grads[0].t().contiguous().t()
    assert not strided_g.is_contiguous()
    expected = estimator.gradient(stepped, grads[0])
    assert fused_calls == {"step": 1, "gradient": 1}
    got = estimator.gradient(stepped, strided_g)
    assert fused_calls["gradient"] == 1
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    e_b = stepped.tensors["e_B"]
    strided = stepped.replace(tensors={**stepped.tensors, "e_B": e_b.transpose(1, 2).contiguous().transpose(1, 2)})
    assert not strided.tensors["e_B"].is_contiguous()
    with native_kernels(False):
        want_h, want = estimator.step(xs[1], strided)
    got_h, got = estimator.step(xs[1], strided)
    assert fused_calls["step"] == 1
    assert torch.equal(got_h, want_h) and all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors)


def test_after_cell_double_the_fused_path_steps_the_converted_parameters(fused_calls):
    """``cell.double()`` gives every parameter new memory of another dtype: the remembered checks see it."""
    results = {}
    for native in (True, False):
        cell = make_lru(torch.float32)
        estimator = DiagonalRTRL(cell)
        h0, xs, grads = data(torch.float32, 2, steps=3)
        before = run(estimator, estimator.initial_state(h0), xs, grads, native=native)
        cell.double()
        h0, xs, grads = data(torch.float64, 2, steps=4, seed=5)
        after = run(estimator, estimator.initial_state(h0), xs, grads, native=native)
        results[native] = (before, after)
    assert fused_calls == {"step": 7, "gradient": 7}
    assert_same_runs(results[True][0], results[False][0], torch.float32)
    assert_same_runs(results[True][1], results[False][1], torch.float64)


def test_a_parameter_changed_in_place_and_back_is_seen(fused_calls):
    """The step keeps lambda and its slopes while nu_log, theta_log and gamma_log hold the same bits: a change of
    one entry, and its undoing, are stepped with the parameters of the moment."""
    results = {}
    for native in (True, False):
        cell = make_lru()
        estimator = DiagonalRTRL(cell)
        h0, xs, grads = data(torch.float64, 1, steps=8)
        state, states, gradients = estimator.initial_state(h0), [], []
        with native_kernels(native):
            for t, (x, g) in enumerate(zip(xs, grads, strict=True)):
                parameter = (cell.nu_log, cell.theta_log, cell.gamma_log)[t % 3]
                with torch.no_grad():
                    if t in (2, 3, 4):
                        parameter[1] += 0.25
                    if t in (5, 6, 7):
                        parameter[1] -= 0.25
                _, state = estimator.step(x, state)
                states.append(state)
                gradients.append(estimator.gradient(state, g))
        results[native] = (states, gradients)
    assert fused_calls == {"step": 8, "gradient": 8}
    assert_same_runs(results[True], results[False], torch.float64)


def test_threads_stepping_one_estimator_get_what_one_thread_gets(fused_calls):
    """The kernel runs without the GIL; its cache of lambda is taken by one step at a time."""
    estimator = DiagonalRTRL(make_lru())
    runs = [data(torch.float64, 2, steps=40, seed=10 + i) for i in range(4)]
    expected = [run(estimator, estimator.initial_state(h0), xs, grads, native=True) for h0, xs, grads in runs]
    got: list = [None] * len(runs)

    def work(i: int) -> None:
        h0, xs, grads = runs[i]
        got[i] = run(estimator, estimator.initial_state(h0), xs, grads, native=True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fused_calls == {"step": 320, "gradient": 320}
    for ours, theirs in zip(got, expected, strict=True):
        for a, b in zip(ours[0], theirs[0], strict=True):
            assert torch.equal(a.h, b.h) and all(torch.equal(a.tensors[k], b.tensors[k]) for k in b.tensors)
        for a, b in zip(ours[1], theirs[1], strict=True):
            assert all(torch.equal(a[k], b[k]) for k in b)


def test_the_state_passed_in_is_left_as_it_was_and_may_be_stepped_again(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 1, steps=3)
    _, first = estimator.step(xs[0], estimator.initial_state(h0))
    kept = first.h.clone(), {k: v.clone() for k, v in first.tensors.items()}
    h_a, a = estimator.step(xs[1], first)
    estimate = estimator.gradient(a, grads[1])
    h_b, b = estimator.step(xs[1], first)  # the same state again (not the one made last)
    assert fused_calls == {"step": 3, "gradient": 1}
    assert torch.equal(first.h, kept[0]) and all(torch.equal(first.tensors[k], kept[1][k]) for k in kept[1])
    assert h_a is not h_b and torch.equal(h_a, h_b) and all(torch.equal(a.tensors[k], b.tensors[k]) for k in kept[1])
    assert all(a.tensors[k] is not first.tensors[k] for k in kept[1])
    again = estimator.gradient(a, grads[1])  # fresh tensors each call
    assert all(again[k] is not estimate[k] and torch.equal(again[k], estimate[k]) for k in estimate)
    assert b.step == a.step == 2


def _same_error(estimator, call) -> None:
    """``call()`` raises the same ValueError with and without the kernels."""
    with pytest.raises(ValueError) as fused:
        call()
    with native_kernels(False), pytest.raises(ValueError) as plain:
        call()
    assert str(fused.value) == str(plain.value)


def test_the_fused_step_declines_inputs_the_template_refuses(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 3, steps=1)
    state = estimator.initial_state(h0)
    x = xs[0]
    for bad in (
        x[None],  # 3-D
        x[0],  # 1-D
        x.float(),  # another dtype than the state's
        x.to(torch.complex128),  # complex
        torch.complex(x, x).real.to(torch.float16),  # float16
        x[:2],  # another batch
        torch.randn(3, INPUT + 1, dtype=torch.float64),  # another input size
        x.tolist(),  # not a tensor
        None,
    ):
        _same_error(estimator, lambda bad=bad: estimator.step(bad, state))
    _, state = estimator.step(x, state)
    g = grads[0]
    for bad in (
        g[:, :-1],  # another shape
        g[:2],
        g[0],  # 1-D
        g[None],  # 3-D
        g.to(torch.complex64),  # another dtype
        g.real,  # real
        g.tolist(),
    ):
        _same_error(estimator, lambda bad=bad: estimator.gradient(state, bad))
    assert fused_calls == {"step": 1, "gradient": 0}


def _assert_declined_and_equal(estimator, x, state, reference, fused_calls) -> None:
    """A step from ``state`` declines the kernel: it is the PyTorch path's step from ``state``, and that of
    ``reference`` (the same values, laid out as the kernel reads them) to rounding."""
    before = dict(fused_calls)
    got_h, got = estimator.step(x, state)
    assert fused_calls == before
    with native_kernels(False):
        want_h, want = estimator.step(x, state)
        close_h, close = estimator.step(x, reference)
    assert torch.equal(got_h, want_h) and all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors)
    assert_close(got_h, close_h, torch.float64)
    for name, value in close.tensors.items():
        assert_close(got.tensors[name], value, torch.float64)


def test_hand_made_states_the_kernel_cannot_read_take_the_pytorch_path(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, _ = data(torch.float64, 3, steps=2)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    h, e_units = state.h, state.tensors["e_units"]
    strided_h = h.t().contiguous().t()
    strided_units = e_units.transpose(1, 2).contiguous().transpose(1, 2)
    lazy_h = h.conj_physical().conj()  # the value of h, its memory holding conj(h)
    lazy_units = e_units.conj_physical().conj()
    assert not strided_h.is_contiguous() and lazy_h.is_conj() and torch.equal(lazy_h, h)
    for made in (
        state.replace(h=strided_h),
        state.replace(tensors={**state.tensors, "e_units": strided_units}),
        state.replace(h=lazy_h),
        state.replace(tensors={**state.tensors, "e_units": lazy_units}),
    ):
        _assert_declined_and_equal(estimator, xs[1], made, state, fused_calls)
    # a negated view of x (its memory holds -x): real_cpu refuses it
    negated = torch._neg_view(-xs[1])
    assert negated.is_neg() and torch.equal(negated, xs[1])
    _assert_declined_and_equal(estimator, negated, state, state, fused_calls)
    # a state of other traces than the kernel's: the template names what is wrong, as without the kernel
    broken = state.replace(tensors={"e_units": e_units})
    with pytest.raises(KeyError) as fused:
        estimator.step(xs[1], broken)
    with native_kernels(False), pytest.raises(KeyError) as plain:
        estimator.step(xs[1], broken)
    assert str(fused.value) == str(plain.value)
    assert fused_calls == {"step": 1, "gradient": 0}


def test_parameters_the_kernel_cannot_read_take_the_pytorch_path(fused_calls):
    cell = make_lru()
    estimator = DiagonalRTRL(cell)
    h0, xs, grads = data(torch.float64, 2, steps=3)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    assert fused_calls["step"] == 1
    cell.B_re.data = cell.B_re.data.t().contiguous().t()  # the same values, new memory, not contiguous
    _assert_declined_and_equal(estimator, xs[1], state, state, fused_calls)
    cell.B_re.data = cell.B_re.data.contiguous()
    estimator.step(xs[1], state)
    assert fused_calls["step"] == 2
    torch.nn.utils.parametrize.register_parametrization(cell, "nu_log", _Identity())  # swaps the cell's class
    _assert_declined_and_equal(estimator, xs[2], state, state, fused_calls)
    assert fused_calls["step"] == 2


class _Identity(nn.Module):
    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return value


def test_a_copied_or_pickled_estimator_steps_as_the_original(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 2, steps=4)
    expected = run(estimator, estimator.initial_state(h0), xs, grads, native=True)
    for other in (copy.deepcopy(estimator), pickle.loads(pickle.dumps(estimator))):
        assert other._fused is not None and other._fused.cell is other.cell
        got = run(other, other.initial_state(h0), xs, grads, native=True)
        for a, b in zip(got[0], expected[0], strict=True):
            assert torch.equal(a.h, b.h)
        for a, b in zip(got[1], expected[1], strict=True):
            assert all(torch.equal(a[k], b[k]) for k in b)
    assert fused_calls == {"step": 12, "gradient": 12}


def test_autograd_inputs_and_inference_mode(fused_calls):
    """The fast lane runs outside the template's no_grad: it records nothing, whatever requires grad."""
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 2, steps=2)
    x = xs[0].clone().requires_grad_()
    h, state = estimator.step(x, estimator.initial_state(h0))
    estimate = estimator.gradient(state, grads[0].clone().requires_grad_())
    assert not h.requires_grad and h.grad_fn is None
    assert not any(t.requires_grad for t in (*state.tensors.values(), *estimate.values()))
    with torch.inference_mode():
        h_i, state_i = estimator.step(xs[1], state)
        estimate_i = estimator.gradient(state_i, grads[1])
    with native_kernels(False):
        h_p, state_p = estimator.step(xs[1], state)
        estimate_p = estimator.gradient(state_p, grads[1])
    assert fused_calls == {"step": 2, "gradient": 2}
    assert_close(h_i, h_p, torch.float64)
    assert all(torch.allclose(estimate_i[k], estimate_p[k], rtol=1e-12, atol=1e-14) for k in estimate_p)


class ScaledLRU(LinearRecurrentUnit):
    """A subclass that changes the step: the closed form and the kernel must both stay out."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * super().forward(x, h)


def test_a_cell_that_changes_the_step_or_the_generic_path_is_not_fused(fused_calls):
    torch.manual_seed(0)
    for estimator in (
        DiagonalRTRL(ScaledLRU(INPUT, HIDDEN).double()),
        DiagonalRTRL(make_lru(), closed_form=False),
    ):
        assert estimator._fused is None
        h0, xs, grads = data(torch.float64, 2, steps=2)
        run(estimator, estimator.initial_state(h0), xs, grads, native=True)
    assert DiagonalRTRL(make_lru())._fused is not None
    assert fused_calls == {"step": 0, "gradient": 0}


def test_compiled_steps_decline_and_equal_eager(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 2, steps=3)

    def one(x, state, g):
        h, state = estimator.step(x, state)
        return h, state, estimator.gradient(state, g)

    compiled = torch.compile(one, backend="eager", fullgraph=True)
    eager_state = compiled_state = estimator.initial_state(h0)
    for x, g in zip(xs, grads, strict=True):
        h, eager_state, eager = one(x, eager_state, g)
        before = dict(fused_calls)
        compiled_h, compiled_state, got = compiled(x, compiled_state, g)
        assert fused_calls == before  # nothing fused under the compiler
        torch.testing.assert_close(compiled_h, h, rtol=1e-12, atol=1e-12)
        for name in eager:
            torch.testing.assert_close(got[name], eager[name], rtol=1e-12, atol=1e-12)
    assert fused_calls == {"step": 3, "gradient": 3}


# -- NaN/inf: the same errors and records as the PyTorch path -------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_inf_input_is_the_same_value_error_at_once(bad, fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, _ = data(torch.float64, 2, steps=1)
    state = estimator.initial_state(h0)
    x = xs[0].clone()
    x[1, 2] = bad
    for native in (True, False):
        with native_kernels(native), pytest.raises(ValueError, match="x holds NaN or inf"):
            estimator.step(x, state)
    assert fused_calls["step"] == 1  # it ran, and its verdict sent the step to the checks
    assert state.step == 0


def test_a_nan_parameter_is_named(fused_calls):
    cell = make_lru()
    estimator = DiagonalRTRL(cell)
    h0, xs, _ = data(torch.float64, 2, steps=1)
    state = estimator.initial_state(h0)
    with torch.no_grad():
        cell.gamma_log[2] = math.nan
    for native in (True, False):
        with native_kernels(native), pytest.raises(FloatingPointError, match=r"NaN/inf states.*\['gamma_log'\]"):
            estimator.step(xs[0], state)
    assert fused_calls["step"] == 1


def test_a_recorded_failure_names_its_step(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    estimator.check_every = None
    h0, xs, _ = data(torch.float64, 2, steps=4)
    xs[2, 0, 1] = math.nan
    state = estimator.initial_state(h0)
    for x in xs:
        _, state = estimator.step(x, state)  # records, raises nothing
    assert fused_calls["step"] == 4
    with pytest.raises(ValueError, match="x held NaN or inf values at step 3"):
        estimator.check(state)


def test_a_nan_grad_h_or_estimate_raises_the_gradients_errors(fused_calls):
    estimator = DiagonalRTRL(make_lru())
    h0, xs, grads = data(torch.float64, 2, steps=1)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    g = grads[0].clone()
    g[0, 1] = complex(0.0, math.nan)
    with pytest.raises(ValueError, match="grad_h holds NaN or inf"):
        estimator.gradient(state, g)
    e_b = state.tensors["e_B"].clone()
    e_b[1, 2, 0] = complex(math.inf, 0.0)
    broken = state.replace(tensors={**state.tensors, "e_B": e_b})
    with pytest.raises(FloatingPointError, match="the estimate holds NaN/inf"):
        estimator.gradient(broken, grads[0])
    assert fused_calls["gradient"] == 2


def test_a_conjugated_grad_h_gives_the_estimate_of_its_value():
    """``g.conj()`` is a lazily conjugated view: the estimate is that of its value, on every path."""
    torch.manual_seed(3)
    cell = LinearRecurrentUnit(3, 4).double()
    estimator = DiagonalRTRL(cell)
    state = estimator.initial_state(torch.zeros(2, 4, dtype=torch.complex128))
    _, state = estimator.step(torch.randn(2, 3, dtype=torch.float64), state)
    g = torch.randn(2, 4, dtype=torch.complex128)
    lazy, resolved = estimator.gradient(state, g.conj()), estimator.gradient(state, g.conj().resolve_conj())
    for name in resolved:
        torch.testing.assert_close(lazy[name], resolved[name], rtol=0, atol=0)
