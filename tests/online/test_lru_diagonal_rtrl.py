"""DiagonalRTRL against backprop through time (autograd over the unrolled cell) and exact RTRL, on the linear
recurrent unit (complex state, closed-form traces and the torch.func path) and on an element-wise tanh cell;
resets, checkpoints, the refusal of non-diagonal cells, and the LRU's initialisation (Orvieto et al. 2023)."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from lightning_ortho.online import RTRL, TanhRNNCell
from lightning_ortho.online.diagonal_rtrl import DiagonalRTRL, ElementwiseTraces
from lightning_ortho.online.lru import LinearRecurrentUnit, LRUTraces

from . import references as ref

DTYPE, COMPLEX = torch.float64, torch.complex128
INPUT, HIDDEN, T, B = 3, 4, 7, 3
TOL = dict(rtol=1e-10, atol=1e-10)


class ElementwiseTanhCell(nn.Module):
    """``h' = tanh(w * h + U x + b)`` with ``w`` a vector: the state Jacobian is ``diag((1 - h'^2) w)``."""

    diagonal_recurrence = True  # for every w, so DiagonalRTRL takes it

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.w = nn.Parameter(torch.empty(hidden_size).uniform_(-1.2, 1.2))
        self.U = nn.Parameter(torch.randn(hidden_size, input_size) / math.sqrt(input_size))
        self.b = nn.Parameter(0.3 * torch.randn(hidden_size))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w * h + x @ self.U.T + self.b)


class SharedDecayCell(nn.Module):
    """``h' = tanh(a h + U x)`` with one scalar ``a`` for all units: diagonal, but ``a`` enters every unit."""

    diagonal_recurrence = True

    def __init__(self) -> None:
        super().__init__()
        self.input_size, self.hidden_size = INPUT, HIDDEN
        self.a = nn.Parameter(torch.tensor(0.5, dtype=DTYPE))
        self.U = nn.Parameter(torch.randn(HIDDEN, INPUT, dtype=DTYPE))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.a * h + x @ self.U.T)


class ConjugatingLRU(LinearRecurrentUnit):
    """``h' = lambda * conj(h) + ...``: diagonal as 2x2 real blocks, but not complex-linear in ``h``."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.eigenvalues() * h.conj() + torch.exp(self.gamma_log) * self.input_projection(x)


def make_lru(seed: int = 0) -> LinearRecurrentUnit:
    torch.manual_seed(seed)
    return LinearRecurrentUnit(INPUT, HIDDEN, r_min=0.6, r_max=0.95, max_phase=math.pi).to(DTYPE)


def make_elementwise(seed: int = 0) -> ElementwiseTanhCell:
    torch.manual_seed(seed)
    return ElementwiseTanhCell(INPUT, HIDDEN).to(DTYPE)


def complex_sequence(seed: int = 1):
    """Inputs ``(T, B, I)`` real, ``h0`` ``(B, H)`` and cotangents ``(T, B, H)`` complex."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(T, B, INPUT, generator=g, dtype=DTYPE)
    h0 = torch.complex(*(0.5 * torch.randn(2, B, HIDDEN, generator=g, dtype=DTYPE)))
    cots = torch.complex(*torch.randn(2, T, B, HIDDEN, generator=g, dtype=DTYPE))
    return xs, h0, cots


def bptt(cell, xs, h0, cots, resets=None, stream=None) -> torch.Tensor:
    """Flat gradient of ``L = sum_t Re<cots[t], h_t> = sum_t sum(Re(conj(c) h))`` by autograd through the unrolled
    cell (a real loss whose gradient with respect to ``h_t`` is ``cots[t]`` in PyTorch's convention); ``resets``
    ``{t: (mask, h)}`` replace the masked streams' state by a constant before step ``t``; ``stream``: that
    stream's loss only."""
    params = ref.parameters(cell)
    h, loss = h0, 0.0
    for t in range(len(xs)):
        if resets and t in resets:
            mask, h_reset = resets[t]
            h = torch.where(mask[:, None], h_reset.expand_as(h), h)
        h = cell(xs[t], h)
        terms = (cots[t].conj() * h).real
        loss = loss + (terms.sum() if stream is None else terms[stream].sum())
    return ref.flat(torch.autograd.grad(loss, params, allow_unused=True), params)


def run(est, xs, h0, cots, resets=None, per_stream=False):
    """``sum_t est.gradient(state_t, cots[t])`` flattened, the states ``h_t`` and the final state."""
    state, total, hs = est.initial_state(h0), 0.0, []
    for t in range(len(xs)):
        if resets and t in resets:
            state = est.reset(state, *resets[t])
        h, state = est.step(xs[t], state)
        hs.append(h)
        total = total + ref.flatten_dict(
            est.gradient(state, cots[t], per_stream=per_stream), est.cell, lead=int(per_stream)
        )
    return total, hs, state


# -- the linear recurrent unit -------------------------------------------------------------------------------------
@pytest.mark.parametrize("closed_form", [True, False])
def test_lru_equals_bptt_per_stream_and_summed(closed_form):
    cell = make_lru()
    xs, h0, cots = complex_sequence()
    est = DiagonalRTRL(cell, closed_form=closed_form)
    assert isinstance(est.traces, LRUTraces if closed_form else ElementwiseTraces)
    summed, hs, state = run(est, xs, h0, cots)
    expected = bptt(cell, xs, h0, cots)
    recurrent = 3 * HIDDEN + 2 * HIDDEN * INPUT  # nu_log, theta_log, gamma_log, B_re, B_im; then C_re, C_im, D
    assert expected[:recurrent].abs().min() > 0 and not expected[recurrent:].any()
    torch.testing.assert_close(summed, expected, **TOL)
    per_stream, _, _ = run(est, xs, h0, cots, per_stream=True)
    for b in range(B):
        torch.testing.assert_close(per_stream[b], bptt(cell, xs, h0, cots, stream=b), **TOL)
    torch.testing.assert_close(per_stream.sum(0), summed, **TOL)
    # the states are the cell's own, complex
    h = h0
    with torch.no_grad():
        for t in range(T):
            h = cell(xs[t], h)
            assert hs[t].dtype == COMPLEX
            torch.testing.assert_close(hs[t], h, rtol=0, atol=1e-14)
    assert state.step == T


def test_lru_closed_form_and_torch_func_paths_agree():
    cell = make_lru(3)
    xs, h0, cots = complex_sequence(4)
    fast, _, _ = run(DiagonalRTRL(cell), xs, h0, cots, per_stream=True)
    generic, _, _ = run(DiagonalRTRL(cell, closed_form=False), xs, h0, cots, per_stream=True)
    torch.testing.assert_close(fast, generic, rtol=0, atol=1e-12)


def test_lru_step_is_the_paper_recurrence():
    """Orvieto et al.'s step ``h' = lambda h + gamma (B x)`` with ``lambda = exp(-exp(nu_log)) (cos + i sin)(
    exp(theta_log))``, written out with real arithmetic; ``y = Re(C h) + D x``."""
    cell = make_lru(5)
    xs, h0, _ = complex_sequence(6)
    p = {k: v.detach() for k, v in cell.named_parameters()}
    modulus, phase = torch.exp(-torch.exp(p["nu_log"])), torch.exp(p["theta_log"])
    gamma = torch.exp(p["gamma_log"])
    re = modulus * torch.cos(phase) * h0.real - modulus * torch.sin(phase) * h0.imag + gamma * (xs[0] @ p["B_re"].T)
    im = modulus * torch.sin(phase) * h0.real + modulus * torch.cos(phase) * h0.imag + gamma * (xs[0] @ p["B_im"].T)
    with torch.no_grad():
        h1 = cell(xs[0], h0)
        y = cell.output(h1, xs[0])
    torch.testing.assert_close(h1, torch.complex(re, im), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(y, re @ p["C_re"].T - im @ p["C_im"].T + p["D"] * xs[0], rtol=1e-13, atol=1e-13)


def test_lru_output_loss_equals_bptt():
    """L_t = mean((Re(C h_t) + D x_t - y_t)^2): dL_t/dh_t by autograd from the estimator's h_t (PyTorch's complex
    convention), C and D by backprop at step t, the rest from DiagonalRTRL; against BPTT of sum_t L_t."""
    cell = make_lru(7)
    xs, h0, _ = complex_sequence(8)
    targets = torch.randn(T, B, INPUT, dtype=DTYPE, generator=torch.Generator().manual_seed(9))
    loss = lambda h, t: ((cell.output(h, xs[t]) - targets[t]) ** 2).mean()  # noqa: E731
    params = ref.parameters(cell)
    est = DiagonalRTRL(cell)
    state, got = est.initial_state(h0), 0.0
    for t in range(T):
        h, state = est.step(xs[t], state)
        leaf = h.clone().requires_grad_(True)
        grads = torch.autograd.grad(loss(leaf, t), [leaf, *params], allow_unused=True)
        direct = ref.flat(grads[1:], params)  # C_re, C_im, D only: h is a leaf here
        got = got + ref.flatten_dict(est.gradient(state, grads[0]), cell) + direct
    h, total = h0, 0.0
    for t in range(T):
        h = cell(xs[t], h)
        total = total + loss(h, t)
    expected = ref.flat(torch.autograd.grad(total, params), params)
    assert expected.abs().min() > 0
    torch.testing.assert_close(got, expected, **TOL)


def test_lru_initialisation_is_the_ring():
    r_min, r_max, max_phase = 0.9, 0.999, math.pi / 10
    torch.manual_seed(0)
    cell = LinearRecurrentUnit(2, 20_000, r_min=r_min, r_max=r_max, max_phase=max_phase).to(DTYPE)
    with torch.no_grad():
        lam = cell.eigenvalues()
        modulus = lam.abs()
        assert modulus.min() >= r_min - 1e-12 and modulus.max() <= r_max + 1e-12
        phase = torch.exp(cell.theta_log)
        assert phase.min() > 0 and phase.max() <= max_phase
        torch.testing.assert_close(torch.exp(cell.gamma_log), torch.sqrt(1 - modulus**2), rtol=1e-6, atol=0)
        # |lambda|^2 uniform on [r_min^2, r_max^2] and the phase uniform on [0, max_phase]: means within 6 sigma
        for values, low, high in ((modulus**2, r_min**2, r_max**2), (phase, 0.0, max_phase)):
            sigma = (high - low) / math.sqrt(12 * values.numel())
            assert abs(float(values.mean()) - (low + high) / 2) < 6 * sigma
    torch.manual_seed(0)
    default = LinearRecurrentUnit(2, 5000)  # r_min = 0, r_max = 1: finite parameters, |lambda| < 1
    assert all(bool(torch.isfinite(p).all()) for p in default.parameters())
    with torch.no_grad():
        assert float(default.eigenvalues().abs().max()) < 1
    assert default.state_dtype() == torch.complex64 and make_lru().state_dtype() == COMPLEX


@pytest.mark.parametrize("bad", [dict(r_min=0.5, r_max=0.4), dict(r_min=1.0, r_max=1.0), dict(max_phase=0.0)])
def test_lru_refuses_a_bad_ring(bad):
    with pytest.raises(ValueError, match="LinearRecurrentUnit"):
        LinearRecurrentUnit(2, 3, **bad)


# -- the element-wise tanh cell (torch.func path) ------------------------------------------------------------------
def test_elementwise_cell_equals_bptt_and_rtrl():
    cell = make_elementwise()
    xs, h0, cots = ref.sequence(cell, T, B)
    est = DiagonalRTRL(cell)
    assert isinstance(est.traces, ElementwiseTraces)
    summed, hs, _ = run(est, xs, h0, cots)
    expected = ref.bptt_gradient(cell, xs, h0, cots)
    assert expected.abs().min() > 0
    torch.testing.assert_close(summed, expected, **TOL)
    per_stream, _, _ = run(est, xs, h0, cots, per_stream=True)
    exact, exact_hs, _ = run(RTRL(cell), xs, h0, cots, per_stream=True)
    torch.testing.assert_close(per_stream, exact, **TOL)
    for b in range(B):
        torch.testing.assert_close(per_stream[b], ref.bptt_gradient(cell, xs, h0, cots, streams=[b]), **TOL)
    for mine, theirs in zip(hs, exact_hs, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-14)


# -- resets and checkpoints ----------------------------------------------------------------------------------------
def test_resets_of_some_streams_equal_bptt():
    lru, elementwise = make_lru(11), make_elementwise(12)
    xs, h0, cots = complex_sequence(13)
    h_reset = torch.complex(*torch.randn(2, HIDDEN, dtype=DTYPE, generator=torch.Generator().manual_seed(14)))
    resets = {
        2: (torch.tensor([True, False, True]), h_reset),
        5: (torch.tensor([False, True, False]), torch.zeros(B, HIDDEN, dtype=DTYPE)),  # real h0: zeros
    }
    got, _, _ = run(DiagonalRTRL(lru), xs, h0, cots, resets=resets)
    torch.testing.assert_close(got, bptt(lru, xs, h0, cots, resets=resets), **TOL)
    xr, h0r, cotr = ref.sequence(elementwise, T, B)
    real_resets = {t: (mask, h.real) for t, (mask, h) in resets.items()}
    got, _, _ = run(DiagonalRTRL(elementwise), xr, h0r, cotr, resets=real_resets)
    torch.testing.assert_close(got, ref.bptt_gradient(elementwise, xr, h0r, cotr, resets=real_resets), **TOL)


@pytest.mark.parametrize("kind", ["lru", "elementwise"])
def test_state_dict_round_trip_resumes_exactly(kind):
    cell = make_lru() if kind == "lru" else make_elementwise()
    xs, h0, cots = complex_sequence() if kind == "lru" else ref.sequence(cell, T, B)
    est = DiagonalRTRL(cell)
    state = est.initial_state(h0)
    for t in range(3):
        _, state = est.step(xs[t], state)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    resumed = est.initial_state(torch.zeros_like(h0))
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.step == 3 and resumed.h.dtype == h0.dtype
    for t in range(3, T):
        h, state = est.step(xs[t], state)
        h2, resumed = est.step(xs[t], resumed)
        assert torch.equal(h, h2)
        for a, b in zip(est.gradient(state, cots[t]).values(), est.gradient(resumed, cots[t]).values(), strict=True):
            assert torch.equal(a, b)
    for name, value in state.tensors.items():
        assert torch.equal(value, resumed.tensors[name]) and value.dtype == resumed.tensors[name].dtype


def test_load_refuses_nan_and_another_estimator():
    est = DiagonalRTRL(make_lru())
    xs, h0, _ = complex_sequence()
    _, state = est.step(xs[0], est.initial_state(h0))
    saved = state.state_dict()
    saved["tensors"]["e_units"][0, 0, 0] = complex(float("nan"), 0.0)
    target = est.initial_state(h0)
    with pytest.raises(ValueError, match="NaN"):
        target.load_state_dict(saved)
    assert target.h.dtype == COMPLEX and target.tensors["e_B"].dtype == COMPLEX  # left as it was
    rtrl_state = RTRL(make_elementwise()).initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE)).state_dict()
    with pytest.raises(ValueError, match="saved hidden states h are real, this state's are complex"):
        target.load_state_dict(rtrl_state)
    rtrl_state["h"] = rtrl_state["h"].to(COMPLEX)
    with pytest.raises(ValueError, match="'rtrl' estimator"):
        target.load_state_dict(rtrl_state)


# -- refusals ------------------------------------------------------------------------------------------------------
def test_non_diagonal_cell_is_refused():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="does not declare a diagonal recurrence.*Train TanhRNNCell with RTRL"):
        DiagonalRTRL(TanhRNNCell(INPUT, HIDDEN).to(DTYPE))

    class DeclaredDense(ElementwiseTanhCell):  # declares a diagonal recurrence but reads other units
        def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.w * h.roll(1, dims=1) + x @ self.U.T + self.b)

    with pytest.raises(ValueError, match="not diagonal.*Use RTRL"):
        DiagonalRTRL(DeclaredDense(INPUT, HIDDEN).to(DTYPE))


def test_shared_parameter_and_non_complex_linear_step_are_refused():
    with pytest.raises(ValueError, match="SharedDecayCell.a enters 4 units"):
        DiagonalRTRL(SharedDecayCell())
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="not complex-linear"):
        DiagonalRTRL(ConjugatingLRU(INPUT, HIDDEN).to(DTYPE))


def test_complex_inputs_are_checked():
    est = DiagonalRTRL(make_lru())
    xs, h0, cots = complex_sequence()
    with pytest.raises(ValueError, match="complex128"):
        est.initial_state(h0.to(torch.complex64))
    state = est.initial_state(h0)
    _, state = est.step(xs[0], state)
    with pytest.raises(ValueError, match="grad_h must be a complex tensor"):
        est.gradient(state, cots[0].real)
    with pytest.raises(ValueError, match="x must have shape"):
        est.step(xs[0][:, :2], state)
    with pytest.raises(ValueError, match="NaN"):
        est.gradient(state, cots[0] * float("nan"))
    with pytest.raises(ValueError, match="x holds NaN"):
        est.step(xs[1] * float("nan"), state)
    with pytest.raises(FloatingPointError, match="NaN/inf"):
        for _ in range(100):
            _, state = est.step(torch.full_like(xs[0], 1.7e308), state)


def test_a_complex_cell_that_declares_no_hidden_size_starts_from_any_width():
    """``hidden_size`` is optional for a cell (the base class checks only what a cell declares): a complex-state
    cell without it takes an ``h0`` of its own width."""
    torch.manual_seed(0)
    cell = LinearRecurrentUnit(2, 3).double()
    estimator = DiagonalRTRL(cell)
    estimator.hidden_size = None  # as for a cell that declares no hidden_size
    state = estimator.initial_state(torch.zeros(4, 3, dtype=torch.complex128))
    h, state = estimator.step(torch.randn(4, 2, dtype=torch.float64), state)
    assert h.shape == (4, 3) and h.is_complex()
