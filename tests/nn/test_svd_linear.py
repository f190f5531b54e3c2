import pytest
import torch

from lightning_ortho.nn import ORTHOGONAL_METHODS, SVDLinear


@pytest.mark.parametrize("method", ["householder", "cayley", "matrix_exp", "torch_householder"])
@pytest.mark.parametrize("shape", [(6, 6), (6, 4), (4, 6)])
def test_matches_dense_u_sigma_vt(method, shape):
    in_features, out_features = shape
    layer = SVDLinear(in_features, out_features, orthogonal=method).double()
    with torch.no_grad():
        layer.bias.normal_()
    u, vt = layer.left.matrix().detach(), layer.right.matrix().detach()
    sigma = torch.zeros(out_features, in_features, dtype=torch.float64)
    r = min(shape)
    sigma[range(r), range(r)] = layer.singular_values.detach()
    x = torch.randn(5, in_features, dtype=torch.float64)
    expected = x @ (u @ sigma @ vt).T + layer.bias.detach()
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(
        torch.linalg.svdvals(u @ sigma @ vt), layer.singular_values.detach().sort(descending=True).values
    )


def test_aux_layers_and_initial_singular_values():
    layer = SVDLinear(8, 5, orthogonal="aux")
    assert ((layer.singular_values >= 0.99) & (layer.singular_values <= 1.01)).all()
    x = torch.randn(3, 2, 8)
    y = layer(x)
    assert y.shape == (3, 2, 5)
    # aux maps preserve norms: without bias, ||y|| = ||Sigma V(x)|| <= 1.01 ||x||
    no_bias = SVDLinear(8, 8, orthogonal="aux", bias=False)
    z = torch.randn(10, 8)
    ratio = torch.linalg.vector_norm(no_bias(z), dim=-1) / torch.linalg.vector_norm(z, dim=-1)
    assert ((ratio > 0.99 - 1e-6) & (ratio < 1.01 + 1e-6)).all()


@pytest.mark.parametrize("method", ORTHOGONAL_METHODS)
def test_every_map_builds_and_backpropagates(method):
    layer = SVDLinear(5, 5, orthogonal=method)
    layer(torch.randn(4, 5)).sum().backward()
    assert layer.singular_values.grad is not None


def test_wrong_input_size():
    with pytest.raises(ValueError, match=r"\(\.\.\., 5\)"):
        SVDLinear(5, 3)(torch.randn(2, 4))
