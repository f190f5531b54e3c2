"""The fused path of ``AuxiliaryReflection`` (``n(x) = W x``): same values and derivatives as the plain expression
``y = x - 2 (v.x / v.v) v`` with ``v = W x``, taken exactly when every row is finite and well scaled, and every other
batch handed to the careful path with its old results and errors."""

import pytest
import torch

import lightning_ortho.nn._fast_reflection as fast_module
from lightning_ortho.nn import AuxiliaryReflection, finite_checks

DTYPE = torch.float64


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``H(W x) x`` row by row, plain autograd."""
    v = x @ weight.T
    return x - 2 * v * (v * x).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True)


@pytest.fixture(autouse=True, params=["c_rows", "torch_rows"])
def row_implementation(request, monkeypatch):
    """Every test twice: with the C row kernels (where a compiler exists) and with the PyTorch ops."""
    if request.param == "torch_rows":
        monkeypatch.setattr(fast_module, "row_kernels", lambda *tensors: None)
    elif fast_module.row_kernels(torch.zeros(1, 1)) is None:
        pytest.skip("the C row kernels are not available on this machine (no C compiler)")
    return request.param


@pytest.fixture
def fused_calls(monkeypatch):
    """How many times the fused Function ran, and how many of its results were kept."""
    calls = {"ran": 0, "kept": 0}
    apply, checked = fast_module._WellScaledLinearReflection.apply, fast_module.well_scaled_linear_reflection

    def counting_apply(*args):
        calls["ran"] += 1
        return apply(*args)

    def counting_check(x, weight):
        y = checked(x, weight)
        calls["kept"] += y is not None
        return y

    monkeypatch.setattr(fast_module._WellScaledLinearReflection, "apply", counting_apply)
    monkeypatch.setattr("lightning_ortho.nn.auxiliary.well_scaled_linear_reflection", counting_check)
    return calls


def careful(layer: AuxiliaryReflection, x: torch.Tensor) -> torch.Tensor:
    layer.fused_forward = False
    try:
        return layer(x)
    finally:
        layer.fused_forward = True


@pytest.mark.parametrize("shape", [(7, 5), (5,), (2, 3, 5)])
def test_values_and_gradients_match_the_plain_expression(shape, fused_calls):
    torch.manual_seed(0)
    layer = AuxiliaryReflection(5).to(DTYPE)
    x = torch.randn(shape, dtype=DTYPE, requires_grad=True)
    w = torch.randn(shape, dtype=DTYPE)
    y = layer(x)
    assert fused_calls == {"ran": 1, "kept": 1}
    expected = reference(x, layer.weight)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # inference skips the autograd Function
        torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    assert fused_calls == {"ran": 1, "kept": 2}
    got = torch.autograd.grad((y * w).sum(), (x, layer.weight))
    want = torch.autograd.grad((expected * w).sum(), (x, layer.weight))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_first_and_second_derivatives_by_gradcheck(fused_calls):
    torch.manual_seed(1)
    layer = AuxiliaryReflection(4).to(DTYPE)
    x = torch.randn(3, 4, dtype=DTYPE, requires_grad=True)
    weight = layer.weight

    def f(x, weight):
        with torch.nn.utils.stateless._reparametrize_module(layer, {"weight": weight}):
            return layer(x)

    assert torch.autograd.gradcheck(f, (x, weight), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (x, weight))
    assert fused_calls["kept"] > 0


def test_invertible_layer_takes_the_fused_path_with_gradients_to_its_factor(fused_calls):
    torch.manual_seed(2)
    layer = AuxiliaryReflection(6, invertible=True).to(DTYPE)
    x = torch.randn(4, 6, dtype=DTYPE)
    (layer(x) ** 3).sum().backward()
    assert fused_calls["kept"] == 1
    fused_grad, layer.factor.grad = layer.factor.grad.clone(), None
    (careful(layer, x) ** 3).sum().backward()
    torch.testing.assert_close(fused_grad, layer.factor.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("row", ["zero", "tiny", "huge"])
def test_a_batch_with_a_zero_or_badly_scaled_row_gets_the_careful_result(row, fused_calls):
    torch.manual_seed(3)
    layer = AuxiliaryReflection(5)
    x = torch.randn(4, 5)
    x[2] = {"zero": 0.0, "tiny": 1e-20 * x[2], "huge": 1e19 * x[2]}[row]
    y = layer(x)
    assert fused_calls == {"ran": 1, "kept": 0}  # tried, discarded, recomputed carefully
    assert torch.equal(y, careful(layer, x))
    if row != "zero":  # homogeneity: the scaled row is reflected like a unit one
        torch.testing.assert_close(y[2] / x[2].abs().max(), layer(x[2] / x[2].abs().max()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("where", ["x", "weight"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_is_named(where, value):
    layer = AuxiliaryReflection(5)
    x = torch.randn(4, 5)
    with torch.no_grad():
        (x if where == "x" else layer.weight)[1, 3] = value
    with pytest.raises(ValueError, match=f"AuxiliaryReflection: {where} contains NaN"):
        layer(x)
    with finite_checks(False):  # unchecked: the non-finite value flows through
        assert not torch.isfinite(layer(x)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_and_parameters(dtype, fused_calls):
    torch.manual_seed(4)
    layer = AuxiliaryReflection(8)
    x = torch.randn(6, 8).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and fused_calls["kept"] == 1
    assert torch.equal(y, careful(layer, x))
    layer = layer.to(dtype)
    y = layer(x)
    assert y.dtype == dtype and fused_calls["kept"] == 2
    assert torch.equal(y, careful(layer, x))
    y.float().sum().backward()
    assert layer.weight.grad.dtype == dtype and torch.isfinite(layer.weight.grad).all()


def test_autocast_runs_the_reflection_in_float32(fused_calls):
    torch.manual_seed(5)
    layer = AuxiliaryReflection(8)
    x = torch.randn(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        expected = careful(layer, x)
    assert y.dtype == torch.float32 and fused_calls["kept"] == 1
    torch.testing.assert_close(y, reference(x, layer.weight.detach()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y, expected)


def test_torch_func_takes_the_careful_path_and_agrees(fused_calls):
    torch.manual_seed(6)
    layer = AuxiliaryReflection(5).to(DTYPE)
    x = torch.randn(3, 5, dtype=DTYPE)
    params = {"weight": layer.weight.detach()}
    jac = torch.func.vmap(torch.func.jacrev(lambda row: torch.func.functional_call(layer, params, (row,))))(x)
    expected = torch.func.vmap(torch.func.jacrev(lambda row: reference(row, params["weight"])))(x)
    torch.testing.assert_close(jac, expected)
    grad = torch.func.grad(lambda p: torch.func.functional_call(layer, p, (x,)).pow(3).sum())(params)["weight"]
    (layer(x).pow(3).sum()).backward()  # the fused path
    torch.testing.assert_close(grad, layer.weight.grad)
    assert fused_calls == {"ran": 1, "kept": 1}


def test_forward_mode_dual_tensors_through_the_fused_path(fused_calls):
    torch.manual_seed(7)
    layer = AuxiliaryReflection(5).to(DTYPE)
    x, tangent = torch.randn(4, 5, dtype=DTYPE), torch.randn(4, 5, dtype=DTYPE)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        y_t = fwAD.unpack_dual(layer(fwAD.make_dual(x, tangent))).tangent
    _, expected = torch.func.jvp(lambda x: reference(x, layer.weight.detach()), (x,), (tangent,))
    torch.testing.assert_close(y_t, expected)
    assert fused_calls["kept"] == 1


def test_a_coefficient_that_overflows_is_not_kept():
    # v = W x is tiny next to x but v.v is in range: c = v.x / v.v overflows float32 although every input is finite.
    x = torch.full((2, 4), 1e25)
    weight = torch.eye(4) * 1e-39
    v = x @ weight.T
    assert 1e-31 < float((v * v).sum(-1).min()) < 1e31 and not torch.isfinite((v * x).sum(-1) / (v * v).sum(-1)).all()
    assert fast_module.well_scaled_linear_reflection(x, weight) is None
    assert fast_module.well_scaled_linear_reflection(x[:, :4] * 1e-20, torch.eye(4)) is not None


def test_unchecked_mode_keeps_the_fused_path_and_the_zero_row_convention(fused_calls):
    """finite_checks(False) turns off NaN errors, not the fused path (the careful path is slower at small sizes);
    the fused path's own range check still sends a zero row to the careful path, where H(0) = I."""
    torch.manual_seed(5)
    layer = AuxiliaryReflection(6).double()
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    with finite_checks(False):
        y = layer(x)
    assert fused_calls["kept"] == 1
    torch.testing.assert_close(y, careful(layer, x), rtol=1e-12, atol=1e-12)
    zero = torch.cat([x.detach()[:2], torch.zeros(1, 6, dtype=torch.float64)])
    with finite_checks(False):
        y_zero = layer(zero)
    assert fused_calls["kept"] == 1 and torch.equal(y_zero[2], zero[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_strided_output_gradient_and_a_strided_input(dtype):
    """The backward pass reads ``g`` with its strides (a transposed view here) and the forward pass a transposed
    ``x``; values and gradients equal the plain expression's."""
    torch.manual_seed(3)
    weight = torch.randn(6, 6, dtype=dtype, requires_grad=True)
    x = torch.randn(6, 9, dtype=dtype).t().requires_grad_()  # (9, 6), not contiguous
    g = torch.randn(6, 9, dtype=dtype).t()
    y = fast_module.well_scaled_linear_reflection(x, weight)
    grads = torch.autograd.grad(y, (x, weight), g)
    expected = reference(x, weight)
    expected_grads = torch.autograd.grad(expected, (x, weight), g)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype is torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(y, expected, **tolerance)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, **tolerance)


def test_where_a_read_is_not_free_the_careful_path_runs_without_one(fused_calls):
    """Under a dispatch mode (as on an accelerator, under torch.compile or torch.func) the fused path's host read is
    not free: the careful path runs instead, reads nothing (its NaN checks off), and gives the same rows."""
    from tests.sync_counter import HostSyncCounter

    torch.manual_seed(7)
    layer = AuxiliaryReflection(5).double()
    x = torch.randn(6, 5, dtype=DTYPE, requires_grad=True)
    with finite_checks(False), HostSyncCounter() as counter:
        y = layer(x)
        assert fast_module.well_scaled_linear_reflection(x.detach(), layer.weight.detach()) is None
    assert counter.reads == [] and fused_calls == {"ran": 0, "kept": 0}
    torch.testing.assert_close(y, reference(x, layer.weight), rtol=1e-12, atol=1e-12)
    layer(x)  # plain CPU memory, nothing watching: the fused path, whose read is free here
    assert fused_calls == {"ran": 1, "kept": 1}
