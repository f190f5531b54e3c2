import pytest
import torch

from lightning_ortho.nn import HouseholderProduct
from lightning_ortho.nn.householder import householder_vectors
from tests.helpers import dense_householder, random_orthogonal

DTYPE = torch.float64


def dense_product(vectors: torch.Tensor) -> torch.Tensor:
    q = torch.eye(vectors.shape[1], dtype=vectors.dtype)
    for v in vectors:
        if v.abs().max() > 0:  # a zero vector is the identity factor (H(0) := I)
            q = q @ dense_householder(v)
    return q


@pytest.mark.parametrize("strategy", ["sequential", "wy"])
@pytest.mark.parametrize("d,k", [(1, 1), (2, 2), (5, 3), (7, 7), (16, 16), (33, 12), (8, 20)])
def test_product_equals_dense_reference(strategy, d, k):
    layer = HouseholderProduct(d, k, strategy=strategy).to(DTYPE)
    expected = dense_product(layer.vectors.detach())
    torch.testing.assert_close(layer.matrix(), expected, rtol=1e-11, atol=1e-11)
    for batch in (1, 3, 200):  # small batches apply the WY factors, large ones materialise Q
        x = torch.randn(batch, d, dtype=DTYPE)
        torch.testing.assert_close(layer(x), x @ expected.T, rtol=1e-11, atol=1e-11)


def test_strategies_agree_on_gradients():
    seq = HouseholderProduct(12, strategy="sequential").to(DTYPE)
    wy = HouseholderProduct(12, strategy="wy").to(DTYPE)
    wy.load_state_dict(seq.state_dict())
    for batch in (2, 64):
        x = torch.randn(batch, 12, dtype=DTYPE, requires_grad=True)
        grads = []
        for layer in (seq, wy):
            layer.zero_grad()
            x.grad = None
            (layer(x) ** 3).sum().backward()
            grads.append((x.grad.clone(), layer.vectors.grad.clone()))
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-10)


def test_gradcheck_wy():
    layer = HouseholderProduct(5, 4).to(DTYPE)
    x = torch.randn(3, 5, dtype=DTYPE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, v: layer(x), (x, layer.vectors))


@pytest.mark.parametrize("d", [1, 2, 3, 6, 25])
@pytest.mark.parametrize("flip", [False, True])
def test_from_orthogonal_reproduces_u(d, flip):
    u = random_orthogonal(d)
    if flip:  # det U = -1 as well as +1
        u[:, 0] = -u[:, 0]
    vectors = householder_vectors(u)
    torch.testing.assert_close(dense_product(vectors), u, rtol=1e-12, atol=1e-12)
    for strategy in ("sequential", "wy"):
        layer = HouseholderProduct.from_orthogonal(u, strategy=strategy)
        assert layer.k == d
        torch.testing.assert_close(layer.matrix(), u, rtol=1e-12, atol=1e-12)


def test_from_orthogonal_handles_identity_and_signed_permutations():
    for u in (torch.eye(4, dtype=DTYPE), -torch.eye(4, dtype=DTYPE), torch.eye(4, dtype=DTYPE)[[2, 0, 3, 1]]):
        torch.testing.assert_close(HouseholderProduct.from_orthogonal(u).matrix(), u)


def test_orthogonality_float32_full_depth():
    layer = HouseholderProduct(128)
    q = layer.matrix()
    torch.testing.assert_close(q.T @ q, torch.eye(128), rtol=0, atol=2e-5)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="strategy"):
        HouseholderProduct(4, strategy="fast")
    with pytest.raises(ValueError, match="k must be"):
        HouseholderProduct(4, 0)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        HouseholderProduct(4)(torch.randn(2, 3))
    with pytest.raises(ValueError, match="not orthogonal"):
        HouseholderProduct.from_orthogonal(torch.randn(3, 3, dtype=DTYPE))
