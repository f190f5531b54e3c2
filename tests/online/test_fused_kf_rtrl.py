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
