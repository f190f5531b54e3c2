import pytest
import torch
from torch import nn

from lightning_ortho.online import InfluenceBalancingCell, ParameterLayout, StepLinearization, linearize
from lightning_ortho.online.gru_linearization import GRUStepLinearization
from lightning_ortho.online.linearization import (
    TanhStepLinearization,
    factorisation_problem,
    flatten_weight,
    weight_columns,
    weight_rows,
)

from . import references as ref
from .references import CELLS, DTYPE, PREACTIVATION_CELLS

B = 3
TOL = dict(rtol=1e-10, atol=1e-12)


def _setup(name, seed=0):
    cell = ref.make_cell(name, seed)
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(B, cell.input_size, generator=g, dtype=DTYPE)
    h = 0.7 * torch.randn(B, cell.hidden_size, generator=g, dtype=DTYPE)
    return cell, x, h, ParameterLayout(cell), g


@pytest.mark.parametrize("name", CELLS)
def test_generic_state_and_parameter_products_equal_dense_autograd(name):
    cell, x, h, layout, g = _setup(name)
    lin = StepLinearization(cell, x, h, layout)
    hidden, p = cell.hidden_size, ref.param_count(cell)
    assert layout.size == p

    torch.testing.assert_close(lin.h_new, cell(x, h).detach(), rtol=0, atol=1e-14)
    j_h = ref.state_jacobian(cell, x, h)  # (B, H, H)
    j_theta = ref.parameter_jacobian(cell, x, h)  # (B, H, P)
    assert j_theta.abs().sum() > 0

    v = torch.randn(B, hidden, generator=g, dtype=DTYPE)
    torch.testing.assert_close(lin.state_jvp(v), torch.einsum("bij,bj->bi", j_h, v), **TOL)
    columns = torch.randn(B, hidden, 4, generator=g, dtype=DTYPE)
    torch.testing.assert_close(lin.state_jvp_columns(columns), j_h @ columns, **TOL)

    c = torch.randn(B, hidden, generator=g, dtype=DTYPE)
    torch.testing.assert_close(lin.parameter_vjp(c), torch.einsum("bh,bhp->bp", c, j_theta), **TOL)
    n = torch.randn(B, p, generator=g, dtype=DTYPE)
    torch.testing.assert_close(lin.parameter_jvp(n), torch.einsum("bhp,bp->bh", j_theta, n), **TOL)
    torch.testing.assert_close(lin.parameter_jacobian(), j_theta, **TOL)


@pytest.mark.parametrize("name", CELLS)
def test_parameter_vjp_is_per_stream(name):
    """A cotangent on one stream only gives that stream's row and zero elsewhere (no mixing across streams)."""
    cell, x, h, layout, g = _setup(name, seed=3)
    lin = StepLinearization(cell, x, h, layout)
    c = torch.zeros(B, cell.hidden_size, dtype=DTYPE)
    c[1] = torch.randn(cell.hidden_size, generator=g, dtype=DTYPE)
    rows = lin.parameter_vjp(c)
    single = ref.rows_jacobian(cell(x[1:2], h[1:2])[0], ref.parameters(cell))  # (H, P) of stream 1 alone
    torch.testing.assert_close(rows[1], c[1] @ single, **TOL)
    assert rows[1].abs().sum() > 0
    torch.testing.assert_close(rows[[0, 2]], torch.zeros(2, layout.size, dtype=DTYPE), rtol=0, atol=0)


@pytest.mark.parametrize("name", PREACTIVATION_CELLS)
def test_generic_preactivation_products_equal_dense_autograd(name):
    cell, x, h, layout, g = _setup(name, seed=1)
    lin = StepLinearization(cell, x, h, layout)
    z = cell.preactivation(x, h).detach()
    torch.testing.assert_close(lin.preactivation, z, rtol=0, atol=1e-14)
    hidden, zdim = cell.hidden_size, z.shape[1]

    j_act = ref.activation_jacobian(cell, z)  # (B, H, Z)
    v = torch.randn(B, zdim, generator=g, dtype=DTYPE)
    torch.testing.assert_close(lin.activation_jvp(v), torch.einsum("bij,bj->bi", j_act, v), **TOL)
    torch.testing.assert_close(lin.activation_jacobian(), j_act, **TOL)

    j_pre = ref.preactivation_parameter_jacobian(cell, x, h)  # (B, Z, P)
    c = torch.randn(B, zdim, generator=g, dtype=DTYPE)
    torch.testing.assert_close(lin.preactivation_vjp(c), torch.einsum("bz,bzp->bp", c, j_pre), **TOL)

    j_post = ref.post_activation_jacobian(cell, z)  # (B, H, P)
    c_h = torch.randn(B, hidden, generator=g, dtype=DTYPE)
    post = lin.post_activation_vjp(c_h)
    torch.testing.assert_close(post, torch.einsum("bh,bhp->bp", c_h, j_post), **TOL)

    # chain rule through the cut vertex: J^h_theta = J^h_z J^z_theta + (J^h_theta at fixed z)
    through_z = lin.preactivation_vjp(torch.einsum("bh,bhz->bz", c_h, j_act))
    torch.testing.assert_close(through_z + post, lin.parameter_vjp(c_h), **TOL)


@pytest.mark.parametrize("name", PREACTIVATION_CELLS)
def test_post_activation_parameters(name):
    """OrthogonalRNNCell adds its bias after z (nonzero post-activation product, bias entries only);
    TanhRNNCell has every parameter inside z (zero)."""
    cell, x, h, layout, g = _setup(name, seed=2)
    lin = StepLinearization(cell, x, h, layout)
    post = lin.post_activation_vjp(torch.randn(B, cell.hidden_size, generator=g, dtype=DTYPE))
    bias = layout.unflatten(post)["bias"]
    others = torch.cat([t.reshape(B, -1) for n, t in layout.unflatten(post).items() if n != "bias"], dim=1)
    if name == "tanh":
        assert not lin.has_post_activation_parameters()
        torch.testing.assert_close(post, torch.zeros_like(post), rtol=0, atol=0)
    else:
        assert lin.has_post_activation_parameters()
        # nonzero exactly where the unit is alive (modReLU's dead units output 0 and have zero slope; tanh never)
        assert torch.equal(bias != 0, lin.h_new != 0)
        assert bias.abs().sum() > 0
        torch.testing.assert_close(others, torch.zeros_like(others), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["gru", "influence"])
def test_cells_without_preactivation_refuse_preactivation_products(name):
    cell, x, h, layout, _ = _setup(name)
    lin = StepLinearization(cell, x, h, layout)
    with pytest.raises(ValueError, match="has no preactivation"):
        lin.preactivation  # noqa: B018
    with pytest.raises(ValueError, match="projection='preactivation'"):
        lin.require_preactivation()


# -- the closed form of the tanh RNN --------------------------------------------------------------------------
def _both(seed=0):
    cell, x, h, layout, g = _setup("tanh", seed)
    return cell, layout, g, StepLinearization(cell, x, h, layout), linearize(cell, x, h, layout)


def test_linearize_dispatch():
    cell, x, h, layout, _ = _setup("tanh")
    assert type(linearize(cell, x, h, layout)) is TanhStepLinearization
    assert type(cell.linearize(x, h)) is TanhStepLinearization
    assert type(linearize(cell, x, h, layout, closed_form=False)) is StepLinearization
    other, xo, ho, lo, _ = _setup("gru")
    assert type(linearize(other, xo, ho, lo)) is GRUStepLinearization
    assert type(linearize(other, xo, ho, lo, closed_form=False)) is StepLinearization

    class Subclassed(type(other)):  # a user's subclass may change forward: it takes the generic products
        pass

    subclassed = Subclassed(other.input_size, other.hidden_size).to(DTYPE)
    assert type(linearize(subclassed, xo, ho, ParameterLayout(subclassed))) is StepLinearization


@pytest.mark.parametrize("seed", [0, 1])
def test_tanh_closed_form_equals_generic(seed):
    cell, layout, g, generic, fast = _both(seed)
    hidden, p = cell.hidden_size, layout.size
    tight = dict(rtol=0, atol=1e-12)
    torch.testing.assert_close(fast.h_new, generic.h_new, **tight)
    torch.testing.assert_close(fast.preactivation, generic.preactivation, **tight)
    v = torch.randn(B, hidden, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.state_jvp(v), generic.state_jvp(v), **tight)
    cols = torch.randn(B, hidden, 5, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.state_jvp_columns(cols), generic.state_jvp_columns(cols), **tight)
    c = torch.randn(B, hidden, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.parameter_vjp(c), generic.parameter_vjp(c), **tight)
    n = torch.randn(B, p, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.parameter_jvp(n), generic.parameter_jvp(n), **tight)
    torch.testing.assert_close(fast.parameter_jacobian(), generic.parameter_jacobian(), **tight)
    torch.testing.assert_close(fast.activation_jvp(v), generic.activation_jvp(v), **tight)
    torch.testing.assert_close(fast.activation_jacobian(), generic.activation_jacobian(), **tight)
    torch.testing.assert_close(fast.preactivation_vjp(c), generic.preactivation_vjp(c), **tight)
    torch.testing.assert_close(fast.post_activation_vjp(c), generic.post_activation_vjp(c), **tight)
    assert fast.has_post_activation_parameters() == generic.has_post_activation_parameters() is False


def test_influence_cell_closed_form_equals_generic():
    cell, x, h, layout, g = _setup("influence", 2)
    generic, fast = StepLinearization(cell, x, h, layout), linearize(cell, x, h, layout)
    assert type(fast).__name__ == "LinearStepLinearization"
    tight = dict(rtol=0, atol=1e-12)
    hidden = cell.hidden_size
    torch.testing.assert_close(fast.h_new, generic.h_new, **tight)
    v = torch.randn(B, hidden, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.state_jvp(v), generic.state_jvp(v), **tight)
    cols = torch.randn(B, hidden, 4, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.state_jvp_columns(cols), generic.state_jvp_columns(cols), **tight)
    torch.testing.assert_close(fast.parameter_vjp(v), generic.parameter_vjp(v), **tight)
    n = torch.randn(B, 1, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.parameter_jvp(n), generic.parameter_jvp(n), **tight)
    torch.testing.assert_close(fast.parameter_jacobian(), generic.parameter_jacobian(), **tight)
    torch.testing.assert_close(fast.parameter_jacobian(), ref.parameter_jacobian(cell, x, h), **TOL)
    with pytest.raises(ValueError, match="no preactivation"):
        fast.activation_jvp(v)


def test_tanh_closed_form_equals_dense_autograd():
    """Also against the independent reference directly (the generic path could share a mistake)."""
    cell, x, h, layout, g = _setup("tanh", 4)
    fast = TanhStepLinearization(cell, x, h)  # builds its own layout
    assert fast.layout.names == layout.names
    j_theta = ref.parameter_jacobian(cell, x, h)
    torch.testing.assert_close(fast.parameter_jacobian(), j_theta, **TOL)
    c = torch.randn(B, cell.hidden_size, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.parameter_vjp(c), torch.einsum("bh,bhp->bp", c, j_theta), **TOL)
    torch.testing.assert_close(
        fast.state_jvp_columns(torch.eye(3, dtype=DTYPE).expand(B, 3, 3)), ref.state_jacobian(cell, x, h), **TOL
    )


# -- ParameterLayout ------------------------------------------------------------------------------------------
class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0, dtype=DTYPE))
        self.inner = nn.Linear(3, 2).to(DTYPE)
        self.vector = nn.Parameter(torch.randn(4, dtype=DTYPE))


def test_parameter_layout_names_shapes_size():
    layout = ParameterLayout(_Mixed())
    assert layout.names == ("scale", "vector", "inner.weight", "inner.bias")  # named_parameters() order
    shapes = dict(zip(layout.names, layout.shapes, strict=True))
    assert shapes == {"scale": (), "inner.weight": (2, 3), "inner.bias": (2,), "vector": (4,)}
    assert layout.size == 1 + 6 + 2 + 4


@pytest.mark.parametrize("lead", [(), (5,), (2, 3)])
def test_parameter_layout_round_trip_with_scalar(lead):
    module = _Mixed()
    layout = ParameterLayout(module)
    tensors = {n: torch.randn(tuple(lead) + tuple(p.shape), dtype=DTYPE) for n, p in module.named_parameters()}
    flat = layout.flatten(tensors, lead=len(lead))
    assert flat.shape == (*lead, layout.size)
    manual = torch.cat([tensors[n].reshape(*lead, -1) for n in layout.names], dim=-1)
    torch.testing.assert_close(flat, manual, rtol=0, atol=0)
    back = layout.unflatten(flat)
    assert list(back) == list(layout.names)
    for n in layout.names:
        torch.testing.assert_close(back[n], tensors[n], rtol=0, atol=0)
    # and the other way round
    v = torch.randn(tuple(lead) + (layout.size,), dtype=DTYPE)
    torch.testing.assert_close(layout.flatten(layout.unflatten(v), lead=len(lead)), v, rtol=0, atol=0)


def test_parameter_layout_of_influence_cell_scalar():
    layout = ParameterLayout(InfluenceBalancingCell())
    assert (layout.names, layout.shapes, layout.size) == (("theta",), ((),), 1)
    torch.testing.assert_close(layout.unflatten(torch.tensor([[1.5], [2.5]]))["theta"], torch.tensor([1.5, 2.5]))


def test_parameter_layout_of_a_cell_without_parameters_raises():
    class Free(nn.Module):
        def forward(self, x, h):
            return torch.tanh(h)

    with pytest.raises(ValueError, match="Free has no parameters"):
        ParameterLayout(Free())
    with pytest.raises(ValueError, match="ReLU has no parameters"):
        ParameterLayout(nn.ReLU())


@pytest.mark.parametrize("name", [c for c in CELLS if factorisation_problem(ref.make_cell(c), ("complete",)) is None])
def test_flatten_weight_lays_out_dl_dw_as_autograd_does(name):
    """``z = W a``: ``dL/dW = g a^T`` for ``g = dL/dz``, laid out by ``flatten_weight`` = autograd's gradient of
    ``g . z`` with respect to the parameters, per stream and summed (a vector parameter is one column of ``W``)."""
    cell, x, h, layout, gen = _setup(name)
    g = torch.randn(B, weight_rows(cell), generator=gen, dtype=DTYPE)
    a = cell.preactivation_input(x, h)
    columns = weight_columns(cell)
    assert any(is_vector for _, _, is_vector in columns)  # the one-column case is exercised
    per_stream = flatten_weight(layout, columns, g[:, :, None] * a[:, None, :], lead=1)
    summed = flatten_weight(layout, columns, g.T @ a, lead=0)
    for b in range(B):
        grads = torch.autograd.grad(
            (cell.preactivation(x[b : b + 1], h[b : b + 1])[0] * g[b]).sum(), ref.parameters(cell)
        )
        want = torch.cat([grad.reshape(-1) for grad in grads])
        torch.testing.assert_close(per_stream[b], want, **TOL)
    torch.testing.assert_close(summed, per_stream.sum(0), **TOL)
