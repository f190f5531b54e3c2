"""The eigenbasis forms of the auxiliary reflection (forward, Lemma 1 log-determinant, gradients, scalar Newton)
against dense float64 references: the paper's definition of f, autograd Jacobians and slogdet."""

import pytest
import torch

from lightning_ortho.nn import AuxiliaryReflection, NewtonInverseError
from lightning_ortho.nn.general_eigenbasis import GeneralEigenbasis
from lightning_ortho.nn.symmetric_eigenbasis import SymmetricEigenbasis, symmetric_newton_inverse
from tests.helpers import auxiliary_reference, random_orthogonal

DTYPE = torch.float64


def reference(columns: torch.Tensor, weight: torch.Tensor, rotation: torch.Tensor | None = None):
    """(f(R x), log|det J_f(R x)|) per column, from the definition, jacrev and slogdet."""
    rows = columns.mT.reshape(-1, columns.shape[-2])
    if rotation is not None:
        rows = rows @ rotation.mT
    y = torch.stack([auxiliary_reference(row, weight) for row in rows])
    jacobians = torch.func.vmap(torch.func.jacrev(lambda row: auxiliary_reference(row, weight)))(rows)
    log_det = torch.linalg.slogdet(jacobians)[1]
    return y.reshape(*columns.shape[:-2], columns.shape[-1], -1).mT, log_det.reshape(*columns.shape[:-2], -1)


def theorem2_layer(d: int, factor: torch.Tensor | None = None) -> AuxiliaryReflection:
    layer = AuxiliaryReflection(d, invertible=True).to(DTYPE)
    if factor is not None:
        with torch.no_grad():
            layer.factor.copy_(factor)
    return layer


def general_layer(d: int, weight: torch.Tensor) -> AuxiliaryReflection:
    layer = AuxiliaryReflection(d).to(DTYPE)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


# ---------------------------------------------------------------- symmetric W (Theorem 2)


@pytest.mark.parametrize("d", [2, 3, 8, 17, 70])  # 70 > 32: the determinant product is split in chunks
@pytest.mark.parametrize("rotate", [False, True], ids=["plain", "rotation"])
def test_symmetric_forward_and_log_det_match_dense_reference(d, rotate):
    torch.manual_seed(d)
    layer = theorem2_layer(d, torch.randn(d, d, dtype=DTYPE))
    rotation = random_orthogonal(d) if rotate else None
    x = torch.randn(2, d, 5, dtype=DTYPE)
    y, log_det = layer.forward_and_log_abs_det_columns(x, rotation=rotation)
    y_ref, log_det_ref = reference(x, layer.auxiliary_weight().detach(), rotation)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_det, log_det_ref, rtol=1e-9, atol=1e-9)


def test_symmetric_gradients_match_gradcheck_with_rotation():
    torch.manual_seed(0)
    d = 5
    layer = theorem2_layer(d, torch.randn(d, d, dtype=DTYPE))
    rotation = random_orthogonal(d)
    x = torch.randn(2, d, 3, dtype=DTYPE, requires_grad=True)

    def function(x, factor):
        return layer.forward_and_log_abs_det_columns(x, rotation=rotation)

    assert torch.autograd.gradcheck(function, (x, layer.factor))


def test_symmetric_gradients_at_repeated_eigenvalues_equal_the_dense_route():
    # V = I: W = I + I/(2(1+margin)) has one eigenvalue d times; eigenvector derivatives would divide by zero.
    d = 6
    torch.manual_seed(1)
    x = torch.randn(3, d, 4, dtype=DTYPE)
    rotation = random_orthogonal(d)
    layer = theorem2_layer(d, torch.eye(d, dtype=DTYPE))
    y, log_det = layer.forward_and_log_abs_det_columns(x, rotation=rotation)
    (y.square().sum() * 0.3 + log_det.sum()).backward()
    eigen_grad = layer.factor.grad.clone()

    reference_layer = theorem2_layer(d, torch.eye(d, dtype=DTYPE))
    y_ref, log_det_ref = reference(x, reference_layer.auxiliary_weight(), rotation)
    (y_ref.square().sum() * 0.3 + log_det_ref.sum()).backward()
    assert torch.isfinite(eigen_grad).all()
    torch.testing.assert_close(eigen_grad, reference_layer.factor.grad, rtol=1e-8, atol=1e-10)


def test_zero_column_is_identity_with_zero_log_det_and_finite_gradients():
    d = 4
    layer = theorem2_layer(d, torch.randn(d, d, dtype=DTYPE))
    x = torch.randn(1, d, 3, dtype=DTYPE)
    x[..., 1] = 0.0
    x.requires_grad_()
    y, log_det = layer.forward_and_log_abs_det_columns(x)
    assert torch.equal(y[..., 1], torch.zeros(1, d, dtype=DTYPE)) and float(log_det[0, 1].detach()) == 0.0
    (y.sum() + log_det.sum()).backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.factor.grad).all()
    torch.testing.assert_close(x.grad[..., 1], torch.ones(1, d, dtype=DTYPE))  # f is the identity there


def test_one_eigh_gives_the_eigenbasis_of_the_theorem2_weight():
    layer = theorem2_layer(7, torch.randn(7, 7, dtype=DTYPE))
    weight, basis = layer.weight_and_eigenbasis()
    assert isinstance(basis, SymmetricEigenbasis)
    torch.testing.assert_close(weight, layer.auxiliary_weight())
    reconstructed = basis.vectors @ torch.diag(basis.eigenvalues) @ basis.vectors.mT
    torch.testing.assert_close(reconstructed, weight.detach(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- general W


def weight_with_spectrum(kind: str, d: int) -> torch.Tensor:
    if kind == "real":  # non-normal with distinct real eigenvalues
        return torch.triu(torch.randn(d, d, dtype=DTYPE), 1) + torch.diag(torch.linspace(0.5, 2.0, d, dtype=DTYPE))
    if kind == "orthogonal":  # W = I - U (Theorem 1): eigenvalues 1 - e^{i theta}, mostly complex pairs
        return torch.eye(d, dtype=DTYPE) - random_orthogonal(d)
    return torch.randn(d, d, dtype=DTYPE) + torch.eye(d, dtype=DTYPE)  # mixed


@pytest.mark.parametrize("d", [2, 3, 5, 8, 16])
@pytest.mark.parametrize("kind", ["real", "orthogonal", "mixed"])
def test_general_forward_and_log_det_match_dense_reference(kind, d):
    torch.manual_seed(10 * d)
    layer = general_layer(d, weight_with_spectrum(kind, d))
    basis = GeneralEigenbasis.of(layer.weight)
    assert basis.reliable
    assert float(basis.weights.sum()) == d  # each conjugate pair kept once with weight 2
    x = torch.randn(2, d, 5, dtype=DTYPE)
    y, log_det = layer.forward_and_log_abs_det_columns(x)
    y_ref, log_det_ref = reference(x, layer.weight.detach())
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_det, log_det_ref, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("kind", ["real", "orthogonal", "mixed"])
def test_general_gradcheck(kind):
    torch.manual_seed(3)
    d = 5
    layer = general_layer(d, weight_with_spectrum(kind, d))
    x = torch.randn(2, d, 3, dtype=DTYPE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: layer.forward_and_log_abs_det_columns(x), (x, layer.weight))


def test_general_rotation_is_applied_first():
    torch.manual_seed(4)
    d = 6
    layer = general_layer(d, weight_with_spectrum("mixed", d))
    rotation = random_orthogonal(d)
    x = torch.randn(d, 4, dtype=DTYPE)
    y, log_det = layer.forward_and_log_abs_det_columns(x, rotation=rotation)
    y_ref, log_det_ref = reference(x, layer.weight.detach(), rotation)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(log_det, log_det_ref)


def test_defective_weight_is_flagged_and_falls_back_to_dense_determinants():
    d = 4
    jordan = torch.eye(d, dtype=DTYPE) * 1.5 + torch.diag(torch.ones(d - 1, dtype=DTYPE), 1)
    basis = GeneralEigenbasis.of(jordan)
    assert not basis.reliable
    layer = general_layer(d, jordan)
    x = torch.randn(3, d, 2, dtype=DTYPE)
    y, log_det = layer.forward_and_log_abs_det_columns(x)
    y_ref, log_det_ref = reference(x, jordan)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(log_det, log_det_ref)
    rows = torch.randn(5, d, dtype=DTYPE)
    torch.testing.assert_close(layer.log_abs_det_jacobian(rows), reference(rows.mT, jordan)[1])
    # Nilpotent: LAPACK's eigenvector matrix is singular up to 1e-292; flagged, not raised.
    assert not GeneralEigenbasis.of(torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=DTYPE)).reliable


# ---------------------------------------------------------------- scalar Newton inverse


@pytest.mark.parametrize("d", [2, 3, 8, 33, 64])
def test_scalar_newton_inverts_theorem2_layers_in_float64(d):
    torch.manual_seed(d)
    layer = theorem2_layer(d, torch.randn(d, d, dtype=DTYPE))
    rotation = random_orthogonal(d)
    x = torch.randn(3, d, 10, dtype=DTYPE)
    y, _ = layer.forward_and_log_abs_det_columns(x, rotation=rotation)
    result = layer.newton_inverse_columns(y, rotation=rotation)
    assert result.all_converged
    torch.testing.assert_close(result.x, x, rtol=1e-10, atol=1e-10)
    # The reported residual is the residual of the returned x, recomputed here independently.
    y_back, _ = layer.forward_and_log_abs_det_columns(result.x, rotation=rotation)
    residual = torch.linalg.vector_norm(y_back - y, dim=-2) / torch.linalg.vector_norm(y, dim=-2)
    torch.testing.assert_close(result.residual, residual, rtol=0, atol=1e-13)
    assert float(result.iterations.float().mean()) <= 10  # Newton, not bisection: a handful of steps


def test_scalar_newton_float32_and_zero_columns():
    d = 12
    layer = AuxiliaryReflection(d, invertible=True)
    with torch.no_grad():
        layer.factor.copy_(torch.randn(d, d))
    x = torch.randn(4, d, 6)
    x[..., 2] = 0.0
    y, _ = layer.forward_and_log_abs_det_columns(x)
    result = layer.newton_inverse_columns(y)
    assert result.all_converged and int(result.iterations[..., 2].max()) == 0
    torch.testing.assert_close(result.x, x, rtol=1e-5, atol=1e-5)


def test_scalar_newton_budget_and_refusals():
    d = 6
    layer = theorem2_layer(d, torch.randn(d, d, dtype=DTYPE))
    y = layer.forward_and_log_abs_det_columns(torch.randn(d, 5, dtype=DTYPE))[0]
    result = layer.newton_inverse_columns(y, max_iter=0)
    assert not result.converged.any() and int(result.iterations.max()) == 0
    with pytest.raises(NewtonInverseError, match="did not converge"):
        result.raise_if_failed("test")
    indefinite = SymmetricEigenbasis(torch.tensor([-1.0, 2.0], dtype=DTYPE), torch.eye(2, dtype=DTYPE))
    with pytest.raises(ValueError, match="positive definite"):
        symmetric_newton_inverse(torch.randn(2, 3, dtype=DTYPE), indefinite, tol=1e-10)


def test_columns_api_rejects_bad_input():
    layer = theorem2_layer(4)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, L\)"):
        layer.forward_and_log_abs_det_columns(torch.randn(2, 3, 5, dtype=DTYPE))
    with pytest.raises(TypeError, match="floating-point"):
        layer.forward_and_log_abs_det_columns(torch.ones(2, 4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        layer.forward_and_log_abs_det_columns(torch.full((1, 4, 2), float("nan"), dtype=DTYPE))
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, L\)"):
        layer.newton_inverse_columns(torch.randn(3, 5, dtype=DTYPE))
    network_layer = AuxiliaryReflection(4, network=torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="W x"):
        network_layer.forward_and_log_abs_det_columns(torch.randn(4, 2))


@pytest.mark.parametrize("kind", ["real", "complex"])
def test_general_eigenbasis_solves_shifted_systems_like_a_dense_solve(kind):
    d = 7
    weight = torch.randn(d, d, dtype=DTYPE)
    if kind == "real":
        weight = weight + weight.T  # real spectrum
    basis = GeneralEigenbasis.of(weight)
    assert basis.reliable
    s = torch.randn(5, dtype=DTYPE)
    b = torch.randn(5, d, dtype=DTYPE)
    a = torch.eye(d, dtype=DTYPE) - 2.0 * s[:, None, None] * weight
    torch.testing.assert_close(basis.solve_shifted(s, b), torch.linalg.solve(a, b), rtol=1e-9, atol=1e-9)
