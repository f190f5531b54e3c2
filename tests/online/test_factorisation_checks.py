"""Cells whose ``forward`` is not the factorisation they inherit: every estimator either computes the gradient of the
cell's real step (exactly, or equal in expectation, against backprop through time by autograd in float64) or refuses
with the reason; the check runs once per cell, at random parameters, and is cached for the cell's class."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import (
    KFRTRL,
    RFLO,
    RTRL,
    UORO,
    InfluenceBalancingCell,
    SnAp,
    StepLinearization,
    TanhRNNCell,
    TruncatedBPTT,
    linearization,
    oracle_terms,
)
from lightning_ortho.online.linearization import ParameterLayout, linearize

from . import references as ref
from .references import DTYPE
from .test_uoro import DRAWS, critical_z, total_estimates, z_scores

TOL = dict(rtol=1e-10, atol=1e-12)
STEPS = 5


class HalfLeakyTanh(TanhRNNCell):
    """``h' = 0.5 h + 0.5 tanh(W a)``: inherits ``preactivation``/``activation`` that are no longer its step."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * h + 0.5 * super().forward(x, h)


class DoubledPreactivation(TanhRNNCell):
    """``z = 2 (W_h h + W_x x + b)``: ``forward = activation(preactivation)`` still, but ``z = W a`` no longer."""

    def preactivation(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 2 * super().preactivation(x, h)


class GainedTanh(TanhRNNCell):
    """``h' = tanh(W a) + g * h`` with the gain ``g`` initialised to zero: equal to the factorisation now, not once
    an optimizer moves ``g``."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.gain = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return super().forward(x, h) + self.gain * h


class DoubledInfluence(InfluenceBalancingCell):
    """Another step than ``A h + theta c``: the closed form of the parent would be wrong for it."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x, h)


def make(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "half-leaky":
        cell = HalfLeakyTanh(ref.INPUT, ref.HIDDEN)
    elif kind == "doubled-preactivation":
        cell = DoubledPreactivation(ref.INPUT, ref.HIDDEN)
    elif kind == "gained":
        cell = GainedTanh(ref.INPUT, ref.HIDDEN)
    elif kind == "parametrised":
        cell = TanhRNNCell(ref.INPUT, ref.HIDDEN)
        torch.nn.utils.parametrize.register_parametrization(cell, "weight_hh", _Skew())
    else:
        raise ValueError(kind)
    return cell.to(DTYPE)


class _Skew(nn.Module):
    """``W = A - A^T``: the parameter is ``A``, not ``W``."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a - a.T


def summed(estimator, xs, h0, cots) -> torch.Tensor:
    """The flat estimate of ``d sum_t <cots[t], h_t> / d theta``, summed over streams and steps."""
    state = estimator.initial_state(h0)
    total = torch.zeros(estimator.layout.size, dtype=DTYPE)
    for t in range(len(xs)):
        _, state = estimator.step(xs[t], state)
        total += estimator.layout.flatten(estimator.gradient(state, cots[t]), lead=0)
    return total


# -- what the issue saw: the estimators that used the factorisation refuse, with the reason ---------------------
@pytest.mark.parametrize(
    "build",
    [
        lambda cell: KFRTRL(cell, generator=0),
        lambda cell: UORO(cell, projection="preactivation", generator=0),
        lambda cell: UORO(cell, projection="none", generator=0),
    ],
    ids=["kf_rtrl", "uoro-preactivation", "uoro-none"],
)
def test_estimators_that_are_the_factorisation_refuse_a_cell_whose_forward_is_not_it(build):
    cell = make("half-leaky")
    with pytest.raises(ValueError, match=r"HalfLeakyTanh\.forward\(x, h\) is not activation\(preactivation") as info:
        build(cell)
    message = str(info.value)
    assert "forward comes from HalfLeakyTanh, preactivation from TanhRNNCell" in message
    # the estimators that can train it, from their own checks
    assert "Estimators that can train HalfLeakyTanh: RFLO, RTRL, SnAp, TruncatedBPTT, UORO" in message
    assert "KFRTRL" not in message.split("Estimators that can train")[1]


def test_the_refusal_holds_through_the_lightning_module():
    with pytest.raises(ValueError, match="is not activation\\(preactivation.*Estimators that can train HalfLeakyTanh"):
        OnlineRNNModule(make("half-leaky"), output_size=2, estimator="kf_rtrl")
    with pytest.raises(ValueError, match="projection='preactivation' needs"):
        OnlineRNNModule(
            make("half-leaky"), output_size=2, estimator="uoro", estimator_options={"projection": "preactivation"}
        )


def test_a_zero_gain_now_does_not_hide_a_step_that_is_not_the_factorisation():
    """The check moves the parameters at random: ``g = 0`` today, not after an optimizer step."""
    cell = make("gained")
    with pytest.raises(ValueError, match="GainedTanh.forward"):
        UORO(cell, projection="preactivation", generator=0)


def test_the_generic_products_at_the_preactivation_refuse_too():
    cell = make("half-leaky")
    x, h = torch.randn(2, ref.INPUT, dtype=DTYPE), torch.randn(2, ref.HIDDEN, dtype=DTYPE)
    lin = linearize(cell, x, h, ParameterLayout(cell))
    assert type(lin) is StepLinearization  # no closed form of TanhRNNCell for it
    torch.testing.assert_close(lin.h_new, cell(x, h), **TOL)
    with pytest.raises(ValueError, match="is not activation\\(preactivation.*projection='state' or 'parameter'"):
        lin.activation_jacobian()


def test_the_oracle_refuses_to_cut_such_a_cell_at_its_preactivation():
    cell = make("half-leaky")
    xs, h0, grads = torch.randn(4, ref.INPUT, dtype=DTYPE), torch.zeros(ref.HIDDEN, dtype=DTYPE), torch.randn(4, 3)
    with pytest.raises(ValueError, match="cut='preactivation' needs forward = activation"):
        oracle_terms(cell, xs, h0, grads.to(DTYPE), cut="preactivation")
    assert oracle_terms(cell, xs, h0, grads.to(DTYPE), cut="state").gradient.abs().sum() > 0


def test_z_equals_w_a_is_checked_apart_from_the_step():
    """Overriding ``preactivation`` keeps ``forward = activation(preactivation)`` (the cut vertex holds) but breaks
    ``z = W a``: KF-RTRL and UORO without projection refuse, the preactivation projection is taken."""
    cell = make("doubled-preactivation")
    assert linearization.factorisation_problem(cell, ("step",)) is None
    for build in (lambda: KFRTRL(cell, generator=0), lambda: UORO(cell, projection="none", generator=0)):
        with pytest.raises(ValueError, match=r"DoubledPreactivation\.preactivation\(x, h\) is not W a"):
            build()
    with pytest.raises(ValueError, match="use projection='preactivation', 'state' or 'parameter'"):
        UORO(cell, projection="none", generator=0)
    UORO(cell, projection="preactivation", generator=0)


def test_a_parametrised_cell_has_no_w_among_its_parameters():
    cell = make("parametrised")
    assert linearization.factorisation_problem(cell, ("step",)) is None  # forward is still activation(preactivation)
    with pytest.raises(ValueError, match="not parameters of the cell.*parametrisation"):
        KFRTRL(cell, generator=0)
    assert not RFLO(cell, tau=2.0).factored


# -- what they compute instead: the gradient of the real step ---------------------------------------------------
@pytest.mark.parametrize("kind", ["half-leaky", "doubled-preactivation", "gained", "parametrised"])
def test_exact_estimators_equal_backprop_through_time(kind):
    cell = make(kind)
    xs, h0, cots = ref.sequence(cell, STEPS, 2)
    want = ref.bptt_gradient(cell, xs, h0, cots)
    for estimator in (RTRL(cell), TruncatedBPTT(cell, k=STEPS), SnAp(cell, order=2)):
        torch.testing.assert_close(summed(estimator, xs, h0, cots), want, **TOL, msg=type(estimator).__name__)


@pytest.mark.parametrize("kind", ["half-leaky", "doubled-preactivation", "gained", "parametrised"])
def test_rflo_with_tau_one_is_one_step_truncated_backprop(kind):
    cell = make(kind, seed=1)
    xs, h0, cots = ref.sequence(cell, STEPS, 2, seed=3)
    want = ref.truncated_gradient(cell, xs, h0, cots, 1)
    torch.testing.assert_close(summed(RFLO(cell, tau=1), xs, h0, cots), want, **TOL)
    torch.testing.assert_close(summed(TruncatedBPTT(cell, k=1), xs, h0, cots), want, **TOL)


@pytest.mark.parametrize(
    ("kind", "projection"),
    [
        ("half-leaky", "state"),
        ("half-leaky", "parameter"),
        ("doubled-preactivation", "preactivation"),
        ("parametrised", "preactivation"),
    ],
)
def test_uoro_is_unbiased_on_the_real_step(kind, projection):
    cell = make(kind)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, ref.INPUT, generator=g, dtype=DTYPE)
    h0 = 0.5 * torch.randn(ref.HIDDEN, generator=g, dtype=DTYPE)
    cots = torch.randn(STEPS, ref.HIDDEN, generator=g, dtype=DTYPE)
    exact = ref.bptt_gradient(cell, xs[:, None], h0[None], cots[:, None])
    estimates = total_estimates(UORO(cell, projection=projection, generator=5), xs, h0, cots, DRAWS)
    z = z_scores(estimates, exact)
    assert z.abs().max() < critical_z(exact.numel()), f"max |z| = {z.abs().max():.2f}"
    # power: the gradient of the step the factorisation describes (the parent's) is rejected
    if kind == "half-leaky":
        parent = TanhRNNCell(ref.INPUT, ref.HIDDEN).to(DTYPE)
        parent.load_state_dict(cell.state_dict())
        other = ref.bptt_gradient(parent, xs[:, None], h0[None], cots[:, None])
        assert z_scores(estimates, other).abs().max() > critical_z(exact.numel())


def test_a_subclass_of_the_influence_balancing_cell_takes_the_generic_products():
    torch.manual_seed(0)
    cell = DoubledInfluence(units=4, positive=2, theta=0.3, input_size=ref.INPUT).to(DTYPE)
    x, h = torch.randn(2, ref.INPUT, dtype=DTYPE), torch.randn(2, 4, dtype=DTYPE)
    assert type(linearize(cell, x, h, ParameterLayout(cell))) is StepLinearization
    xs, h0, cots = ref.sequence(cell, STEPS, 2)
    torch.testing.assert_close(summed(RTRL(cell), xs, h0, cots), ref.bptt_gradient(cell, xs, h0, cots), **TOL)


# -- the check: once per cell, free at every step, the class's verdict -------------------------------------------
def test_the_check_runs_once_per_cell_and_not_at_each_step(monkeypatch):
    calls = []
    check = linearization._CHECKS["step"]
    monkeypatch.setitem(linearization._CHECKS, "step", lambda *args: calls.append(1) or check(*args))
    cell = make("doubled-preactivation")  # the generic path: the products at z check the step at every step
    estimator = UORO(cell, projection="preactivation", generator=0)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.5)
    xs, h0, cots = ref.sequence(cell, STEPS, 2)
    state = estimator.initial_state(h0)
    for t in range(STEPS):
        _, state = estimator.step(xs[t], state)
        for p, g in zip(cell.parameters(), estimator.gradient(state, cots[t]).values(), strict=True):
            p.grad = g.clone()
        optimizer.step()  # the weights move; the class, and so the verdict, does not
    assert len(calls) == 1
    torch.nn.utils.parametrize.register_parametrization(cell, "weight_hh", _Skew())  # a new class, new names
    UORO(cell, projection="preactivation", generator=0)
    assert len(calls) == 2


def test_the_library_s_cells_hold_their_factorisations():
    torch.manual_seed(0)
    tanh = TanhRNNCell(2, 3).to(DTYPE)
    assert linearization.factorisation_problem(tanh, ("step", "complete", "elementwise")) is None
    for name in ref.PREACTIVATION_CELLS:
        assert linearization.factorisation_problem(ref.make_cell(name), ("step",)) is None, name
