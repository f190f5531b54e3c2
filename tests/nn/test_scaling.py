"""Homogeneity survives the floating-point range: ``H(v) x`` is of degree 0 in ``v`` and 1 in ``x``,
``f(x) = H(W x) x`` of degree 1, its Jacobian and log-determinant of degree 0. Tiny inputs used to be taken as
``n(x) = 0`` (``f(1e-20 x)`` returned ``x`` instead of ``U x``) and 1e19 inputs overflowed."""

import copy

import pytest
import torch

import lightning_ortho.nn.reflection as reflection_module
from lightning_ortho.nn import AuxiliaryReflection, reflect
from tests.helpers import dense_householder, random_orthogonal

SCALES = {torch.float32: [1e-20, 1e-30, 1e19, 1e30], torch.float64: [1e-160, 1e-200, 1e160, 1e200]}
CASES = [(dtype, scale) for dtype, scales in SCALES.items() for scale in scales]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype,scale", CASES)
def test_reflection_is_homogeneous_across_the_range(dtype, scale, fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.randn(6, 5, dtype=dtype)
    v = torch.randn(6, 5, dtype=dtype)
    reference = reflect(x, v)
    torch.testing.assert_close(reflect(x, scale * v), reference)  # degree 0 in v
    torch.testing.assert_close(reflect(scale * x, v) / scale, reference)  # degree 1 in x
    u = random_orthogonal(5, dtype=dtype)
    layer = AuxiliaryReflection.from_orthogonal(u)  # f(x) = U x for every x != 0 (Theorem 1)
    torch.testing.assert_close(layer(scale * x) / scale, x @ u.T)


@pytest.mark.parametrize("invertible", [False, True], ids=["plain", "theorem2"])
@pytest.mark.parametrize("dtype,scale", CASES)
def test_jacobian_and_log_determinants_do_not_depend_on_the_scale(dtype, scale, invertible):
    torch.manual_seed(0)
    layer = AuxiliaryReflection(5, invertible=invertible).to(dtype)
    x = torch.randn(4, 5, dtype=dtype)
    torch.testing.assert_close(layer.jacobian(scale * x), layer.jacobian(x))
    for method in ("eig", "dense"):
        torch.testing.assert_close(
            layer.log_abs_det_jacobian(scale * x, method=method), layer.log_abs_det_jacobian(x, method=method)
        )
    y, log_det = layer.forward_and_log_abs_det_columns(scale * x.mT)
    y_ref, log_det_ref = layer.forward_and_log_abs_det_columns(x.mT)
    torch.testing.assert_close(y / scale, y_ref)
    torch.testing.assert_close(log_det, log_det_ref)


@pytest.mark.parametrize("scale", [1e-20, 1e19])
def test_gradients_of_rescaled_rows_are_exact(scale):
    torch.manual_seed(0)
    layer = AuxiliaryReflection(5)
    w = torch.randn(7, 5)
    x = torch.randn(7, 5, requires_grad=True)
    (layer(scale * x) * w).sum().backward()
    grad_x, grad_weight = x.grad.clone(), layer.weight.grad.clone()
    x.grad, layer.weight.grad = None, None
    (layer(x) * w).sum().backward()
    torch.testing.assert_close(grad_x, scale * x.grad, rtol=1e-4, atol=0.0)  # d f(c x)/dx = c J(x)
    torch.testing.assert_close(grad_weight / scale, layer.weight.grad, rtol=1e-4, atol=1e-6)  # f(cx) = c f(x)


def test_zero_rows_keep_the_h0_convention_exactly():
    layer = AuxiliaryReflection(4)
    x = torch.zeros(3, 4)
    assert torch.equal(layer(x), x)
    v = torch.zeros(3, 4)
    y = torch.randn(3, 4)
    assert torch.equal(reflect(y, v), y)


# Rows whose v.v lies between the dtype's smallest normal number and the floor of its accurate range
# (float32 norms ~1e-19..1e-16, float64 ~1e-153..1e-150): v.v and 2 / v.v are finite, but d(2 / v.v)/d(v.v)
# = -2 / (v.v)^2 is not. Such a row used to be computed as it was, then overwritten by its rescaled value; the
# overwritten computation still ran backward, and inf * 0 made the whole gradient NaN.
IN_BETWEEN = {torch.float32: [1e-18, 1e-17, 1e-16], torch.float64: [1e-153, 1e-151, 1e-150]}
HUGE = {torch.float32: 1e19, torch.float64: 1e160}
BELOW_TINY = {torch.float32: 1e-30, torch.float64: 1e-200}


def unit_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / s, s)`` in float64 with ``s`` the largest ``|x_i|`` of each row (1 for a zero row): an independent
    rescaling (not a power of two) for the references."""
    x = x.detach().double()
    s = x.abs().amax(-1, keepdim=True)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return x / s, s


def dense_auxiliary_rows(weight: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """``H(W x) x`` of each row from the dense matrix, ``H(0) = I`` for a zero row."""
    rows = []
    for row in x_hat:
        n = weight @ row
        rows.append(row if bool((n == 0).all()) else dense_householder(n) @ row)
    return torch.stack(rows)


def assert_gradient_close(got: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    """``got`` finite and within a few hundred ``eps`` of ``reference`` relative to its norm (float32: 1e-4)."""
    assert torch.isfinite(got).all(), got
    tolerance = 1e-4 if dtype == torch.float32 else 1e-10
    error = torch.linalg.vector_norm(got.double() - reference)  # over every entry
    assert error <= tolerance * torch.linalg.vector_norm(reference), (error, got, reference)


def auxiliary_gradient_reference(layer: AuxiliaryReflection, x: torch.Tensor, w: torch.Tensor):
    """``(dL/dx, dL/dparameter)`` in float64 for ``L = sum w . f(x)``, from ``f(x) = s f(x / s)``, the dense
    Householder matrix and autograd."""
    reference = copy.deepcopy(layer).double()
    x_hat, s = unit_rows(x)
    x_hat.requires_grad_(True)
    y = s * dense_auxiliary_rows(reference.auxiliary_weight(), x_hat)
    (y * w.double()).sum().backward()
    parameter = reference.factor if layer.invertible else reference.weight
    return x_hat.grad / s, parameter.grad


def mixed_rows(dtype: torch.dtype, scales: list[float]) -> torch.Tensor:
    """Rows ``scale * N(0, I)`` for each scale (0 gives a zero row)."""
    return torch.stack([scale * torch.randn(5, dtype=dtype) for scale in scales])


@pytest.mark.parametrize("fused_forward", [True, False], ids=["fused", "careful"])
@pytest.mark.parametrize("invertible", [False, True], ids=["plain", "theorem2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_rows_between_tiny_and_the_accurate_range_have_exact_finite_gradients(dtype, invertible, fused_forward):
    torch.manual_seed(0)
    layer = AuxiliaryReflection(5, invertible=invertible).to(dtype)
    layer.fused_forward = fused_forward
    parameter = layer.factor if invertible else layer.weight
    for scales in (
        IN_BETWEEN[dtype],  # only such rows: their own gradients, not hidden behind larger ones
        [1.0, IN_BETWEEN[dtype][0], 0.0, 3.0, IN_BETWEEN[dtype][-1], HUGE[dtype], BELOW_TINY[dtype]],
    ):
        x = mixed_rows(dtype, scales).requires_grad_(True)
        w = torch.randn(len(scales), 5, dtype=dtype)
        parameter.grad = None
        y = layer(x)
        (y * w).sum().backward()
        grad_x, grad_parameter = auxiliary_gradient_reference(layer, x, w)
        assert_gradient_close(x.grad, grad_x, dtype)
        assert_gradient_close(parameter.grad, grad_parameter, dtype)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_reflect_of_rows_between_tiny_and_the_accurate_range_has_exact_finite_gradients(dtype, fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    torch.manual_seed(1)
    scales = [1.0, *IN_BETWEEN[dtype], 0.0, HUGE[dtype], BELOW_TINY[dtype]]
    for tiny_side in ("x", "v", "both"):
        x = mixed_rows(dtype, scales if tiny_side != "v" else [1.0] * len(scales)).requires_grad_(True)
        v = mixed_rows(dtype, scales if tiny_side != "x" else [2.0] * len(scales)).requires_grad_(True)
        w = torch.randn(len(scales), 5, dtype=dtype)
        (reflect(x, v) * w).sum().backward()
        # H(v) x = s_x H(v / s_v) (x / s_x): the float64 reference on unit rows, from dense matrices.
        x_hat, s_x = unit_rows(x)
        v_hat, s_v = unit_rows(v)
        x_hat.requires_grad_(True)
        v_hat.requires_grad_(True)
        rows = [
            row if bool((n == 0).all()) else dense_householder(n) @ row for row, n in zip(x_hat, v_hat, strict=True)
        ]
        (s_x * torch.stack(rows) * w.double()).sum().backward()
        assert_gradient_close(x.grad, x_hat.grad / s_x, dtype)
        assert_gradient_close(v.grad, v_hat.grad / s_v, dtype)


@pytest.mark.parametrize("invertible", [False, True], ids=["plain", "theorem2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_log_determinant_routes_give_exact_finite_gradients_for_such_rows(dtype, invertible):
    torch.manual_seed(2)
    layer = AuxiliaryReflection(5, invertible=invertible).to(dtype)
    parameter = layer.factor if invertible else layer.weight
    x = mixed_rows(dtype, [*IN_BETWEEN[dtype], 1.0, 0.5]).requires_grad_(True)
    w = torch.randn(x.shape[0], 5, dtype=dtype)
    y, log_det = layer.forward_and_log_abs_det(x)
    ((y * w).sum() + log_det.sum()).backward()
    # log|det J| is of degree 0: the float64 reference on unit rows, with the dense Jacobian of the dense map.
    reference = copy.deepcopy(layer).double()
    weight = reference.auxiliary_weight()
    x_hat, s = unit_rows(x)
    x_hat.requires_grad_(True)
    jacobians = [
        torch.autograd.functional.jacobian(lambda r: dense_householder(weight @ r) @ r, row, create_graph=True)
        for row in x_hat
    ]
    log_det_reference = torch.stack([torch.linalg.slogdet(j)[1] for j in jacobians])
    torch.testing.assert_close(log_det.double(), log_det_reference.detach(), rtol=1e-4, atol=1e-5)
    ((s * dense_auxiliary_rows(weight, x_hat) * w.double()).sum() + log_det_reference.sum()).backward()
    assert_gradient_close(x.grad, x_hat.grad / s, dtype)
    assert_gradient_close(parameter.grad, (reference.factor if invertible else reference.weight).grad, dtype)
