import pytest
import torch

from lightning_ortho.nn import (
    ORTHOGONAL_METHODS,
    AuxiliaryReflection,
    HouseholderProduct,
    ParametrizedOrthogonal,
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
