"""UORO's fused step on a TanhRNNCell at large sizes (lightning_ortho.online.uoro_fused), forced at small ones: the
norms of ``w_tilde`` taken during its stream-by-stream update serve the next step's ``gamma`` only while ``w_tilde``
is unchanged, and ``W_h`` read once for ``h`` and ``h_tilde``; the steps equal the generic ``torch.func`` path's
(float64) across steps, resets, a checkpoint, an in-place change of ``w_tilde`` and inference mode, and the next step
reads no ``(B, P)`` norm."""

from __future__ import annotations

import io

import pytest
import torch

from lightning_ortho.online import UORO, TanhRNNCell, uoro_fused

DTYPE = torch.float64
STREAMS, INPUT, HIDDEN, STEPS = 3, 2, 4, 5
TOL = {"rtol": 1e-11, "atol": 1e-12}


@pytest.fixture(autouse=True)
def _large(monkeypatch):
    monkeypatch.setattr(uoro_fused, "ROW_UPDATE_MIN", 1)  # every w_tilde takes the stream-by-stream update
    monkeypatch.setattr(uoro_fused, "uoro_tanh_kernels", lambda *tensors: None)  # of the PyTorch ops, not the C kernels


def setup():
    torch.manual_seed(0)
    cell = TanhRNNCell(INPUT, HIDDEN).to(DTYPE)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, STREAMS, INPUT, generator=g, dtype=DTYPE)
    h0 = 0.5 * torch.randn(STREAMS, HIDDEN, generator=g, dtype=DTYPE)
    return cell, xs, h0


def trace(estimator, xs, state, between=None):
    """``(h_tilde, w_tilde)`` after each step; ``between(t, state)`` may change the state before step ``t``."""
    out = []
    for t in range(xs.shape[0]):
        if between is not None:
            state = between(t, state) or state
        _, state = estimator.step(xs[t], state)
        out.append((state.tensors["h_tilde"].clone(), state.tensors["w_tilde"].clone()))
    return out, state


def assert_traces_close(a, b):
    for (h_a, w_a), (h_b, w_b) in zip(a, b, strict=True):
        torch.testing.assert_close(h_a, h_b, **TOL)
        torch.testing.assert_close(w_a, w_b, **TOL)


def test_the_next_step_reads_the_norms_taken_in_the_update(monkeypatch):
    cell, xs, h0 = setup()
    estimator = UORO(cell, generator=3)
    _, state = estimator.step(xs[0], estimator.initial_state(h0))
    shapes, norm = [], torch.linalg.vector_norm

    def recording(value, *args, **kwargs):
        shapes.append(tuple(value.shape))
        return norm(value, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "vector_norm", recording)
    estimator.step(xs[1], state)
    assert tuple(state.tensors["w_tilde"].shape) not in shapes
    assert (estimator.layout.size,) in shapes  # the rows' norms, taken after their update


@pytest.mark.parametrize("change", ["in_place", "reset", "none"])
def test_the_norms_follow_w_tilde_through_changes_between_steps(change):
    cell, xs, h0 = setup()

    def between(t, state):
        if t != 2 or change == "none":
            return None
        if change == "in_place":  # the cached norms no longer describe w_tilde
            state.tensors["w_tilde"][1].mul_(3.0)
            return None
        return estimator.reset(state, torch.tensor([False, True, False]))

    runs = []
    for options in ({}, {"closed_form": False}):
        estimator = UORO(cell, generator=3, **options)
        runs.append(trace(estimator, xs, estimator.initial_state(h0), between)[0])
    assert_traces_close(*runs)


def test_a_checkpoint_resumes_with_the_norms_of_what_was_loaded():
    cell, xs, h0 = setup()
    estimator = UORO(cell, generator=3)
    straight, _ = trace(estimator, xs, estimator.initial_state(h0))
    _, head = trace(estimator, xs[:2], estimator.initial_state(h0))
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    for options in ({}, {"closed_form": False}):
        resumed_estimator = UORO(cell, generator=0, **options)
        resumed = resumed_estimator.initial_state(h0)
        resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
        assert_traces_close(trace(resumed_estimator, xs[2:], resumed)[0], straight[2:])


def test_inference_mode_takes_the_norms_afresh_and_gives_the_same_steps():
    cell, xs, h0 = setup()
    estimator = UORO(cell, generator=3)
    expected, _ = trace(estimator, xs, estimator.initial_state(h0))
    with torch.inference_mode():
        got, _ = trace(estimator, xs, estimator.initial_state(h0))
    assert_traces_close(got, expected)


@pytest.mark.parametrize("projection", ["state", "preactivation"])
@pytest.mark.parametrize("kind", ["gir", "fixed"])
def test_one_product_for_h_and_h_tilde_gives_the_generic_steps(projection, kind, monkeypatch):
    monkeypatch.setattr(uoro_fused, "STACKED_FORWARD_MIN", 0)  # W_h read once for both, at every size
    cell, xs, h0 = setup()
    rescaling = "gir" if kind == "gir" else (torch.linspace(0.7, 1.3, STEPS, dtype=DTYPE), None)
    runs = []
    for options in ({}, {"closed_form": False}):
        estimator = UORO(cell, projection=projection, rescaling=rescaling, generator=3, **options)
        runs.append(trace(estimator, xs, estimator.initial_state(h0))[0])
    assert_traces_close(*runs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_large_paths_run_in_the_parameters_dtype(dtype, monkeypatch):
    monkeypatch.setattr(uoro_fused, "STACKED_FORWARD_MIN", 0)
    cell, xs, h0 = setup()
    cell, xs, h0 = cell.to(dtype), xs.to(dtype), h0.to(dtype)
    runs = []
    for options in ({}, {"fused": False}):
        estimator = UORO(cell, generator=4, **options)
        runs.append(trace(estimator, xs, estimator.initial_state(h0))[0])
    for (h_a, w_a), (h_b, w_b) in zip(*runs, strict=True):
        assert h_a.dtype == w_a.dtype == dtype
        torch.testing.assert_close(h_a.float(), h_b.float(), rtol=5e-2, atol=5e-2)
        torch.testing.assert_close(w_a.float(), w_b.float(), rtol=5e-2, atol=5e-2)
