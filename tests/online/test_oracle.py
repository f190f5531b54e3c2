"""The section 6-7 variance analysis against Monte Carlo draws of the estimator it describes."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import (
    RTRL,
    UORO,
    TanhRNNCell,
    optimal_alpha,
    optimal_q0,
    oracle_terms,
    preactivation_b_matrix,
    preactivation_variance,
    total_variance,
)
from tests.online.test_uoro import HIDDEN, INPUTS, STEPS, sequence, total_estimates

DRAWS = 100_000


@pytest.fixture(scope="module")
def cell() -> TanhRNNCell:
    torch.manual_seed(0)
    cell = TanhRNNCell(INPUTS, HIDDEN).double()
    with torch.no_grad():
        cell.weight_hh.mul_(3)  # a lopsided B, where the rescalings matter
    return cell


@pytest.mark.parametrize("cut", ["preactivation", "state"])
def test_oracle_gradient_is_the_exact_gradient(cell, cut):
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    torch.testing.assert_close(
        oracle_terms(cell, xs, h0, loss_gradients, cut=cut).gradient, exact, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("cut", ["preactivation", "state"])
def test_total_variance_formula_matches_monte_carlo(cell, cut):
    """Equation 6.5 with random alpha_t and Q0 against the sample total variance of 100,000 independent estimates;
    the tolerance is 4 standard errors of the sample total variance, estimated from the same draws."""
    xs, h0, loss_gradients = sequence()
    g = torch.Generator().manual_seed(2)
    alpha = 0.5 + torch.rand(STEPS, generator=g, dtype=torch.float64)
    q0 = torch.eye(HIDDEN, dtype=torch.float64) + 0.3 * torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64)
    predicted = total_variance(oracle_terms(cell, xs, h0, loss_gradients, cut=cut), alpha[:, None, None] * q0)

    estimator = UORO(cell, projection=cut, rescaling=(alpha, q0), generator=3)
    estimates = total_estimates(estimator, xs, h0, loss_gradients, DRAWS)
    squared = (estimates - estimates.mean(0)).square().sum(1)  # its mean is the sample tr Cov
    standard_error = squared.std() / DRAWS**0.5
    assert abs(squared.mean() - predicted) < 4 * standard_error, (squared.mean().item(), predicted.item())
    # The formula is not trivially close: the identity rescaling predicts a clearly different variance.
    other = total_variance(oracle_terms(cell, xs, h0, loss_gradients, cut=cut), torch.eye(HIDDEN, dtype=torch.float64))
    assert abs(other - predicted) > 10 * standard_error


def test_b_form_equals_the_sum_form_and_q0_attains_the_minimum(cell):
    xs, h0, loss_gradients = sequence()
    terms = oracle_terms(cell, xs, h0, loss_gradients)
    g = torch.Generator().manual_seed(4)
    alpha = 0.5 + torch.rand(STEPS, generator=g, dtype=torch.float64)
    q0 = torch.eye(HIDDEN, dtype=torch.float64) + 0.3 * torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64)
    # V(Q) (B form) = total variance minus its Q-independent part, read off at Q = I.
    fixed_part = total_variance(terms, torch.eye(HIDDEN, dtype=torch.float64)) - preactivation_variance(
        terms, None, None
    )
    sum_form = total_variance(terms, alpha[:, None, None] * q0) - fixed_part
    torch.testing.assert_close(preactivation_variance(terms, q0, alpha), sum_form, rtol=1e-10, atol=0)

    b = preactivation_b_matrix(terms)
    best = optimal_q0(b)
    identity = preactivation_variance(terms, None, None)
    optimum = preactivation_variance(terms, best, None)
    torch.testing.assert_close(identity, torch.trace(b) * HIDDEN)  # tr(B) tr(I)
    torch.testing.assert_close(optimum, torch.linalg.eigvalsh(b).sqrt().sum() ** 2)  # tr(B^{1/2})^2
    assert optimum < identity
    for _ in range(20):
        perturbed = best @ (
            torch.eye(HIDDEN, dtype=torch.float64)
            + 0.05 * torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64)
        )
        assert preactivation_variance(terms, perturbed, None) >= optimum * (1 - 1e-12)


def test_optimal_alpha_is_the_minimiser_a_generic_optimiser_finds(cell):
    xs, h0, loss_gradients = sequence()
    terms = oracle_terms(cell, xs, h0, loss_gradients)
    q0 = optimal_q0(preactivation_b_matrix(terms))
    alpha = optimal_alpha(terms, q0)
    log_alpha = torch.zeros(STEPS, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS([log_alpha], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        optimiser.zero_grad()
        value = preactivation_variance(terms, q0, log_alpha.exp())
        value.backward()
        return value

    optimiser.step(closure)
    found = preactivation_variance(terms, q0, log_alpha.detach().exp())
    torch.testing.assert_close(preactivation_variance(terms, q0, alpha), found, rtol=1e-8, atol=0)
    assert preactivation_variance(terms, q0, alpha) < preactivation_variance(terms, q0, None)


def test_oracle_refuses_what_it_cannot_compute(cell):
    xs, h0, loss_gradients = sequence()
    with pytest.raises(ValueError, match="loss_gradients"):
        oracle_terms(cell, xs, h0, loss_gradients[:-1])
    with pytest.raises(ValueError, match="cut must be"):
        oracle_terms(cell, xs, h0, loss_gradients, cut="parameter")
    orthogonal = OrthogonalRNNCell(INPUTS, HIDDEN, transition="cayley").double()
    with pytest.raises(ValueError, match="activation reads parameters"):
        oracle_terms(orthogonal, xs, h0, loss_gradients)
    terms = oracle_terms(orthogonal, xs, h0, loss_gradients, cut="state")
    with pytest.raises(ValueError, match="z = W a"):
        preactivation_b_matrix(terms)
    with pytest.raises(ValueError, match="ridge"):
        optimal_q0(torch.zeros(HIDDEN, HIDDEN, dtype=torch.float64))
