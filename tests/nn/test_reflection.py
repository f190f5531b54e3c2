import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_ortho.nn.reflection as reflection_module
from lightning_ortho.nn import finite_checks, householder_matrix, reflect
from tests.helpers import dense_householder


@pytest.mark.parametrize("fused", [False, True])
def test_reflect_matches_dense_matrix(fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.randn(6, 7, dtype=torch.float64)
    v = torch.randn(6, 7, dtype=torch.float64)
    expected = torch.stack([dense_householder(v[i]) @ x[i] for i in range(6)])
    torch.testing.assert_close(reflect(x, v), expected, rtol=1e-12, atol=1e-12)


def test_single_vector_broadcasts_over_batch_and_matrix_agrees():
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    v = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(reflect(x, v), x @ dense_householder(v).T)
    torch.testing.assert_close(householder_matrix(v), dense_householder(v))


@pytest.mark.parametrize("fused", [False, True])
def test_gradients_forward_and_reverse_and_second_order(fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(reflect, (x, v), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(reflect, (x, v))


@pytest.mark.parametrize("fused", [False, True])
def test_torch_func_transforms_match_reference(fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.randn(3, 6, dtype=torch.float64)
    v = torch.randn(3, 6, dtype=torch.float64)

    def reference(x, v):
        return x - 2 * v * (v * x).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True)

    expected = torch.func.vmap(torch.func.jacrev(reference))(x, v)
    torch.testing.assert_close(torch.func.vmap(torch.func.jacrev(reflect))(x, v), expected)
    torch.testing.assert_close(torch.func.vmap(torch.func.jacfwd(reflect))(x, v), expected)


@pytest.mark.parametrize("fused", [False, True])
def test_zero_vector_is_identity_with_finite_gradients(fused, monkeypatch):
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    v = torch.zeros(3, 5, dtype=torch.float64, requires_grad=True)
    y = reflect(x, v)
    assert torch.equal(y, x)
    y.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(v.grad).all()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
        reflect(torch.randn(2, 3), torch.randn(4))
    with pytest.raises(TypeError, match="floating-point"):
        reflect(torch.ones(2, 3, dtype=torch.long), torch.randn(3))
    with pytest.raises(ValueError, match="NaN"):
        reflect(torch.tensor([[float("nan"), 1.0, 2.0]]), torch.randn(3))
    with finite_checks(False):  # the check can be turned off for speed
        assert torch.isnan(reflect(torch.tensor([[float("nan"), 1.0, 2.0]]), torch.randn(3))).any()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=12),
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=24, max_size=24),
)
def test_norm_preserved_and_involution(d, values):
    data = torch.tensor(values, dtype=torch.float64)
    x, v = data[:d], data[12 : 12 + d]
    y = reflect(x, v)
    scale = 1 + torch.linalg.vector_norm(x)
    assert abs(torch.linalg.vector_norm(y) - torch.linalg.vector_norm(x)) <= 1e-9 * scale
    torch.testing.assert_close(reflect(y, v), x, atol=1e-9 * float(scale), rtol=0)


def test_one_unbatched_vector_with_a_badly_scaled_reflection_vector():
    # Found by hypothesis: an unbatched (d,) input whose v had a denormal entry raised an IndexError in the
    # rescaling of badly scaled rows. H(v) x must equal the batched result, and a tiny v reflects like a unit one.
    x = torch.zeros(8, dtype=torch.float64)
    x[3] = 1.0
    for scale in (2.2250738585072014e-308, 1e-200, 1e200):
        v = torch.zeros(8, dtype=torch.float64)
        v[3] = scale
        expected = x.clone()
        expected[3] = -1.0
        # A unit v in [1, 2) is reflected with rounding (c = 2 v.x / v.v); so is every rescaled tiny or huge v.
        torch.testing.assert_close(reflect(x, v), expected, rtol=0, atol=2 * torch.finfo(x.dtype).eps)
        torch.testing.assert_close(reflect(x, v), reflect(x[None], v[None])[0], rtol=0, atol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_a_coefficient_that_would_overflow_is_computed_at_unit_scale(monkeypatch, fused):
    """Finite x and v whose c = 2 v.x / v.v overflows float32 as given (v.v = 2e-30 is in range, v.x = 2e15):
    rows are reflected at unit scale, so the result is the exact H(v) x, not -inf."""
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.tensor([[1e30, 0.0], [1.0, 2.0]])
    v = torch.tensor([[1e-15, 1e-15], [1.0, 0.0]])
    expected = torch.stack([dense_householder(v[i].double()) @ x[i].double() for i in range(2)])
    error = torch.linalg.vector_norm(reflect(x, v).double() - expected, dim=-1)
    assert (error <= 4 * torch.finfo(x.dtype).eps * torch.linalg.vector_norm(expected, dim=-1)).all()


@pytest.mark.parametrize("fused", [False, True])
def test_a_result_that_overflows_raises_instead_of_returning_inf(monkeypatch, fused):
    """||x|| = 4.2e38 is above float32's largest number while every entry is finite; H(v) x = ||x|| e_1 is not
    representable: an error, not a silent inf."""
    monkeypatch.setattr(reflection_module, "FUSED_MIN_NUMEL", 0 if fused else 1 << 30)
    x = torch.tensor([[3e38, 3e38], [1.0, 2.0]])
    v = torch.tensor([[3e38 * (1 - 2**0.5), 3e38], [1.0, 0.0]])
    with pytest.raises(ValueError, match="overflow"):
        reflect(x, v)
    with finite_checks(False):
        assert torch.isinf(reflect(x, v)[0]).any()
