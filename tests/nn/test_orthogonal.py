import pytest
import torch

from lightning_ortho.nn import (
    ORTHOGONAL_METHODS,
    AuxiliaryReflection,
    HouseholderProduct,
    ParametrizedOrthogonal,
    SVDLinear,
    orthogonal_map,
)
from tests.helpers import random_orthogonal


@pytest.mark.parametrize("method", ORTHOGONAL_METHODS)
def test_every_map_preserves_norms_and_trains(method):
    layer = orthogonal_map(9, method).double()
    x = torch.randn(20, 9, dtype=torch.float64)
    y = layer(x)
    assert y.shape == x.shape
    torch.testing.assert_close(torch.linalg.vector_norm(y, dim=-1), torch.linalg.vector_norm(x, dim=-1))
    y.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_map_classes():
    assert isinstance(orthogonal_map(4, "aux"), AuxiliaryReflection)
    assert isinstance(orthogonal_map(4, "householder"), HouseholderProduct)
    assert orthogonal_map(4, "householder", k=2, strategy="sequential").k == 2
    assert orthogonal_map(4, "cayley").orthogonal_map == "cayley"
    assert orthogonal_map(4, "torch_householder").orthogonal_map == "householder"
    with pytest.raises(ValueError, match="choose one of"):
        orthogonal_map(4, "givens")


@pytest.mark.parametrize("kind", ["cayley", "matrix_exp", "householder"])
def test_parametrized_orthogonal_is_torch_and_settable(kind):
    layer = ParametrizedOrthogonal(6, kind).double()
    q = layer.matrix()
    torch.testing.assert_close(q.T @ q, torch.eye(6, dtype=torch.float64))
    u = random_orthogonal(6)
    if kind == "cayley":  # the Cayley map cannot reach eigenvalue -1; keep det U = +1 and away from it
        u = torch.linalg.matrix_exp(0.3 * _skew(6))
    layer.reset_orthogonal_(u)
    torch.testing.assert_close(layer.matrix(), u, rtol=1e-8, atol=1e-8)
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(layer(x), x @ u.T, rtol=1e-8, atol=1e-8)


def _skew(d):
    a = torch.randn(d, d, dtype=torch.float64)
    return a - a.T


def test_methods_are_read_from_the_literal_and_every_map_declares_its_capabilities():
    from typing import get_args

    from lightning_ortho.nn import OrthogonalMap, OrthogonalMethod

    assert ORTHOGONAL_METHODS == get_args(OrthogonalMethod)
    for method in ORTHOGONAL_METHODS:
        layer = orthogonal_map(4, method)
        assert isinstance(layer, OrthogonalMap) and layer.represents_every_orthogonal, method
    # What cannot represent an arbitrary orthogonal U says so, and refuses to be reset.
    limited = [
        orthogonal_map(4, "householder", k=2),
        AuxiliaryReflection(4, invertible=True),
        AuxiliaryReflection(4, network=torch.nn.Linear(4, 4)),
    ]
    for layer in limited:
        assert not layer.represents_every_orthogonal
        with pytest.raises(ValueError):
            layer.reset_orthogonal_(torch.eye(4))


def test_theorem2_layer_loads_a_checkpoint_of_the_previous_layout():
    # Version 0.1 stored V as `factor` and a power-iteration vector (no longer used) as `power_vector`.
    layer = AuxiliaryReflection(5, invertible=True).double()
    old = {
        "factor": torch.randn(5, 5, dtype=torch.float64),
        "power_vector": torch.ones(5, dtype=torch.float64) / 5**0.5,
    }
    fresh = AuxiliaryReflection(5, invertible=True).double()
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh.factor.detach(), old["factor"])
    assert set(layer.state_dict()) == {"constraint.factor"}


@pytest.mark.parametrize("make", [lambda: AuxiliaryReflection(5), lambda: AuxiliaryReflection(5, invertible=True)])
def test_auxiliary_layers_pickle_as_ddp_spawn_needs(make):
    import pickle

    layer = make().double()
    copy = pickle.loads(pickle.dumps(layer))
    x = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(copy(x), layer(x))


@pytest.mark.parametrize("method", ["cayley", "matrix_exp", "torch_householder"])
def test_torch_parametrized_maps_pickle_as_ddp_spawn_needs(method):
    # PyTorch refuses to pickle parametrized modules; ours rebuild from their state_dict.
    import pickle

    layer = SVDLinear(6, 6, orthogonal=method).double()
    with torch.no_grad():
        layer.left.linear.parametrizations.weight.original.add_(0.1)  # move away from the initial state
    state = torch.random.get_rng_state()
    copy = pickle.loads(pickle.dumps(layer))
    assert torch.equal(torch.random.get_rng_state(), state)  # unpickling draws no random numbers
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(copy(x), layer(x))
    copy(x).sum().backward()
    assert copy.left.linear.parametrizations.weight.original.grad is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "make,rounded_once",
    [
        (lambda: AuxiliaryReflection(6), True),
        (lambda: AuxiliaryReflection(6, invertible=True), True),
        (lambda: HouseholderProduct(6), True),
        # Composites round between their parts (the maps of SVDLinear; the custom network runs in its own dtype).
        (lambda: SVDLinear(6, 4), False),
        (lambda: AuxiliaryReflection(6, network=torch.nn.Linear(6, 6)), False),
    ],
    ids=["aux", "aux_invertible", "householder", "svd_aux", "aux_network"],
)
def test_half_precision_parameters_compute_in_float32_and_return_their_dtype(make, rounded_once, dtype):
    # Issue 9.9: .half() / .bfloat16() layers failed with "expected m1 and m2 to have the same dtype" (or eigh).
    torch.manual_seed(0)
    reference = make()
    layer = make().to(dtype)
    layer.load_state_dict({k: v.to(dtype) for k, v in reference.state_dict().items()})
    reference.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})  # the same rounded values
    x = torch.randn(5, 6)
    y = layer(x.to(dtype))
    assert y.dtype == dtype
    expected = reference(x.to(dtype).float()).to(dtype).float()  # the same math in float32, rounded at the end
    tolerance = {} if rounded_once else {"rtol": 0.0, "atol": 4 * torch.finfo(dtype).eps}
    torch.testing.assert_close(y.float(), expected, **tolerance)
    y.float().sum().backward()
    assert all(
        p.grad is not None and p.grad.dtype == dtype and torch.isfinite(p.grad).all() for p in layer.parameters()
    )


@pytest.mark.parametrize("method", ["cayley", "matrix_exp", "torch_householder"])
def test_torch_parametrized_maps_refuse_half_precision_with_a_message(method):
    layer = orthogonal_map(4, method)
    with pytest.raises(TypeError, match="bf16-mixed"):
        layer.to(torch.bfloat16)
    assert layer.matrix().dtype == torch.float32  # nothing was converted


@pytest.mark.parametrize("method", ORTHOGONAL_METHODS)
def test_every_map_refuses_zero_size_and_nan_input(method):
    # Issue 9, smaller items: orthogonal_map(0, "cayley") divided by zero; PyTorch's maps returned NaN for NaN input.
    with pytest.raises(ValueError, match="positive integer"):
        orthogonal_map(0, method)
    with pytest.raises(ValueError, match="x contains NaN"):
        orthogonal_map(4, method)(torch.tensor([[float("nan"), 1.0, 2.0, 3.0]]))
