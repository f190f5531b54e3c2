import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ortho.nn import AuxiliaryReflection, NewtonInverseError, NotInvertibleError
from tests.helpers import auxiliary_reference, dense_householder, random_orthogonal, theorem2_weight

DTYPE = torch.float64


def plain(d: int) -> AuxiliaryReflection:
    return AuxiliaryReflection(d).to(DTYPE)


def invertible(d: int) -> AuxiliaryReflection:
    return AuxiliaryReflection(d, invertible=True).to(DTYPE)


def autograd_jacobian(layer: AuxiliaryReflection, x: torch.Tensor) -> torch.Tensor:
    weight = layer.auxiliary_weight().detach()
    return torch.func.vmap(torch.func.jacrev(lambda row: auxiliary_reference(row, weight)))(x)


# ---------------------------------------------------------------- forward, Theorem 1, Lemma 5


def test_forward_matches_definition():
    layer = plain(6)
    x = torch.randn(5, 6, dtype=DTYPE)
    expected = torch.stack([auxiliary_reference(row, layer.weight.detach()) for row in x])
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("d", [2, 3, 5, 16, 33, 64])
def test_theorem1_from_orthogonal_equals_u_x(d):
    u = random_orthogonal(d)
    layer = AuxiliaryReflection.from_orthogonal(u)
    assert layer.weight.dtype == DTYPE
    torch.testing.assert_close(layer.weight.detach(), torch.eye(d, dtype=DTYPE) - u)
    x = torch.randn(50, d, dtype=DTYPE)
    torch.testing.assert_close(layer(x), x @ u.T, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("d", [2, 3, 7, 20])
def test_theorem1_for_product_of_reflections(d):
    vectors = torch.randn(3, d, dtype=DTYPE)
    u = dense_householder(vectors[0]) @ dense_householder(vectors[1]) @ dense_householder(vectors[2])
    x = torch.randn(10, d, dtype=DTYPE)
    torch.testing.assert_close(AuxiliaryReflection.from_orthogonal(u)(x), x @ u.T, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("d", [2, 5, 31])
def test_lemma5_reflection_of_x_minus_y_maps_x_to_y(d):
    x = torch.randn(d, dtype=DTYPE)
    y = torch.randn(d, dtype=DTYPE)
    y = y * torch.linalg.vector_norm(x) / torch.linalg.vector_norm(y)
    torch.testing.assert_close(dense_householder(x - y) @ x, y)
    from lightning_ortho.nn import reflect

    torch.testing.assert_close(reflect(x, x - y), y)


def test_from_orthogonal_rejects_non_orthogonal():
    with pytest.raises(ValueError, match="not orthogonal"):
        AuxiliaryReflection.from_orthogonal(torch.randn(4, 4, dtype=DTYPE))
    with pytest.raises(ValueError, match="square"):
        AuxiliaryReflection.from_orthogonal(torch.randn(4, 3, dtype=DTYPE))


# ---------------------------------------------------------------- Theorem 3 and Lemma 1


@pytest.mark.parametrize("make", [plain, invertible], ids=["plain", "theorem2"])
@pytest.mark.parametrize("d", [2, 3, 8, 17])
def test_theorem3_jacobian_matches_autograd(make, d):
    layer = make(d)
    x = torch.randn(9, d, dtype=DTYPE)
    torch.testing.assert_close(layer.jacobian(x), autograd_jacobian(layer, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["eig", "dense", "auto"])
@pytest.mark.parametrize("make", [plain, invertible], ids=["plain", "theorem2"])
@pytest.mark.parametrize("d", [2, 3, 8, 17])
def test_lemma1_log_det_matches_slogdet_of_autograd_jacobian(method, make, d):
    layer = make(d)
    x = torch.randn(2, 5, d, dtype=DTYPE)  # extra batch dimension on purpose
    expected = torch.linalg.slogdet(autograd_jacobian(layer, x.reshape(-1, d)))[1].reshape(2, 5)
    torch.testing.assert_close(layer.log_abs_det_jacobian(x, method=method), expected, rtol=1e-9, atol=1e-9)


def test_lemma1_sign_formula_gives_the_determinant_itself():
    # det J = -det(A) (1 + 2 v^T A^{-1} u / ||u||^2): check the sign too, straight from the lemma.
    layer = plain(6)
    w = layer.weight.detach()
    x = torch.randn(6, dtype=DTYPE)
    u, v = w @ x, w.T @ x
    a = torch.eye(6, dtype=DTYPE) - 2 * (x @ w.T @ x) / (u @ u) * w
    lemma = -torch.linalg.det(a) * (1 + 2 * v @ torch.linalg.solve(a, u) / (u @ u))
    torch.testing.assert_close(lemma, torch.linalg.det(autograd_jacobian(layer, x[None])[0]))


def test_theorem2_weight_is_the_paper_construction():
    layer = invertible(7)
    expected = theorem2_weight(layer.factor.detach())
    # our W uses a 1e-3 safety factor on sigma_max; undo it to compare with the paper's formula
    eye = torch.eye(7, dtype=DTYPE)
    torch.testing.assert_close(
        (layer.auxiliary_weight().detach() - eye) * (1 + layer.constraint.spectral_margin) + eye, expected
    )


@pytest.mark.parametrize("make", [plain, invertible], ids=["plain", "theorem2"])
def test_gradcheck_forward_and_log_det(make):
    layer = make(4)
    x = torch.randn(3, 4, dtype=DTYPE, requires_grad=True)
    params = tuple(layer.parameters())
    assert torch.autograd.gradcheck(lambda x, *p: layer(x), (x, *params))
    assert torch.autograd.gradcheck(lambda x, *p: layer.log_abs_det_jacobian(x, method="eig"), (x, *params))
    assert torch.autograd.gradcheck(lambda x, *p: layer.log_abs_det_jacobian(x, method="dense"), (x, *params))


def test_log_det_gradients_finite_when_eigenvalues_repeat():
    # V = I gives V V^T = I: every eigenvalue of W repeats. Differentiating eigenvectors would divide by zero.
    layer = invertible(5)
    with torch.no_grad():
        layer.factor.copy_(torch.eye(5, dtype=DTYPE))
    x = torch.randn(8, 5, dtype=DTYPE)
    layer.log_abs_det_jacobian(x, method="eig").sum().backward()
    eig_grad = layer.factor.grad.clone()
    layer.factor.grad = None
    layer.log_abs_det_jacobian(x, method="dense").sum().backward()
    assert torch.isfinite(eig_grad).all()
    torch.testing.assert_close(eig_grad, layer.factor.grad, rtol=1e-8, atol=1e-10)


def test_custom_network_jacobian_and_log_det():
    d = 4
    network = torch.nn.Sequential(torch.nn.Linear(d, 8), torch.nn.Tanh(), torch.nn.Linear(8, d)).to(DTYPE)
    layer = AuxiliaryReflection(d, network=network)
    x = torch.randn(6, d, dtype=DTYPE)

    def f(row):
        return dense_householder(network(row)) @ row

    jac = torch.func.vmap(torch.func.jacrev(f))(x)
    torch.testing.assert_close(layer(x), torch.stack([f(r) for r in x]))
    torch.testing.assert_close(layer.jacobian(x), jac, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer.log_abs_det_jacobian(x), torch.linalg.slogdet(jac)[1], rtol=1e-9, atol=1e-9)
    xr = x[:2].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, *p: layer.log_abs_det_jacobian(x), (xr, *network.parameters()))
    with pytest.raises(ValueError, match="cannot be combined"):
        AuxiliaryReflection(d, network=network, invertible=True)


# ---------------------------------------------------------------- degenerate points


def test_zero_input_and_zero_auxiliary_vector_are_defined():
    layer = plain(4)
    with torch.no_grad():
        layer.weight[:, 0] = 0.0  # W e_1 = 0: n(x) = 0 at x = e_1
    x = torch.stack([torch.zeros(4, dtype=DTYPE), torch.tensor([1.0, 0, 0, 0], dtype=DTYPE)]).requires_grad_()
    y = layer(x)
    torch.testing.assert_close(y, x.detach())  # f(0) = 0 and H(0) := I
    logdet = layer.log_abs_det_jacobian(x)
    torch.testing.assert_close(logdet, torch.zeros(2, dtype=DTYPE))
    torch.testing.assert_close(layer.jacobian(x), torch.eye(4, dtype=DTYPE).expand(2, 4, 4))
    (y.sum() + logdet.sum()).backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
    zero = torch.zeros(1, 4, dtype=DTYPE)
    assert torch.equal(layer.inverse(zero, allow_non_unique=True), zero)


# ---------------------------------------------------------------- Newton inverse


@pytest.mark.parametrize("d", [2, 3, 4, 8, 16, 32, 64])
def test_newton_round_trip_theorem2_float64(d):
    layer = invertible(d)
    with torch.no_grad():  # a non-trivial V, not the small uniform init
        layer.factor.copy_(torch.randn(d, d, dtype=DTYPE))
    assert layer.invertibility_margin() > 0
    x = torch.randn(64, d, dtype=DTYPE) * torch.rand(64, 1, dtype=DTYPE) * 10
    result = layer.newton_inverse(layer(x))
    assert result.all_converged
    relative = torch.linalg.vector_norm(result.x - x, dim=-1) / torch.linalg.vector_norm(x, dim=-1)
    assert float(relative.max()) <= 1e-8
    assert int(result.iterations.max()) <= 50
    assert float(result.residual.max()) <= result.tolerance


def test_newton_round_trip_float32():
    layer = AuxiliaryReflection(12, invertible=True)
    x = torch.randn(200, 12)
    recovered = layer.inverse(layer(x))
    assert recovered.dtype == torch.float32
    torch.testing.assert_close(recovered, x, rtol=1e-4, atol=1e-4)


def test_newton_round_trip_from_orthogonal_init():
    u = random_orthogonal(10)
    layer = AuxiliaryReflection.from_orthogonal(u)
    x = torch.randn(32, 10, dtype=DTYPE)
    torch.testing.assert_close(layer.inverse(layer(x), allow_non_unique=True), x, rtol=1e-8, atol=1e-8)


def test_inverse_of_a_layer_that_is_not_provably_invertible_needs_an_explicit_opt_in():
    # Issue 9.3: an unconstrained layer returned a different preimage and called it converged.
    torch.manual_seed(0)
    layer = plain(4)
    x = torch.randn(200, 4, dtype=DTYPE)
    y = layer(x)
    with pytest.raises(NotInvertibleError, match="invertible=True"):
        layer.inverse(y)
    result = layer.newton_inverse(y)
    assert not result.provably_unique and invertible(4).newton_inverse(y).provably_unique
    # What the opt-in accepts: a preimage of y, which for some rows is not the input (the map is not one-to-one).
    ok = result.converged
    preimage = layer.inverse(y[ok], allow_non_unique=True)
    torch.testing.assert_close(layer(preimage), y[ok], rtol=1e-9, atol=1e-9)
    other = torch.linalg.vector_norm(preimage - x[ok], dim=-1) > 1e-6 * torch.linalg.vector_norm(x[ok], dim=-1)
    assert int(other.sum()) > 0


def test_newton_failure_is_detected_never_silent():
    # An unconstrained random W is generally not invertible: Newton must flag, not return wrong answers.
    torch.manual_seed(3)
    layer = AuxiliaryReflection(6).to(DTYPE)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(6, 6, dtype=DTYPE) * 3)
    y = torch.randn(400, 6, dtype=DTYPE)
    result = layer.newton_inverse(y, max_iter=30)
    assert not result.all_converged, "this W was chosen so that some targets are not reached"
    # every row reported as converged really is an inverse ...
    ok = result.converged
    torch.testing.assert_close(layer(result.x[ok]), y[ok], rtol=1e-9, atol=1e-9)
    # ... and every row reported as failed really is not
    failed_residual = torch.linalg.vector_norm(layer(result.x[~ok]) - y[~ok], dim=-1) / torch.linalg.vector_norm(
        y[~ok], dim=-1
    )
    assert (failed_residual > result.tolerance).all()
    with pytest.raises(NewtonInverseError, match="did not converge") as info:
        layer.inverse(y, max_iter=30, allow_non_unique=True)
    assert info.value.result.converged.sum() == ok.sum()


def test_newton_iteration_budget_is_respected_and_reported():
    layer = invertible(8)
    with torch.no_grad():
        layer.factor.copy_(torch.randn(8, 8, dtype=DTYPE))
    y = layer(torch.randn(16, 8, dtype=DTYPE))
    result = layer.newton_inverse(y, max_iter=1, tol=1e-14)
    assert int(result.iterations.max()) == 1
    with pytest.raises(NewtonInverseError, match="1 iterations"):
        layer.inverse(y, max_iter=1, tol=1e-14)


def test_invertibility_margin():
    layer = invertible(6)
    margin = layer.invertibility_margin()
    eigenvalues = torch.linalg.eigvalsh(layer.auxiliary_weight().detach())
    assert math.isclose(margin, float(1.5 * eigenvalues[0] - eigenvalues[-1]), rel_tol=1e-9)
    assert margin > 0
    with torch.no_grad():  # rank-deficient V: the paper's bound is tight, our safety factor keeps it strict
        layer.factor.copy_(torch.diag(torch.tensor([1.0, 1, 1, 1, 1, 0], dtype=DTYPE)))
    assert layer.invertibility_margin() > 0
    with pytest.raises(ValueError, match="symmetric"):
        plain(6).invertibility_margin()


@pytest.mark.parametrize("d", [2, 8, 40])
def test_upper_bound_spectral_method_is_invertible_at_every_call(d):
    # Issue 9.2: power iteration underestimated sigma_max at first (margin -1.53 at d = 600, -48.7 with an unlucky
    # start); the cheap method must bound it from above at every call, including the first, for any V.
    generator = torch.Generator().manual_seed(d)
    exact = AuxiliaryReflection(d, invertible=True, spectral_method="eigh").to(DTYPE)
    bounded = AuxiliaryReflection(d, invertible=True, spectral_method="upper_bound").to(DTYPE)
    for trial in range(20):
        factor = torch.randn(d, d, dtype=DTYPE, generator=generator)
        if trial % 2:  # nearly rank one: the bound is tight there
            factor = torch.outer(factor[0], factor[1]) + 1e-3 * factor
        with torch.no_grad():
            bounded.factor.copy_(factor)
        gram = factor @ factor.T
        assert float(bounded.constraint.sigma_max(gram)) >= float(torch.linalg.eigvalsh(gram)[-1]) * (1 - 1e-12)
        assert bounded.invertibility_margin() > 0
    state = {k: v.clone() for k, v in bounded.state_dict().items()}
    bounded.train()
    bounded.invertibility_margin()
    bounded(torch.randn(3, d, dtype=DTYPE))
    assert all(torch.equal(state[k], v) for k, v in bounded.state_dict().items())  # nothing but V is state
    exact.load_state_dict(bounded.state_dict())
    # The exact method gives the widest spectrum Theorem 2 allows; the bound narrows it, never widens it.
    spread = lambda layer: float(torch.linalg.eigvalsh(layer.auxiliary_weight().detach())[-1])  # noqa: E731
    assert spread(bounded) <= spread(exact) + 1e-12


def test_large_layers_are_provably_invertible_by_default():
    layer = AuxiliaryReflection(600, invertible=True)  # above EXACT_SPECTRAL_MAX_DIM: the certified bound
    assert layer.constraint.spectral_method == "upper_bound"
    assert layer.eval().invertibility_margin() > 0 and layer.train().invertibility_margin() > 0
    with pytest.raises(ValueError, match="power iteration underestimates"):
        AuxiliaryReflection(8, invertible=True, spectral_method="power")


# ---------------------------------------------------------------- properties and input checking


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 10), st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3))
def test_property_norm_preserved_and_round_trip(d, seed, scale):
    generator = torch.Generator().manual_seed(seed)
    layer = invertible(d)
    with torch.no_grad():
        layer.factor.copy_(torch.randn(d, d, dtype=DTYPE, generator=generator))
    x = torch.randn(8, d, dtype=DTYPE, generator=generator) * scale
    y = layer(x)
    torch.testing.assert_close(torch.linalg.vector_norm(y, dim=-1), torch.linalg.vector_norm(x, dim=-1))
    torch.testing.assert_close(layer.inverse(y), x, rtol=1e-8, atol=1e-8 * scale)


def test_bad_inputs():
    layer = AuxiliaryReflection(4)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        layer(torch.randn(3, 5))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="does not match parameter dtype"):
        layer(torch.randn(3, 4, dtype=DTYPE))
    for method in (layer, layer.log_abs_det_jacobian, layer.jacobian, partial(layer.inverse, allow_non_unique=True)):
        with pytest.raises(ValueError, match="NaN"):
            method(torch.tensor([[1.0, float("nan"), 0.0, 2.0]]))
    with torch.no_grad():
        layer.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match="weight contains NaN or infinite"):
        layer(torch.randn(2, 4))


def test_mixed_precision_runs_reflection_in_float32():
    layer = AuxiliaryReflection(16)
    x = torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), layer(x.bfloat16().float()), rtol=1e-2, atol=1e-2)
    assert torch.isfinite(y.float()).all()


@pytest.mark.parametrize("make", [plain, invertible], ids=["plain", "theorem2"])
def test_forward_and_log_det_together_equal_the_separate_calls(make):
    layer = make(6)
    x = torch.randn(2, 7, 6, dtype=DTYPE, requires_grad=True)
    y, log_det = layer.forward_and_log_abs_det(x)
    torch.testing.assert_close(y, layer(x))
    torch.testing.assert_close(log_det, layer.log_abs_det_jacobian(x))
    xr = x[0, :3].detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, *p: layer.forward_and_log_abs_det(x), (xr, *layer.parameters()))


def test_a_custom_network_of_the_wrong_width_is_refused():
    # Issue 9, smaller items: a (..., 1) output was broadcast into a finite, wrong answer.
    layer = AuxiliaryReflection(4, network=torch.nn.Linear(4, 1))
    with pytest.raises(ValueError, match=r"must map \(\.\.\., 4\) to \(\.\.\., 4\); it returned shape \(3, 1\)"):
        layer(torch.randn(3, 4))


def test_second_derivatives_raise_on_the_eigenbasis_route_and_work_on_the_dense_one():
    # Issue 9, smaller items: create_graph=True silently gave a gradient with no graph (then None or an error).
    layer = invertible(4)
    x = torch.randn(3, 4, dtype=DTYPE, requires_grad=True)
    _, log_det = layer.forward_and_log_abs_det(x)
    with pytest.raises(RuntimeError, match="method='dense'"):
        torch.autograd.grad(log_det.sum(), x, create_graph=True)
    dense = layer.log_abs_det_jacobian(x, method="dense")
    (first,) = torch.autograd.grad(dense.sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), x)
    reference = torch.autograd.functional.hessian(
        lambda v: torch.linalg.slogdet(autograd_jacobian(layer, v))[1].sum(), x.detach()
    ).sum((0, 1))
    torch.testing.assert_close(second, reference, rtol=1e-7, atol=1e-7)
