"""Tests of the structured multiplication-free starts (binDCT-style lifting DCT, WHT butterflies) and of their exact
refinement on data (learn_fast_transform), in float64 against dense references."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_ortho.transforms.fast_transform_init import (
    dct_2d_factors,
    dct_lifting_1d,
    dct_rows,
    dyadic_dct_1d,
    factor_cost,
    factors_matrix,
    factors_to_blocks,
    separable_2d,
    transposed,
    wht_factors,
    with_free_slots,
)
from lightning_ortho.transforms.learn_fast_transform import (
    DCT_OPS,
    entry_statistics,
    fast_transform_sweep,
    learn_fast_transform,
    tied_coefficients,
)
from lightning_ortho.transforms.sopot import sopot_with_cost
from lightning_ortho.transforms.sparse_codes import keep_largest


def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def smooth_patches(count: int, seed: int = 0) -> torch.Tensor:
    """``(count, 64)`` mean-removed 8x8 patches of a smooth random field (cumulative sums of noise, plus edges)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(count, 8, 8, generator=g, dtype=torch.float64)
    field = noise.cumsum(1).cumsum(2) + 0.3 * torch.randn(count, 8, 8, generator=g, dtype=torch.float64)
    patches = field.reshape(count, 64)
    return patches - patches.mean(1, keepdim=True)


def dense_error(y: torch.Tensor, codes: torch.Tensor, d: torch.Tensor) -> float:
    return float((y - codes @ d.T).square().sum())


def counted_apply(blocks, x: torch.Tensor, bits: int) -> tuple[torch.Tensor, dict[str, int]]:
    """Apply a BlockProduct to one vector block by block as it would be run without multipliers: a coefficient
    +-1 is a signed copy, any other is the sum of its greedy SOPOT terms, each a shift (ldexp); summing ``k``
    parts costs ``k - 1`` additions. Counts every operation performed."""
    count = {"additions": 0, "shifts": 0, "multiplications": 0}
    y = x.clone()
    for (i, j), core in zip(blocks.pairs.tolist(), blocks.cores().tolist(), strict=True):
        outputs = []
        for row in core:
            parts = []
            for coefficient, source in zip(row, (y[i], y[j]), strict=True):
                if coefficient == 0:
                    continue
                if abs(coefficient) == 1:
                    parts.append(math.copysign(1.0, coefficient) * source)
                    continue
                expansion = sopot_with_cost(torch.tensor(coefficient, dtype=torch.float64), bits, tol=0.0)
                assert float(expansion.error) == 0.0, "a coefficient outside R_bits would need a multiplier"
                for sign, exponent in zip(expansion.signs.tolist(), expansion.exponents.tolist(), strict=True):
                    if sign:
                        parts.append(sign * torch.ldexp(source, torch.tensor(exponent)))
                        count["shifts"] += 1
            count["additions"] += max(len(parts) - 1, 0)
            outputs.append(sum(parts[1:], parts[0]) if parts else torch.zeros_like(y[i]))
        y[i], y[j] = outputs
    return y, count


# ------------------------------------------------------------------------------------------------ initial factors
def test_exact_lifting_dct_rows_are_scaled_permuted_dct_rows():
    t = factors_matrix(dct_lifting_1d(), 8)
    c = dct_rows(8)
    g = t @ c.T  # row k of t = d_k c[f_k]: one nonzero per row and column
    frequencies = g.abs().argmax(1)
    assert sorted(frequencies.tolist()) == list(range(8))
    scales = g[torch.arange(8), frequencies]
    torch.testing.assert_close(t, scales[:, None] * c[frequencies], rtol=0, atol=1e-12)
    assert bool((scales.abs() > 0.5).all())


@pytest.mark.parametrize(("bits", "extra", "cosine"), [(1, 0, 0.975), (2, 4, 0.996)])
def test_dyadic_lifting_dct_is_close_to_the_dct(bits, extra, cosine):
    factors = dyadic_dct_1d(bits, extra)
    for factor in factors:
        if factor[0] == "shear":
            expansion = sopot_with_cost(torch.tensor(factor[3], dtype=torch.float64), bits, tol=0.0)
            assert float(expansion.error) == 0.0  # dyadic, at most `bits` terms
    t = factors_matrix(factors, 8)
    rows = t / t.norm(dim=1, keepdim=True)
    c = dct_rows(8)
    frequencies = (factors_matrix(dct_lifting_1d(), 8) @ c.T).abs().argmax(1)
    agreement = (rows * c[frequencies]).sum(1).abs()
    # Each normalised row is within the rounding's angle of its DCT row (measured worst: 0.9777 with 1 term, 0.9968 with 2).
    assert float(agreement.min()) >= cosine
    gram = rows @ rows.T
    assert float((gram - torch.eye(8, dtype=torch.float64)).abs().max()) <= 2 * math.sqrt(1 - cosine**2) + 1e-12


def test_separable_2d_is_the_kronecker_product_and_its_block_product():
    one = dyadic_dct_1d(2, 4)
    t1 = factors_matrix(one, 8)
    factors = separable_2d(one)
    torch.testing.assert_close(factors_matrix(factors, 64), torch.kron(t1, t1), rtol=0, atol=1e-12)
    torch.testing.assert_close(factors_to_blocks(factors, 64).matrix(), torch.kron(t1, t1), rtol=0, atol=1e-12)
    d = factors_to_blocks(transposed(factors), 64).matrix()
    torch.testing.assert_close(d, torch.kron(t1, t1).T, rtol=0, atol=1e-12)


def test_dct_2d_factors_respect_the_budget():
    factors = dct_2d_factors(2, DCT_OPS)
    blocks = factors_to_blocks(factors, 64)
    ops = blocks.op_count(2)
    assert ops.multiplications == 0
    assert ops.additions + ops.shifts <= DCT_OPS
    assert ops.additions + ops.shifts == sum(factor_cost(f) for f in factors)
    one_term = factors_to_blocks(dct_2d_factors(1), 64).op_count(1)
    assert (one_term.additions, one_term.shifts) == (16 * 27, 16 * 9)
    with pytest.raises(ValueError, match="max_ops"):
        dct_2d_factors(2, 500)


def test_wht_factors_equal_the_hadamard_matrix_exactly():
    for n in (2, 8, 64):
        blocks = factors_to_blocks(wht_factors(n), n)
        assert torch.equal(blocks.matrix(), sylvester(n))
        assert blocks.op_count(1).additions == n * int(math.log2(n))
    with pytest.raises(ValueError, match="power of two"):
        wht_factors(12)


# ---------------------------------------------------------------------------------------------- exact updates
def test_entry_statistics_give_the_exact_error_change():
    g = torch.Generator().manual_seed(1)
    n = 8
    y = torch.randn(50, n, generator=g, dtype=torch.float64)
    x = keep_largest(torch.randn(50, n, generator=g, dtype=torch.float64), 3)
    factors = [*wht_factors(n)[:6], ("shear", 2, 5, 0.375), ("shear", 1, 1, 0.5), ("shear", 6, 0, -0.25)]
    for k in (6, 7, 8):
        before, after = factors[:k], factors[k + 1 :]
        p = factors_to_blocks(before, n).matrix() if before else torch.eye(n, dtype=torch.float64)
        a = factors_to_blocks(after, n).matrix() if after else torch.eye(n, dtype=torch.float64)
        m, a_norms, x_norms = entry_statistics(a, y.T @ x @ p.T, p @ x.T @ x @ p.T)
        base = dense_error(y, x, a @ p)
        for row, col, v in ((3, 4, 0.625), (0, 7, -1.5), (5, 5, -0.75)):
            s = torch.eye(n, dtype=torch.float64)
            s[row, col] += v
            predicted = -2 * v * m[row, col] + v**2 * a_norms[row] * x_norms[col]
            assert math.isclose(dense_error(y, x, a @ s @ p) - base, float(predicted), rel_tol=1e-9, abs_tol=1e-9)


def test_sweep_never_increases_the_error_for_its_codes_and_keeps_the_budget():
    y = smooth_patches(200)
    factors = transposed(dct_2d_factors(2, DCT_OPS))
    d = factors_to_blocks(factors, 64).matrix()
    codes = keep_largest(torch.linalg.solve(d, y.T).T, 4)
    before = dense_error(y, codes, d)
    new = fast_transform_sweep(y.T @ codes, codes.T @ codes, float(y.square().sum()), factors, 2, DCT_OPS)
    after = dense_error(y, codes, factors_to_blocks(new, 64).matrix())
    assert after <= before * (1 + 1e-12)
    assert after < 0.99 * before  # the data moved it
    assert sum(factor_cost(f) for f in new) <= DCT_OPS


@pytest.mark.parametrize("init", ["dct", "wht", "identity", "pca"])
def test_learned_transform_errors_never_increase_and_are_multiplication_free(init):
    y = smooth_patches(300, seed=2)
    result = learn_fast_transform(y, 4, init=init, bits=2, iterations=3)
    errors = [result.initial_error, *result.errors]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(errors, errors[1:], strict=False))
    d = result.transform.matrix()
    assert math.isclose(
        result.errors[-1], 100 * dense_error(y, result.codes, d) / float(y.square().sum()), rel_tol=1e-9
    )
    assert int((result.codes != 0).sum(1).max()) <= 4
    ops = result.op_count()
    assert ops.multiplications == 0
    assert ops.additions + ops.shifts <= result.budget
    x = torch.randn(5, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(result.transform(x), x @ d.T, rtol=1e-12, atol=1e-12)


def test_op_count_equals_the_operations_of_a_counted_apply():
    result = learn_fast_transform(smooth_patches(200, seed=4), 4, init="dct", bits=2, iterations=2)
    x = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    y, count = counted_apply(result.transform, x, 2)
    torch.testing.assert_close(y, result.transform.matrix() @ x, rtol=1e-12, atol=1e-12)
    ops = result.op_count()
    assert count == {"additions": ops.additions, "shifts": ops.shifts, "multiplications": 0}
    assert ops.multiplications == 0


def test_bad_arguments_raise_value_errors():
    y = smooth_patches(20)
    with pytest.raises(ValueError, match="init"):
        learn_fast_transform(y, 4, init="fft")
    with pytest.raises(ValueError, match="n = 64"):
        learn_fast_transform(y[:, :16], 4, init="dct")
    with pytest.raises(ValueError, match="power of two"):
        learn_fast_transform(y[:, :12], 4, init="wht")
    with pytest.raises(ValueError, match="bits"):
        learn_fast_transform(y, 4, bits=0)
    with pytest.raises(ValueError, match="s must be"):
        learn_fast_transform(y, 0)


# ------------------------------------------------------------------------------------------------- photographs
@pytest.mark.slow
def test_beats_the_dct_on_the_sample_photographs_at_its_cost():
    from benchmarks.reproduce_transforms import dct_matrix, load_patches, orthonormal_error

    y = load_patches(None)
    dct = dct_matrix()
    dct_error = orthonormal_error(y, torch.kron(dct, dct).T)
    result = learn_fast_transform(y, 4, init="dct", bits=2, iterations=10)
    ops = result.op_count()
    assert ops.multiplications == 0
    assert ops.additions + ops.shifts <= DCT_OPS
    assert result.errors[-1] < dct_error


def test_free_slots_leave_the_transform_and_its_cost_unchanged():
    factors = wht_factors(16)
    slotted = with_free_slots(factors, 5)
    assert len(slotted) == len(factors) + 5
    assert torch.equal(factors_to_blocks(slotted, 16).matrix(), sylvester(16))
    assert sum(factor_cost(f) for f in slotted) == sum(factor_cost(f) for f in factors)
    assert [f for f in slotted if f[0] == "butterfly"] == factors


def test_tied_coefficients_give_the_exact_error_change_of_a_tied_group():
    g = torch.Generator().manual_seed(6)
    n = 16
    y = torch.randn(60, n, generator=g, dtype=torch.float64)
    x = keep_largest(torch.randn(60, n, generator=g, dtype=torch.float64), 3)
    entries = ((1, 0), (5, 4), (9, 8), (13, 12))  # one 1-D shear on 4 disjoint lines
    before, after = wht_factors(n)[:10], wht_factors(n)[10:]
    p, a = factors_to_blocks(before, n).matrix(), factors_to_blocks(after, n).matrix()
    linear, curvature = tied_coefficients(a, y.T @ x @ p.T, p @ x.T @ x @ p.T, entries)
    base = dense_error(y, x, a @ p)
    for v in (0.375, -1.25):
        s = factors_to_blocks([("tied", entries, v)], n).matrix()
        expected = torch.eye(n, dtype=torch.float64)
        for i, j in entries:
            expected[i, j] = v
        torch.testing.assert_close(s, expected, rtol=0, atol=0)
        predicted = -2 * v * linear + v * v * curvature
        assert math.isclose(dense_error(y, x, a @ s @ p) - base, predicted, rel_tol=1e-9, abs_tol=1e-9)


def test_tied_dct_stays_separable_and_never_increases_the_error():
    y = smooth_patches(300, seed=7)
    result = learn_fast_transform(y, 4, init="dct", bits=2, iterations=3, tied=True, free_slots=0)
    errors = [result.initial_error, *result.errors]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < errors[0]
    d = result.transform.matrix()
    # separable: D = kron(D_c, D_r) (column and row transforms) iff the rearrangement
    # R[(i1, j1), (i2, j2)] = D[8 i1 + i2, 8 j1 + j2] has rank 1 (Van Loan & Pitsianis)
    rearranged = d.reshape(8, 8, 8, 8).permute(0, 2, 1, 3).reshape(64, 64)
    singular = torch.linalg.svdvals(rearranged)
    assert float(singular[1]) <= 1e-12 * float(singular[0])
    assert result.op_count().multiplications == 0
