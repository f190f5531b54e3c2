import pytest
import torch
from torch import nn

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import GRUCell, InfluenceBalancingCell, TanhRNNCell

from .references import DTYPE, TRANSITIONS


def _inputs(batch=4, inputs=3, hidden=5):
    return torch.randn(batch, inputs, dtype=DTYPE), torch.randn(batch, hidden, dtype=DTYPE)


def test_gru_cell_equals_torch_gru_cell():
    cell = GRUCell(3, 5).to(DTYPE)
    reference = nn.GRUCell(3, 5).to(DTYPE)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, name).copy_(getattr(cell, name))
    x, h = _inputs()
    torch.testing.assert_close(cell(x, h), reference(x, h), rtol=0, atol=1e-14)


def test_gru_cell_parameter_layout_matches_torch():
    shapes = {n: tuple(p.shape) for n, p in GRUCell(3, 5).named_parameters()}
    assert shapes == {n: tuple(p.shape) for n, p in nn.GRUCell(3, 5).named_parameters()}


def test_tanh_cell_equals_torch_rnn_cell():
    reference = nn.RNNCell(3, 5, nonlinearity="tanh").to(DTYPE)
    cell = TanhRNNCell(3, 5).to(DTYPE)
    with torch.no_grad():
        cell.weight_ih.copy_(reference.weight_ih)
        cell.weight_hh.copy_(reference.weight_hh)
        cell.bias.copy_(reference.bias_ih + reference.bias_hh)
    x, h = _inputs()
    torch.testing.assert_close(cell(x, h), reference(x, h), rtol=0, atol=1e-14)


def test_tanh_cell_forward_is_activation_of_preactivation():
    cell = TanhRNNCell(3, 5).to(DTYPE)
    x, h = _inputs()
    z = cell.preactivation(x, h)
    torch.testing.assert_close(z, h @ cell.weight_hh.T + x @ cell.weight_ih.T + cell.bias, rtol=0, atol=1e-14)
    torch.testing.assert_close(cell(x, h), torch.tanh(z), rtol=0, atol=0)
    torch.testing.assert_close(cell.activation(z), torch.tanh(z), rtol=0, atol=0)


def test_tanh_cell_preactivation_weights_contract():
    """z = [W_h W_x b] a with a = preactivation_input(x, h): the factorisation J^z_W = I (x) a^T."""
    cell = TanhRNNCell(3, 5).to(DTYPE)
    x, h = _inputs()
    columns = [getattr(cell, n) for n in cell.preactivation_weights]
    weight = torch.cat([c if c.dim() == 2 else c[:, None] for c in columns], dim=1)
    a = cell.preactivation_input(x, h)
    assert a.shape == (4, 5 + 3 + 1)
    torch.testing.assert_close(a, torch.cat([h, x, torch.ones(4, 1, dtype=DTYPE)], dim=1), rtol=0, atol=0)
    torch.testing.assert_close(cell.preactivation(x, h), a @ weight.T, rtol=0, atol=1e-14)
    assert set(cell.preactivation_weights) == {n for n, _ in cell.named_parameters()}


@pytest.mark.parametrize("units,positive", [(23, 10), (5, 2), (4, 4), (6, 0), (1, 1)])
def test_influence_balancing_transition_and_signs(units, positive):
    cell = InfluenceBalancingCell(units=units, positive=positive, theta=0.7, input_size=2).to(DTYPE)
    a = torch.zeros(units, units, dtype=DTYPE)
    for i in range(units):
        a[i, i] = 0.5
        if i + 1 < units:
            a[i, i + 1] = 0.5  # unit i reads unit i + 1
    c = torch.tensor([1.0 if i < positive else -1.0 for i in range(units)], dtype=DTYPE)
    torch.testing.assert_close(cell.transition, a, rtol=0, atol=0)
    torch.testing.assert_close(cell.signs, c, rtol=0, atol=0)
    h = torch.randn(3, units, dtype=DTYPE)
    x = torch.randn(3, 2, dtype=DTYPE)
    theta = cell.theta.item()  # 0.7 rounded to float32 at construction (default dtype), then widened
    assert theta == pytest.approx(0.7, abs=1e-7)
    expected = torch.stack([a @ h[b] + theta * c for b in range(3)])
    torch.testing.assert_close(cell(x, h), expected, rtol=0, atol=1e-15)
    # the input is ignored
    torch.testing.assert_close(cell(torch.randn(3, 2, dtype=DTYPE), h), expected, rtol=0, atol=0)
    assert [(n, p.shape) for n, p in cell.named_parameters()] == [("theta", torch.Size([]))]


@pytest.mark.parametrize("units,positive,theta", [(23, 10, 0.5), (23, 10, -1.25), (7, 5, 2.0), (4, 0, 1.0)])
def test_influence_balancing_fixed_point_first_unit(units, positive, theta):
    cell = InfluenceBalancingCell(units=units, positive=positive, theta=theta).to(DTYPE)
    h = torch.zeros(1, units, dtype=DTYPE)
    x = torch.zeros(1, 1, dtype=DTYPE)
    with torch.no_grad():
        for _ in range(400):
            h = cell(x, h)
        assert torch.allclose(cell(x, h), h, rtol=0, atol=1e-10)  # converged
    assert h[0, 0].item() == pytest.approx(2 * theta * (2 * positive - units), abs=1e-9)


def test_influence_balancing_defaults_have_negative_total_influence():
    cell = InfluenceBalancingCell()
    assert (cell.hidden_size, cell.positive) == (23, 10)
    assert 2 * 10 - 23 < 0 and cell.theta.item() == 0.0


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: InfluenceBalancingCell(units=0), "units must be a positive integer"),
        (lambda: InfluenceBalancingCell(units=4, positive=5), "positive must be an int in"),
        (lambda: InfluenceBalancingCell(units=4, positive=-1), "positive must be an int in"),
        (lambda: InfluenceBalancingCell(units=4, positive=1.5), "positive must be an int in"),
        (lambda: InfluenceBalancingCell(input_size=0), "input_size must be a positive integer"),
        (lambda: InfluenceBalancingCell(units=2.0), "units must be a positive integer"),
        (lambda: TanhRNNCell(0, 3), "input_size must be a positive integer"),
        (lambda: TanhRNNCell(2, True), "hidden_size must be a positive integer"),
        (lambda: GRUCell(2, -1), "hidden_size must be a positive integer"),
        (lambda: GRUCell(1.0, 2), "input_size must be a positive integer"),
    ],
)
def test_bad_sizes_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _reference_activation(z, bias, nonlinearity):
    if nonlinearity == "modrelu":
        magnitude = torch.clamp(z.abs() + bias, min=0)
        return torch.where(z >= 0, magnitude, -magnitude) * (z != 0)
    return torch.tanh(z + bias)


@pytest.mark.parametrize("transition", TRANSITIONS)
@pytest.mark.parametrize("nonlinearity", ["modrelu", "tanh"])
def test_orthogonal_cell_forward_is_activation_of_preactivation(transition, nonlinearity):
    cell = OrthogonalRNNCell(3, 5, transition=transition, nonlinearity=nonlinearity).to(DTYPE)
    with torch.no_grad():
        cell.bias.copy_(0.5 * torch.randn(5, dtype=DTYPE))
    x, h = _inputs()
    z = cell.preactivation(x, h)
    expected = _reference_activation(z, cell.bias, nonlinearity)
    torch.testing.assert_close(cell.activation(z), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(cell(x, h), expected, rtol=0, atol=1e-15)
    # the preactivation is U h + V x with U the transition's (linear or not) map
    torch.testing.assert_close(z, cell.transition(h) + x @ cell.input_kernel.weight.T, rtol=0, atol=1e-14)
