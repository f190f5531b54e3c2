"""UORO's fused step on a TanhRNNCell (lightning_ortho.online.uoro_fused) against the generic ``torch.func`` path:
the same draws give the same state, estimates and checkpoints (float64), for every projection and rescaling that
it covers; bad input is refused as before and leaves the state as it was; cells it must not fuse are not."""

from __future__ import annotations

import io

import pytest
import torch

from lightning_ortho.online import UORO, TanhRNNCell, uoro_fused

DTYPE = torch.float64
STREAMS, INPUT, HIDDEN, STEPS = 4, 3, 5, 6
TOL = {"rtol": 1e-11, "atol": 1e-12}


@pytest.fixture(autouse=True, params=["c_rows", "torch_rows"])
def row_implementation(request, monkeypatch):
    """Every test twice: the fused step's row work by the C kernels (where a compiler exists) and by PyTorch ops."""
    if request.param == "torch_rows":
        monkeypatch.setattr(uoro_fused, "uoro_tanh_kernels", lambda *tensors: None)
    elif uoro_fused.uoro_tanh_kernels(torch.zeros(1, dtype=DTYPE)) is None:
        pytest.skip("the C kernels are not available on this machine (no C compiler)")
    return request.param


def make_cell(dtype=DTYPE, cls=TanhRNNCell) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(INPUT, HIDDEN).to(dtype)


def rescaling(name: str):
    if name == "gir":
        return "gir"
    alpha = torch.linspace(0.7, 1.3, STEPS, dtype=DTYPE)
    if name == "fixed":
        return (alpha, None)
    g = torch.Generator().manual_seed(5)
    return (alpha, torch.eye(HIDDEN, dtype=DTYPE) + 0.3 * torch.randn(HIDDEN, HIDDEN, generator=g, dtype=DTYPE))


def data(dtype=DTYPE):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, STREAMS, INPUT, generator=g, dtype=DTYPE).to(dtype)
    grads = torch.randn(STEPS, STREAMS, HIDDEN, generator=g, dtype=DTYPE).to(dtype)
    h0 = (0.5 * torch.randn(STREAMS, HIDDEN, generator=g, dtype=DTYPE)).to(dtype)
    return xs, grads, h0


def run(estimator, xs, grads, h0, reset_at: int | None = 3):
    """Every step's state (cloned) and estimates, summed and per stream; stream 1 restarts at ``reset_at``."""
    state, trace = estimator.initial_state(h0), []
    for t in range(xs.shape[0]):
        if t == reset_at:
            state = estimator.reset(state, torch.tensor([False, True, False, False]), h0=h0[0])
        h, state = estimator.step(xs[t], state)
        summed = estimator.gradient(state, grads[t])
        per_stream = estimator.gradient(state, grads[t], per_stream=True)
        trace.append(
            {
                "h": h.clone(),
                **{k: v.clone() for k, v in state.tensors.items()},
                "summed": estimator.layout.flatten(summed, lead=0),
                "per_stream": estimator.layout.flatten(per_stream, lead=1),
            }
        )
    return trace, state


@pytest.mark.parametrize("projection", ["state", "preactivation"])
@pytest.mark.parametrize("kind", ["gir", "fixed", "fixed-q0"])
def test_the_fused_step_gives_what_the_generic_path_gives_for_the_same_draws(projection, kind):
    cell = make_cell()
    xs, grads, h0 = data()
    fused = UORO(cell, projection=projection, rescaling=rescaling(kind), generator=3)
    assert fused._fused is not None  # the path under test is the one taken
    traces = [run(fused, xs, grads, h0)[0]]
    for options in ({"closed_form": False}, {"fused": False}):
        other = UORO(cell, projection=projection, rescaling=rescaling(kind), generator=3, **options)
        assert other._fused is None
        traces.append(run(other, xs, grads, h0)[0])
    for fused_step, *others in zip(*traces, strict=True):
        for other in others:
            assert fused_step.keys() == other.keys()
            for name, value in fused_step.items():
                torch.testing.assert_close(value, other[name], **TOL, msg=name)
    # the estimate moves, and the reset stream's influence restarted from zero
    assert traces[0][-1]["summed"].abs().max() > 0


@pytest.mark.parametrize("projection", ["state", "preactivation"])
def test_the_stream_by_stream_update_of_a_large_w_tilde_gives_the_same_estimate(projection, monkeypatch):
    cell = make_cell()
    xs, grads, h0 = data()
    two_passes, _ = run(UORO(cell, projection=projection, generator=3), xs, grads, h0)
    monkeypatch.setattr(uoro_fused, "ROW_UPDATE_MIN", 1)  # every w_tilde counts as large
    one_pass, _ = run(UORO(cell, projection=projection, generator=3), xs, grads, h0)
    generic, _ = run(UORO(cell, projection=projection, generator=3, closed_form=False), xs, grads, h0)
    for a, b, c in zip(one_pass, two_passes, generic, strict=True):
        for name in ("h_tilde", "w_tilde", "summed", "per_stream"):
            torch.testing.assert_close(a[name], b[name], **TOL, msg=name)
            torch.testing.assert_close(a[name], c[name], **TOL, msg=name)


def test_a_checkpoint_of_the_fused_path_resumes_on_either_path():
    cell = make_cell()
    xs, grads, h0 = data()
    straight, _ = run(UORO(cell, generator=9), xs, grads, h0, reset_at=None)
    _, head = run(UORO(cell, generator=9), xs[:3], grads[:3], h0, reset_at=None)
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()))
    kept = saved["tensors"]["w_tilde"].clone()
    for options in ({}, {"closed_form": False}):
        estimator = UORO(cell, generator=0, **options)  # another seed: the saved generator state must win
        resumed = estimator.initial_state(h0)
        resumed.load_state_dict(saved)
        for t in range(3, STEPS):
            _, resumed = estimator.step(xs[t], resumed)
            for name in ("h_tilde", "w_tilde"):
                if options:
                    torch.testing.assert_close(resumed.tensors[name], straight[t][name], **TOL)
                else:
                    assert torch.equal(resumed.tensors[name], straight[t][name])
    # stepping the loaded state (w_tilde updated in place) leaves the loaded dictionary as it was
    assert torch.equal(saved["tensors"]["w_tilde"], kept)


@pytest.mark.parametrize("projection", ["state", "preactivation"])
@pytest.mark.parametrize("kind", ["gir", "fixed"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_nan_or_inf_input_is_a_value_error_and_leaves_the_state_as_it_was(projection, kind, bad):
    cell = make_cell()
    with torch.no_grad():
        cell.weight_ih.mul_(50)  # saturates tanh: d = 0 on every unit, so psi = d * nu = 0 at the preactivation
    estimator = UORO(cell, projection=projection, rescaling=rescaling(kind), generator=0)
    xs, _, h0 = data()
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    before = {k: v.clone() for k, v in state.tensors.items()}
    x = xs[1].clone()
    x[2, 1] = bad
    with pytest.raises(ValueError, match="UORO: x holds NaN or inf values"):
        estimator.step(x, state)
    for name, value in before.items():
        assert torch.equal(state.tensors[name], value), name


def test_a_nan_parameter_is_named_by_the_fused_step():
    cell = make_cell()
    estimator = UORO(cell, generator=0)
    xs, _, h0 = data()
    state = estimator.initial_state(h0)
    with torch.no_grad():
        cell.weight_hh[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN/inf states at step 1.*\['weight_hh'\]"):
        estimator.step(xs[0], state)


def test_a_finite_estimate_whose_sum_overflows_is_no_error():
    cell = make_cell(torch.float32)
    estimator = UORO(cell, generator=0)
    xs, grads, h0 = data(torch.float32)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    state.tensors["w_tilde"].fill_(3e38)
    state.tensors["h_tilde"].fill_(1.0)
    top = torch.finfo(torch.float32).max
    estimate = estimator.gradient(state, torch.full_like(grads[0], 1.0 / (HIDDEN * STREAMS)))
    assert all(torch.isfinite(v).all() and v.max() > top / 2 for v in estimate.values())
    with pytest.raises(FloatingPointError, match="estimate holds NaN/inf"):
        estimator.gradient(state, torch.full_like(grads[0], 1.0))  # entries past float32's range


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_fused_step_runs_in_the_parameters_dtype(dtype):
    cell = make_cell(dtype)
    xs, grads, h0 = data(dtype)
    fused, _ = run(UORO(cell, generator=4), xs, grads, h0)
    plain, _ = run(UORO(cell, generator=4, fused=False), xs, grads, h0)
    for a, b in zip(fused, plain, strict=True):
        for name in ("h", "h_tilde", "w_tilde", "summed"):
            assert a[name].dtype == dtype
            torch.testing.assert_close(a[name].float(), b[name].float(), rtol=5e-2, atol=5e-2, msg=name)


class _ScaledTanh(TanhRNNCell):
    """Another step than tanh(W_h h + W_x x + b): the fused step must not take it."""

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(0.5 * z)


def test_a_cell_that_changes_the_step_is_not_fused_and_stays_exact():
    cell = make_cell(cls=_ScaledTanh)
    estimator = UORO(cell, generator=2)
    xs, grads, h0 = data()
    ours, _ = run(estimator, xs, grads, h0)
    generic, _ = run(UORO(cell, generator=2, closed_form=False), xs, grads, h0)
    for a, b in zip(ours, generic, strict=True):  # the closed form of the tanh cell is no longer its step either
        torch.testing.assert_close(a["h"], b["h"], **TOL)
        torch.testing.assert_close(a["summed"], b["summed"], **TOL)
    assert estimator._fused is None
    parametrized = make_cell()
    torch.nn.utils.parametrize.register_parametrization(parametrized, "weight_hh", _Identity())
    assert UORO(parametrized, generator=0)._fused is None


class _Identity(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight
