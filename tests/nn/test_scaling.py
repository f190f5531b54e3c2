"""Homogeneity survives the floating-point range (issue 9.7): ``H(v) x`` is of degree 0 in ``v`` and 1 in ``x``,
``f(x) = H(W x) x`` of degree 1, its Jacobian and log-determinant of degree 0. Tiny inputs used to be taken as
``n(x) = 0`` (``f(1e-20 x)`` returned ``x`` instead of ``U x``) and 1e19 inputs overflowed."""

import pytest
import torch

import lightning_ortho.nn.reflection as reflection_module
from lightning_ortho.nn import AuxiliaryReflection, reflect
from tests.helpers import random_orthogonal

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
