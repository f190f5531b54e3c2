import pytest
import torch

from lightning_ortho.nn import ORTHOGONAL_METHODS, SVDLinear
from tests.helpers import auxiliary_reference, dense_householder


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


def reference_rows(orthogonal: torch.nn.Module, method: str, x: torch.Tensor) -> torch.Tensor:
    """The map applied to every row of ``x``, from the definition and the map's own parameters (autograd flows):
    ``H(W x) x`` for aux, the dense product ``H(v_1) ... H(v_k)`` for ours, PyTorch's orthogonal weight otherwise."""
    if method == "aux":
        return torch.stack([auxiliary_reference(row, orthogonal.weight) for row in x])
    if method == "householder":
        q = torch.eye(x.shape[-1], dtype=x.dtype)
        for v in orthogonal.vectors:
            q = q @ dense_householder(v)
        return x @ q.T
    return x @ orthogonal.matrix().T  # torch.nn.utils.parametrizations.orthogonal's Q (not our code)


def reference_svd_linear(layer: SVDLinear, x: torch.Tensor) -> torch.Tensor:
    """``U Sigma V^T x + b``; for the linear maps with the dense ``(out, in)`` matrix ``U Sigma V^T``."""
    r, n, m = layer.rank, layer.out_features, layer.in_features
    s = layer.singular_values
    if layer.orthogonal == "aux":
        z = reference_rows(layer.right, "aux", x)[:, :r] * s
        z = torch.cat([z, torch.zeros(x.shape[0], n - r, dtype=x.dtype)], dim=1)
        return reference_rows(layer.left, "aux", z) + layer.bias
    u = reference_rows(layer.left, layer.orthogonal, torch.eye(n, dtype=x.dtype)).T
    vt = reference_rows(layer.right, layer.orthogonal, torch.eye(m, dtype=x.dtype)).T
    sigma = torch.eye(n, r, dtype=x.dtype) @ torch.diag(s) @ torch.eye(r, m, dtype=x.dtype)
    return x @ (u @ sigma @ vt).T + layer.bias


@pytest.mark.parametrize("method", ORTHOGONAL_METHODS)
@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (4, 6)])
def test_every_map_backpropagates_like_the_dense_reference(method, shape):
    torch.manual_seed(0)
    layer = SVDLinear(*shape, orthogonal=method).double()
    with torch.no_grad():
        layer.bias.normal_()
        layer.singular_values.uniform_(0.5, 2.0)
    names, params = zip(*layer.named_parameters(), strict=True)
    assert "singular_values" in names and "bias" in names and len(names) >= 4  # both maps have parameters
    x = torch.randn(7, shape[0], dtype=torch.float64, requires_grad=True)
    g = torch.randn(7, shape[1], dtype=torch.float64)
    y, expected = layer(x), reference_svd_linear(layer, x)
    torch.testing.assert_close(y, expected)
    grads = torch.autograd.grad((y * g).sum(), (x, *params))
    # allow_unused=False: the reference must depend on every parameter of the layer
    expected_grads = torch.autograd.grad((expected * g).sum(), (x, *params))
    for name, got, want in zip(("input", *names), grads, expected_grads, strict=True):
        assert want.abs().max() > 0, name
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"gradient of {name}: {m}")


def test_aux_layer_gradcheck():
    torch.manual_seed(0)
    layer = SVDLinear(5, 4, orthogonal="aux").double()
    names = [name for name, _ in layer.named_parameters()]

    def function(x, *params):
        return torch.func.functional_call(layer, dict(zip(names, params, strict=True)), (x,))

    inputs = (torch.randn(3, 5, dtype=torch.float64), *(p.detach() for p in layer.parameters()))
    assert torch.autograd.gradcheck(function, tuple(t.clone().requires_grad_() for t in inputs))


def test_wrong_input_size():
    with pytest.raises(ValueError, match=r"\(\.\.\., 5\)"):
        SVDLinear(5, 3)(torch.randn(2, 4))
