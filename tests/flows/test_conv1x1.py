"""The 1x1 convolutions, one class per kind: the table, the shared interface, and each kind against autograd.

(Log-determinants against slogdet of the whole layer's autograd Jacobian and round trips for every kind are in
test_layers.py, parametrised over the same table.)
"""

import copy
import pickle
import typing
import warnings

import pytest
import torch

from lightning_ortho.flows import (
    CONV1X1,
    CONV1X1_KINDS,
    AuxiliaryReflectionConv1x1,
    Invertible1x1Conv,
    InvertibleAuxConv1x1,
    LinearConv1x1,
    invertible_1x1_conv,
)
from lightning_ortho.flows.conv1x1 import Conv1x1Kind
from lightning_ortho.nn import NewtonInverseError
from tests.flows.references import minority_fraction, pixel_jacobian_signs, pixel_jacobians

DTYPE = torch.float64
KINDS = list(CONV1X1)

#: state_dict keys per kind. Version 0.1 stored aux_invertible's V as ``reflection.factor``, beside a power-iteration
#: vector that no longer exists; those checkpoints still load (test below).
STATE_DICT_KEYS = {
    "plain": ["weight"],
    "lu": ["log_s", "lower", "lower_mask", "permutation", "sign_s", "upper"],
    "householder": ["householder.vectors"],
    "aux": ["reflection.weight"],
    "aux_invertible": ["fixed_basis", "reflection.constraint.factor"],
}


def generic(kind: str, channels: int = 4) -> Invertible1x1Conv:
    """A float64 layer of ``kind`` moved off its initial value (small steps keep the aux kind invertible)."""
    layer = invertible_1x1_conv(channels, kind).to(DTYPE)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return layer


def test_aux_invertible_loads_a_checkpoint_of_version_0_1():
    layer = invertible_1x1_conv(4, "aux_invertible").to(DTYPE)
    state = {k.replace("constraint.", ""): v + 0.25 for k, v in generic("aux_invertible").state_dict().items()}
    state["reflection.power_vector"] = torch.ones(4, dtype=DTYPE) / 2
    assert "reflection.factor" in state
    layer.load_state_dict(state)
    torch.testing.assert_close(layer.reflection.factor.detach(), state["reflection.factor"])


def test_the_table_has_exactly_the_kinds_of_the_literal_in_its_order():
    assert CONV1X1_KINDS == typing.get_args(Conv1x1Kind)
    assert tuple(CONV1X1) == CONV1X1_KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_invertible_1x1_conv_builds_the_class_of_the_kind(kind):
    layer = invertible_1x1_conv(5, kind)
    assert type(layer) is CONV1X1[kind] and isinstance(layer, Invertible1x1Conv)
    assert layer.kind == kind and layer.channels == 5 and f"kind={kind!r}" in repr(layer)
    assert type(invertible_1x1_conv(5, kind=kind)) is CONV1X1[kind]
    direct = CONV1X1[kind](5)
    assert type(direct) is CONV1X1[kind] and sorted(direct.state_dict()) == STATE_DICT_KEYS[kind]
    assert isinstance(layer, LinearConv1x1) == (kind in ("plain", "lu", "householder"))
    assert isinstance(layer, AuxiliaryReflectionConv1x1) == kind.startswith("aux")


def test_default_kind_is_lu():
    assert invertible_1x1_conv(3).kind == "lu"


@pytest.mark.parametrize("kind", KINDS)
def test_copies_and_pickles_keep_the_class_and_the_map(kind):
    layer = generic(kind)
    x = torch.randn(2, 4, 3, 3, dtype=DTYPE)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(clone) is type(layer)
        torch.testing.assert_close(clone(x)[0], layer(x)[0], rtol=0, atol=0)
    restored = invertible_1x1_conv(4, kind).to(DTYPE)
    restored.load_state_dict(layer.state_dict())
    torch.testing.assert_close(restored(x)[1], layer(x)[1], rtol=0, atol=0)


def test_the_base_class_called_itself_still_builds_the_kind_with_a_deprecation_warning():
    # Invertible1x1Conv(channels, kind="lu") built a layer before each kind had a class: kept for one minor release
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning, match=r"invertible_1x1_conv\(channels, 'lu'\) or its class, LUConv1x1"):
        old = Invertible1x1Conv(4)
    torch.manual_seed(0)
    new = invertible_1x1_conv(4, "lu")
    assert type(old) is type(new) and isinstance(old, Invertible1x1Conv)
    x = torch.randn(2, 4, 3, 3)
    torch.testing.assert_close(old(x)[0], new(x)[0], rtol=0, atol=0)  # the same layer, from the same draws
    with pytest.warns(DeprecationWarning, match="HouseholderConv1x1"):
        assert type(Invertible1x1Conv(4, kind="householder")).__name__ == "HouseholderConv1x1"
    with pytest.raises(ValueError, match="got 'givens'"):  # an unknown kind is refused before any layer
        Invertible1x1Conv(4, "givens")
    # a kind's own class, its copies and pickles construct without the shim
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer = CONV1X1["aux"](4)
        assert type(copy.deepcopy(layer)) is type(layer) is type(pickle.loads(pickle.dumps(layer)))


def test_unknown_kind_raises_naming_the_choices():
    with pytest.raises(ValueError, match="plain, lu, householder, aux, aux_invertible, got 'givens'"):
        invertible_1x1_conv(4, "givens")
    with pytest.raises(ValueError, match="positive integer"):
        invertible_1x1_conv(0, "lu")


def test_a_new_kind_must_be_declared_in_the_literal():
    with pytest.raises(TypeError, match="add it to that Literal"):

        class GivensConv1x1(LinearConv1x1, kind="givens"):
            pass

    assert "givens" not in CONV1X1


@pytest.mark.parametrize("kind", KINDS)
def test_pixel_jacobian_signs_match_autograd(kind):
    layer = generic(kind)
    x = torch.randn(2, 4, 3, 3, dtype=DTYPE)
    assert torch.equal(layer.jacobian_signs(x), pixel_jacobian_signs(layer, x))


@pytest.mark.parametrize("kind", [k for k in KINDS if issubclass(CONV1X1[k], LinearConv1x1)])
def test_linear_kinds_matrix_is_the_jacobian_and_inverts_exactly(kind):
    layer = generic(kind)
    x = torch.randn(2, 4, 3, 3, dtype=DTYPE)
    jacobians = pixel_jacobians(layer, x)
    torch.testing.assert_close(jacobians, layer.matrix().detach().expand_as(jacobians), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.log_abs_det_matrix(), torch.linalg.slogdet(layer.matrix())[1])
    restored, result = layer.inverse_with_result(layer(x)[0])
    assert result is None
    torch.testing.assert_close(restored, x, rtol=1e-12, atol=1e-12)
    assert layer.jacobian_sign_flips(x) == 0.0


@pytest.mark.parametrize("kind", [k for k in KINDS if issubclass(CONV1X1[k], AuxiliaryReflectionConv1x1)])
def test_auxiliary_kinds_report_newton_per_pixel(kind):
    layer = generic(kind)
    x = torch.randn(2, 4, 3, 3, dtype=DTYPE)
    restored, result = layer.inverse_with_result(layer(x)[0])
    assert result.converged.shape == (2, 9) and bool(result.converged.all())
    assert int(result.iterations.max()) >= 1 and float(result.residual.max()) <= result.tolerance
    torch.testing.assert_close(restored, x, rtol=1e-9, atol=1e-9)
    assert not hasattr(CONV1X1["lu"](4), "invertibility_margin")  # Theorem 2 covers aux_invertible only
    assert hasattr(layer, "invertibility_margin") == (kind == "aux_invertible")


def test_a_failed_newton_inverse_raises_or_is_flagged():
    torch.manual_seed(3)
    layer = invertible_1x1_conv(4, "aux").double()
    with torch.no_grad():
        layer.reflection.weight.copy_(3 * torch.randn(4, 4, dtype=DTYPE))  # a generic W: not invertible
    y = layer(torch.randn(8, 4, 4, 4, dtype=DTYPE))[0]
    _, result = layer.inverse_with_result(y, max_iter=0, raise_on_failure=False)
    assert not bool(result.converged.all())
    with pytest.raises(NewtonInverseError, match="did not converge"):
        layer.inverse_with_result(y, max_iter=0)


def test_jacobian_sign_flips_equal_the_autograd_fraction():
    torch.manual_seed(3)
    layer = invertible_1x1_conv(4, "aux").double()
    x = torch.randn(16, 4, 3, 3, dtype=DTYPE)
    # W = I - Q at init: g(x) = Q x, det J = det Q at every pixel, so the fraction is zero.
    assert minority_fraction(pixel_jacobian_signs(layer, x)) == 0.0
    assert layer.jacobian_sign_flips(x) == 0.0
    with torch.no_grad():
        layer.reflection.weight.copy_(3 * torch.randn(4, 4, dtype=DTYPE))  # a generic W: not invertible
    reference = minority_fraction(pixel_jacobian_signs(layer, x))
    assert 0.0 < reference <= 0.5  # the case is the one it should be
    assert layer.jacobian_sign_flips(x) == reference


def test_aux_invertible_stays_provably_invertible_after_training_steps():
    layer = invertible_1x1_conv(6, "aux_invertible")
    assert isinstance(layer, InvertibleAuxConv1x1)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.05)
    x = torch.randn(32, 6, 4, 4)
    for _ in range(50):  # maximise the log-determinant, which pushes W's spectrum around
        y, log_det = layer(x)
        loss = 0.5 * (y**2).sum() / 32 - log_det.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert not torch.allclose(layer.reflection.factor, torch.eye(6))  # it did train
    eigenvalues = torch.linalg.eigvalsh(layer.reflection.auxiliary_weight().detach().double())
    margin = float(1.5 * eigenvalues[0] - eigenvalues[-1])
    assert layer.invertibility_margin() == pytest.approx(margin, rel=1e-5) and margin > 0
    y, _ = layer(x)
    torch.testing.assert_close(layer.inverse(y), x, rtol=1e-4, atol=1e-4)
    assert layer.jacobian_sign_flips(x) == 0.0


def test_aux_invertible_fixed_orthogonal_is_symmetric_orthogonal_in_each_dtype():
    layer = invertible_1x1_conv(5, "aux_invertible")
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-14)):
        q = layer.fixed_orthogonal(dtype)
        assert q.dtype == dtype
        torch.testing.assert_close(q, q.T, rtol=0, atol=tol)
        torch.testing.assert_close(q @ q.T, torch.eye(5, dtype=dtype), rtol=0, atol=10 * tol)


def test_aux_invertible_under_bf16_autocast_keeps_an_exact_fixed_rotation_and_inverse():
    # Issue 9.1: the fixed Q was built inside autocast in bfloat16, cached, and reused in float32.
    torch.manual_seed(0)
    layer = invertible_1x1_conv(16, "aux_invertible")
    x = torch.rand(2, 16, 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = layer(x)
    q = layer.fixed_orthogonal(torch.float32)
    assert float((q.T @ q - torch.eye(16)).abs().max()) < 1e-6
    assert float((layer.inverse(y.float()) - x).abs().max()) < 1e-5
    assert layer.fixed_orthogonal(torch.bfloat16).dtype == torch.float32  # the rotation is never rounded to bf16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_layers_compute_in_float32(kind, dtype):
    # Issue 9.9: half-precision 1x1 convolutions failed (slogdet, inv, triangular solve, eigh have no half kernels).
    torch.manual_seed(0)
    layer = invertible_1x1_conv(4, kind).to(dtype)
    reference = invertible_1x1_conv(4, kind)
    reference.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    x = torch.rand(2, 4, 3, 3).to(dtype)
    y, log_det = layer(x)
    y_ref, log_det_ref = reference(x.float())
    assert y.dtype == dtype and log_det.dtype == dtype
    torch.testing.assert_close(y, y_ref.to(dtype))
    torch.testing.assert_close(log_det, log_det_ref.to(dtype))
    (y.float().sum() + log_det.float().sum()).backward()
    assert all(p.grad.dtype == dtype and torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
    assert float((layer.inverse(y).float() - x.float()).abs().max()) <= 4 * torch.finfo(dtype).eps


def test_aux_inverse_says_once_that_it_is_not_provably_unique():
    # Issue 9.3 for flows: sampling or reconstructing through kind='aux' must not look like a guaranteed inverse.
    import warnings

    layer = invertible_1x1_conv(4, "aux")
    y, _ = layer(torch.rand(2, 4, 3, 3))
    with pytest.warns(UserWarning, match="not provably invertible"):
        _, result = layer.inverse_with_result(y)
    assert result.provably_unique is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer.inverse(y)  # said once per layer, not at every sampling step
    theorem2 = invertible_1x1_conv(4, "aux_invertible")
    assert theorem2.inverse_with_result(theorem2(torch.rand(2, 4, 3, 3))[0])[1].provably_unique is True
