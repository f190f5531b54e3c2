"""ModReLURNNCell: its closed-form products equal the generic torch.func path, and RTRL through it equals BPTT."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.online import RTRL, UORO, ModReLURNNCell, ParameterLayout, StepLinearization, linearize

B, INPUTS, HIDDEN = 3, 2, 4
TIGHT = dict(rtol=0, atol=1e-12)


def setup(seed: int = 0):
    torch.manual_seed(seed)
    cell = ModReLURNNCell(INPUTS, HIDDEN).double()
    with torch.no_grad():
        cell.bias.uniform_(-1.5, 0.3)  # thresholds that switch some units off
    g = torch.Generator().manual_seed(seed + 10)
    x = torch.randn(B, INPUTS, generator=g, dtype=torch.float64)
    h = torch.randn(B, HIDDEN, generator=g, dtype=torch.float64)
    return cell, x, h, ParameterLayout(cell), g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_equals_generic(seed):
    cell, x, h, layout, g = setup(seed)
    generic, fast = StepLinearization(cell, x, h, layout), linearize(cell, x, h, layout)
    assert type(fast).__name__ == "ModReLUStepLinearization"
    assert 0 < fast.on.sum() < fast.on.numel()  # both branches of modReLU are exercised
    torch.testing.assert_close(fast.h_new, generic.h_new, **TIGHT)
    torch.testing.assert_close(fast.preactivation, generic.preactivation, **TIGHT)
    v = torch.randn(B, HIDDEN, generator=g, dtype=torch.float64)
    cols = torch.randn(B, HIDDEN, 3, generator=g, dtype=torch.float64)
    n = torch.randn(B, layout.size, generator=g, dtype=torch.float64)
    torch.testing.assert_close(fast.state_jvp(v), generic.state_jvp(v), **TIGHT)
    torch.testing.assert_close(fast.state_jvp_columns(cols), generic.state_jvp_columns(cols), **TIGHT)
    torch.testing.assert_close(fast.parameter_vjp(v), generic.parameter_vjp(v), **TIGHT)
    torch.testing.assert_close(fast.parameter_jvp(n), generic.parameter_jvp(n), **TIGHT)
    torch.testing.assert_close(fast.parameter_jacobian(), generic.parameter_jacobian(), **TIGHT)
    torch.testing.assert_close(fast.activation_jvp(v), generic.activation_jvp(v), **TIGHT)
    torch.testing.assert_close(fast.activation_jacobian(), generic.activation_jacobian(), **TIGHT)
    torch.testing.assert_close(fast.preactivation_vjp(v), generic.preactivation_vjp(v), **TIGHT)
    torch.testing.assert_close(fast.post_activation_vjp(v), generic.post_activation_vjp(v), **TIGHT)
    assert fast.has_post_activation_parameters() and generic.has_post_activation_parameters()
    for kind in ("parameter", "preactivation", "post_activation"):
        torch.testing.assert_close(fast.vjp_norm(kind, v), generic.vjp_norm(kind, v), **TIGHT)
        scale = torch.randn(B, generator=g, dtype=torch.float64)
        fast_out, generic_out = n.clone(), n.clone()
        fast.vjp_accumulate(kind, fast_out, v, scale)
        generic.vjp_accumulate(kind, generic_out, v, scale)
        torch.testing.assert_close(fast_out, generic_out, **TIGHT)


def test_rtrl_through_the_closed_form_equals_bptt():
    cell, _, _, _, g = setup(3)
    xs = torch.randn(B, 6, INPUTS, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, HIDDEN, generator=g, dtype=torch.float64)
    cots = torch.randn(B, 6, HIDDEN, generator=g, dtype=torch.float64)
    h, loss = h0, 0
    for t in range(6):
        h = cell(xs[:, t], h)
        loss = loss + (h * cots[:, t]).sum()
    reference = torch.autograd.grad(loss, list(cell.parameters()))
    estimator = RTRL(cell)
    state = estimator.initial_state(h0)
    total = {n: torch.zeros_like(p) for n, p in cell.named_parameters()}
    for t in range(6):
        _, state = estimator.step(xs[:, t], state)
        for n, grad in estimator.gradient(state, cots[:, t]).items():
            total[n] += grad
    for (name, _), expected in zip(cell.named_parameters(), reference, strict=True):
        torch.testing.assert_close(total[name], expected, rtol=1e-10, atol=1e-10)


def test_none_projection_refuses_the_bias_after_the_preactivation():
    with pytest.raises(ValueError, match="z = W a"):
        UORO(ModReLURNNCell(INPUTS, HIDDEN), projection="none")


def test_bad_sizes():
    with pytest.raises(ValueError, match="hidden_size"):
        ModReLURNNCell(2, 0)


class DoubledModReLU(ModReLURNNCell):
    """A subclass whose step is not modReLU's: the closed forms would be wrong for it."""

    def forward(self, x, h):
        return 2 * super().forward(x, h)


def test_a_subclass_that_changes_the_step_or_a_parametrised_cell_gets_the_generic_products():
    torch.manual_seed(3)
    doubled = DoubledModReLU(INPUTS, HIDDEN).double()
    parametrised = ModReLURNNCell(INPUTS, HIDDEN).double()
    torch.nn.utils.parametrize.register_parametrization(parametrised, "weight_hh", torch.nn.Identity())
    for cell in (doubled, parametrised):
        layout = ParameterLayout(cell)
        x, h = torch.randn(B, INPUTS, dtype=torch.float64), torch.randn(B, HIDDEN, dtype=torch.float64)
        fast = linearize(cell, x, h, layout)
        assert type(fast) is StepLinearization
        torch.testing.assert_close(fast.h_new, cell(x, h), **TIGHT)
        v = torch.randn(B, HIDDEN, dtype=torch.float64)
        reference = torch.func.jvp(lambda s: cell(x, s), (h,), (v,))[1]
        torch.testing.assert_close(fast.state_jvp(v), reference, **TIGHT)
