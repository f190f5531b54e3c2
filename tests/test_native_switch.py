"""The one switch of the C kernels: ``LIGHTNING_ORTHO_NATIVE`` and ``lightning_ortho._native.native_kernels``; the old
per-object switches (``UORO.native``, ``TanhUOROStep.native``, ``readout_step(native=)``) still work, with a
``DeprecationWarning`` that names the switch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lightning_ortho._native as native
from lightning_ortho._native.readout import linear_readout_kernel
from lightning_ortho._native.reflection_rows import row_kernels
from lightning_ortho._native.uoro import uoro_gradient_kernel, uoro_tanh_kernels
from lightning_ortho.models.online.readout_step import readout_step
from lightning_ortho.online import UORO, TanhRNNCell, uoro_fused

needs_kernels = pytest.mark.skipif(
    native.compiler() is None or not native.enabled(), reason="no C compiler, or LIGHTNING_ORTHO_NATIVE=0"
)


def _getters(dtype=torch.float64):
    t = torch.zeros(2, 2, dtype=dtype)
    return [row_kernels(t), uoro_tanh_kernels(t), uoro_gradient_kernel(t), linear_readout_kernel(t)]


@needs_kernels
def test_the_switch_turns_every_kernel_off_in_a_block_and_back_on_after():
    assert all(k is not None for k in _getters())
    with native.native_kernels(False):
        assert not native.enabled()
        assert native.load("uoro") is None
        assert all(k is None for k in _getters())
        with native.native_kernels(True):  # nested blocks restore in order
            assert all(k is not None for k in _getters())
        assert all(k is None for k in _getters())
    assert all(k is not None for k in _getters())


@needs_kernels
def test_the_switch_as_a_function_holds_until_given_back_and_overrides_the_environment(monkeypatch):
    try:
        native.native_kernels(False)
        assert all(k is None for k in _getters())
        monkeypatch.setenv("LIGHTNING_ORTHO_NATIVE", "1")
        native.load.cache_clear()  # the variable is read once per process, and again after this
        assert all(k is None for k in _getters())  # the switch wins over the variable while it is set
        native.native_kernels(True)
        monkeypatch.setenv("LIGHTNING_ORTHO_NATIVE", "0")
        native.load.cache_clear()
        assert all(k is not None for k in _getters())
        native.native_kernels(None)  # the variable decides again
        assert all(k is None for k in _getters())
    finally:
        native.native_kernels(None)
        monkeypatch.undo()
        native.load.cache_clear()


def test_the_switch_refuses_what_is_not_a_bool():
    with pytest.raises(TypeError, match="True, False or None"):
        native.native_kernels("off")
    assert native._switch is None


def _uoro_run(estimator, cell):
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(3, 2, 3, generator=g, dtype=torch.float64)
    grads = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    state = estimator.initial_state(torch.zeros(2, 4, dtype=torch.float64))
    out = []
    for x, grad_h in zip(xs, grads, strict=True):
        h, state = estimator.step(x, state)
        out.append(torch.cat([h.flatten(), *(v.flatten() for v in estimator.gradient(state, grad_h).values())]))
    return torch.stack(out)


@pytest.fixture
def c_rows_calls(monkeypatch):
    """How many times the fused tanh step's C passes ran (the one-call step, or the row pass around the GEMMs)."""
    calls = []
    for name in ("gir_rows", "gir_step"):
        original = getattr(uoro_fused, name)

        def counting(*args, _original=original, **kwargs):
            calls.append(1)
            return _original(*args, **kwargs)

        monkeypatch.setattr(uoro_fused, name, counting)
    return calls


@needs_kernels
def test_uoro_native_is_deprecated_and_still_turns_its_kernels_off(c_rows_calls):
    torch.manual_seed(0)
    cell = TanhRNNCell(3, 4).double()
    expected = _uoro_run(UORO(cell, generator=1), cell)
    assert c_rows_calls  # the kernels ran by default
    c_rows_calls.clear()
    estimator = UORO(cell, generator=1)
    with pytest.warns(DeprecationWarning, match="native_kernels"):
        estimator.native = False
    with pytest.warns(DeprecationWarning, match="native_kernels"):
        assert estimator.native is False
    got = _uoro_run(estimator, cell)
    assert c_rows_calls == []  # turned off for this estimator
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    step = uoro_fused.TanhUOROStep(cell, "state", 1e-7)
    with pytest.warns(DeprecationWarning, match="native_kernels"):
        step.native = False
    with pytest.warns(DeprecationWarning, match="native_kernels"):
        assert step.native is False


@needs_kernels
def test_the_switch_turns_uoros_kernels_off_with_the_same_results(c_rows_calls):
    torch.manual_seed(0)
    cell = TanhRNNCell(3, 4).double()
    expected = _uoro_run(UORO(cell, generator=1), cell)
    c_rows_calls.clear()
    with native.native_kernels(False):
        got = _uoro_run(UORO(cell, generator=1), cell)
    assert c_rows_calls == []
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_readout_step_native_is_deprecated_and_still_works():
    torch.manual_seed(0)
    linear = nn.Linear(4, 3).double()
    h, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 3, (5,))
    expected = readout_step(linear, h, y, None, "cross_entropy", 5.0)
    for flag in (True, False):
        with pytest.warns(DeprecationWarning, match="native_kernels"):
            got = readout_step(linear, h, y, None, "cross_entropy", 5.0, native=flag)
        for a, b in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
