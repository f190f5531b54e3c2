"""The ``H(0) = I`` convention lives in one helper, and NaN never hides behind it.

A reflection through a zero vector is the identity; a reflection through a NaN vector is NaN. Every route of
every layer must agree: internally a NaN propagates to the result (so the finiteness checks see it), and every
public method raises a ValueError naming the bad parameter instead of returning a finite, wrong answer.
"""

import pytest
import torch

import lightning_ortho.nn.reflection as reflection_module
from lightning_ortho.nn import AuxiliaryReflection, HouseholderProduct, finite_checks
from lightning_ortho.nn._undefined import is_defined, reflection_scalars
from lightning_ortho.nn.auxiliary_dense import dense_jacobian, dense_log_abs_det_jacobian, linear_and_jacobian
from lightning_ortho.nn.general_eigenbasis import general_reflect_and_log_abs_det
from lightning_ortho.nn.symmetric_eigenbasis import symmetric_reflect_and_log_abs_det
from tests.helpers import dense_householder

DTYPE = torch.float64
NAN = float("nan")


def test_is_defined_at_zero_tiny_nan_and_inf():
    tiny = torch.finfo(DTYPE).tiny
    q = torch.tensor([0.0, tiny / 2, tiny, 2 * tiny, 1.0, NAN, float("inf")], dtype=DTYPE)
    assert is_defined(q).tolist() == [False, False, False, True, True, True, True]


def test_reflection_scalars_propagate_nan_and_define_zero():
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], dtype=DTYPE)
    n = torch.tensor([[0.0, 0.0], [NAN, 1.0], [1.0, 1.0]], dtype=DTYPE)
    q, s, defined = reflection_scalars(x, n)
    assert defined.tolist() == [False, True, True]
    assert q[0] == 1.0 and s[0] == 0.0  # undefined: safe to divide by, f is the identity there
    assert torch.isnan(q[1]) and torch.isnan(s[1])
    assert s[2] == 1.5 and q[2] == 2.0


@pytest.mark.parametrize("fused", [False, True])
def test_reflect_routes_propagate_a_nan_vector(fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.randn(3, 4, dtype=DTYPE)
    v = torch.randn(3, 4, dtype=DTYPE)
    v[1, 2] = NAN
    y, summary = reflection_module.reflect_with_summary(x, v)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all() and torch.isnan(summary[1])
    weight = torch.randn(4, 4, dtype=DTYPE)
    weight[0, 0] = NAN
    y, summary = reflection_module.reflect_linear_with_summary(x, weight)
    assert torch.isnan(y).all() and torch.isnan(summary).all()


def test_dense_jacobian_and_log_det_propagate_nan_but_define_zero():
    x = torch.randn(3, 4, dtype=DTYPE)
    weight = torch.randn(4, 4, dtype=DTYPE)
    weight[2, 1] = NAN
    n, jac_n = linear_and_jacobian(weight, x)
    assert torch.isnan(dense_jacobian(x, n, jac_n)).any(dim=(-2, -1)).all()  # never the identity
    assert torch.isnan(dense_log_abs_det_jacobian(x, n, jac_n)).all()
    zero = torch.zeros(4, 4, dtype=DTYPE)
    n, jac_n = linear_and_jacobian(zero, x)
    torch.testing.assert_close(dense_jacobian(x, n, jac_n), torch.eye(4, dtype=DTYPE).expand(3, 4, 4))
    torch.testing.assert_close(dense_log_abs_det_jacobian(x, n, jac_n), torch.zeros(3, dtype=DTYPE))


def test_eigenbasis_routes_propagate_a_nan_column():
    # The eigenbases themselves are built from finite weights; a NaN input column must come out NaN.
    x = torch.randn(4, 5, dtype=DTYPE)
    x[:, 3] = NAN
    layer = AuxiliaryReflection(4, invertible=True).to(DTYPE)
    weight, basis = layer.weight_and_eigenbasis()
    y, log_det = symmetric_reflect_and_log_abs_det(x, weight, basis)
    assert torch.isnan(y[:, 3]).all() and torch.isnan(log_det[3]) and torch.isfinite(log_det[[0, 1, 2, 4]]).all()
    plain = AuxiliaryReflection(4).to(DTYPE)
    weight, basis = plain.weight_and_eigenbasis()
    y, log_det = general_reflect_and_log_abs_det(x, weight, basis)
    assert torch.isnan(y[:, 3]).all() and torch.isnan(log_det[3]) and torch.isfinite(log_det[[0, 1, 2, 4]]).all()


def layer_with_a_nan(mode: str) -> tuple[AuxiliaryReflection, str]:
    """A layer with one NaN parameter entry, and the name the error must mention."""
    if mode == "network":
        network = torch.nn.Linear(5, 5).to(DTYPE)
        with torch.no_grad():
            network.weight[0, 0] = NAN
        return AuxiliaryReflection(5, network=network).to(DTYPE), "network.weight"
    layer = AuxiliaryReflection(5, invertible=mode == "theorem2").to(DTYPE)
    with torch.no_grad():
        (layer.factor if mode == "theorem2" else layer.weight)[1, 2] = NAN
    return layer, "weight" if mode == "plain" else "constraint.factor"


X = torch.randn(4, 5, dtype=DTYPE)
METHODS = {
    "forward": lambda layer: layer(X),
    "jacobian": lambda layer: layer.jacobian(X),
    "log_det_auto": lambda layer: layer.log_abs_det_jacobian(X),
    "log_det_eig": lambda layer: layer.log_abs_det_jacobian(X, method="eig"),
    "log_det_dense": lambda layer: layer.log_abs_det_jacobian(X, method="dense"),
    "forward_and_log_det": lambda layer: layer.forward_and_log_abs_det(X),
    "newton_inverse": lambda layer: layer.newton_inverse(X),
    "inverse": lambda layer: layer.inverse(X, allow_non_unique=True),
}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("mode", ["plain", "theorem2", "network"])
def test_a_nan_parameter_raises_naming_it_in_every_method(mode, method):
    layer, name = layer_with_a_nan(mode)
    with pytest.raises(ValueError, match=rf"{name}.*NaN"):
        METHODS[method](layer)


@pytest.mark.parametrize("mode", ["plain", "theorem2"])
def test_a_nan_parameter_raises_in_the_columns_api_and_margin(mode):
    layer, name = layer_with_a_nan(mode)
    with pytest.raises(ValueError, match="NaN"):
        layer.forward_and_log_abs_det_columns(X.mT)
    with pytest.raises(ValueError, match="NaN"):
        layer.newton_inverse_columns(X.mT)
    with pytest.raises(ValueError, match="NaN"):
        layer.invertibility_margin()


@pytest.mark.parametrize("method", ["forward", "jacobian", "log_det_dense"])
def test_with_checks_off_a_nan_weight_gives_nan_never_a_finite_identity(method):
    layer, _ = layer_with_a_nan("plain")
    with finite_checks(False):
        out = METHODS[method](layer)
    assert torch.isnan(out).any()


@pytest.mark.parametrize("strategy", ["wy", "sequential"])
def test_householder_strategies_agree_on_nan_and_zero_vectors(strategy):
    layer = HouseholderProduct(5, strategy=strategy).to(DTYPE)
    with torch.no_grad():
        layer.vectors[3] = 0.0  # H(0) = I: the product of the other four
    v = layer.vectors.detach()
    product = dense_householder(v[0]) @ dense_householder(v[1]) @ dense_householder(v[2]) @ dense_householder(v[4])
    torch.testing.assert_close(layer(X), X @ product.T)
    with torch.no_grad():
        layer.vectors[1, 2] = NAN
    with pytest.raises(ValueError, match="vectors.*NaN"):
        layer(X)
    with finite_checks(False):
        assert torch.isnan(layer(X)).all()
