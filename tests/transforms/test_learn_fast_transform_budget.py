"""learn_fast_transform's default budget is the fast DCT's operation count at the data's n (704 at n = 64, as
before), an n with no such count must give one, and a learned transform dearer than the dense n x n matrix product
is announced with both counts."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.learn_fast_transform import (
    DCT_OPS,
    dense_op_count,
    fast_dct_op_count,
    learn_fast_transform,
)
from tests.transforms.test_learn_fast_transform import counted_apply, smooth_patches


def data(n: int, count: int = 200, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def dearer_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "than the" in str(w.message) and "dense" in str(w.message)]


def test_the_counts_are_the_llm_dct_ones_and_the_dense_products():
    # 8x8 patches: 16 8-point LLM DCTs (29 additions + 11 multiplications each) + one 3-bit shift per coefficient
    assert fast_dct_op_count(64) == OpCount(additions=16 * 29, multiplications=16 * 11, shifts=64)
    assert DCT_OPS == 704 == fast_dct_op_count(64).total
    # a line of 8: one LLM DCT + the 1/sqrt(8) of each output, a multiplication (not a power of two)
    assert fast_dct_op_count(8) == OpCount(additions=29, multiplications=11 + 8)
    assert fast_dct_op_count(16) is None and fast_dct_op_count(12) is None
    for n in (8, 16, 64):  # n outputs of n products each, summed by n - 1 additions
        assert dense_op_count(n) == OpCount(additions=n * (n - 1), multiplications=n * n)
    assert dense_op_count(8).total == 120


@pytest.mark.parametrize("init", ["dct", "identity"])
def test_at_n_64_the_default_budget_is_still_704(init):
    y = smooth_patches(150, seed=1)
    default = learn_fast_transform(y, 4, init=init, bits=2, iterations=1)
    given = learn_fast_transform(y, 4, init=init, bits=2, iterations=1, max_ops=704)
    assert default.budget == given.budget == 704
    assert torch.equal(default.transform.matrix(), given.transform.matrix())
    assert default.op_count().total <= 704


@pytest.mark.parametrize("init", ["identity", "pca", "wht"])
def test_at_n_8_the_default_budget_is_the_8_point_dct_not_dearer_than_dense(init):
    y = data(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = learn_fast_transform(y, 2, init=init, iterations=2)
    assert result.budget == fast_dct_op_count(8).total == 48
    # the operations of one vector counted as it is applied (no multiplier), independently of op_count
    x = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    applied, count = counted_apply(result.transform, x, result.bits)
    torch.testing.assert_close(applied, result.transform.matrix() @ x, rtol=1e-12, atol=1e-12)
    assert count["multiplications"] == 0 and count["additions"] + count["shifts"] <= 48 < 120
    assert not dearer_warnings(caught)


def test_a_transform_dearer_than_the_dense_matrix_warns_with_both_counts():
    y = data(8)
    with pytest.warns(UserWarning, match="more than the 120 of the dense 8x8 matrix") as caught:
        result = learn_fast_transform(y, 2, init="identity", iterations=1, max_ops=704)
    ops = result.op_count()
    assert ops.total > 120
    (message,) = dearer_warnings(caught)
    assert f"costs {ops.total} operations ({ops.additions} additions + {ops.shifts} shifts)" in message
    assert "64 multiplications + 56 additions" in message and "max_ops below 120" in message


def test_an_n_without_a_fast_dct_count_must_give_max_ops():
    y = data(16)
    with pytest.raises(ValueError, match=r"got n = 16: give max_ops.*below the 496 of the dense 16x16 matrix"):
        learn_fast_transform(y, 2, init="identity", iterations=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = learn_fast_transform(y, 2, init="wht", iterations=1, max_ops=96)
    assert result.budget == 96 and result.op_count().total <= 96 and not dearer_warnings(caught)
