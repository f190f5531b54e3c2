"""masked_loss_sum: entries where the mask is false add nothing to the loss nor to its gradient, whatever their
targets hold (padding: NaN, inf, anything)."""

import math

import pytest
import torch

from lightning_ortho.online.losses import masked_loss_sum

DTYPE = torch.float64


def _case(loss):
    g = torch.Generator().manual_seed(0)
    outputs = torch.randn(4, 3, dtype=DTYPE, generator=g)
    target = torch.randn(4, 3, dtype=DTYPE, generator=g)
    if loss == "cross_entropy":
        target = torch.softmax(target, -1)  # soft targets (probabilities)
    mask = torch.tensor([True, False, True, False])
    return outputs, target, mask


def _value_and_gradient(outputs, target, mask, loss):
    outputs = outputs.clone().requires_grad_(True)
    value = masked_loss_sum(outputs, target, mask, loss)
    (gradient,) = torch.autograd.grad(value, outputs)
    return value.detach(), gradient


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("padding", [math.nan, math.inf, -math.inf])
def test_padding_at_masked_float_targets_changes_neither_the_loss_nor_its_gradient(loss, padding):
    outputs, target, mask = _case(loss)
    padded, zeroed = target.clone(), target.clone()
    padded[~mask], zeroed[~mask] = padding, 0.0
    value, gradient = _value_and_gradient(outputs, padded, mask, loss)
    expected_value, expected_gradient = _value_and_gradient(outputs, zeroed, mask, loss)
    assert torch.isfinite(gradient).all()
    assert torch.equal(value, expected_value) and torch.equal(gradient, expected_gradient)
    assert torch.equal(gradient[~mask], torch.zeros_like(gradient[~mask]))  # masked entries: exactly zero


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_the_scored_entries_give_the_textbook_loss_and_gradient(loss):
    # Independent reference: 0.5 ||o - y||^2 with dl/do = o - y; -sum_k y_k log softmax(o)_k with dl/do =
    # softmax(o) - y (soft targets summing to 1); summed over the scored streams only.
    outputs, target, mask = _case(loss)
    padded = target.clone()
    padded[~mask] = math.nan
    value, gradient = _value_and_gradient(outputs, padded, mask, loss)
    o, y = outputs[mask], target[mask]
    if loss == "mse":
        expected, expected_gradient = 0.5 * (o - y).square().sum(), o - y
    else:
        expected, expected_gradient = -(y * torch.log_softmax(o, -1)).sum(), torch.softmax(o, -1) - y
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(gradient[mask], expected_gradient)
