"""O-transforms: integer products of unnormalised binary blocks, their costs and the exact one-block change."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.transforms.binary_cores import binary_cores
from lightning_ortho.transforms.blocks import embed_block
from lightning_ortho.transforms.unnormalised import o_block_change, o_cores, o_transform

DT = torch.float64


def test_cores_are_sqrt2_g1_with_exact_unit_entries() -> None:
    cores = o_cores(range(8))
    torch.testing.assert_close(cores, 2**0.5 * binary_cores(DT)[:8], rtol=0, atol=1e-15)
    assert set(cores.abs().flatten().tolist()) == {1.0}
    for core in cores:
        torch.testing.assert_close(core.T @ core, 2 * torch.eye(2, dtype=DT), rtol=0, atol=0)


def test_product_is_an_integer_matrix_with_det_power_of_two_and_costs_two_additions_a_block() -> None:
    g = torch.Generator().manual_seed(0)
    n, m = 6, 9
    pairs = [tuple(torch.randperm(n, generator=g)[:2].tolist()) for _ in range(m)]
    index = torch.randint(0, 8, (m,), generator=g)
    transform = o_transform(n, pairs, index)
    dense = torch.eye(n, dtype=DT)
    for (i, j), k in zip(pairs, index.tolist(), strict=True):
        dense = embed_block(n, i, j, o_cores([k])[0]) @ dense
    torch.testing.assert_close(transform.matrix(), dense, rtol=0, atol=0)
    assert bool((dense == dense.round()).all())
    assert abs(float(torch.linalg.det(dense))) == pytest.approx(2.0**m)
    count = transform.op_count()
    assert (count.additions, count.multiplications, count.shifts) == (2 * m, 0, 0)
    x = torch.randn(5, n, generator=g, dtype=DT)
    torch.testing.assert_close(transform.inverse()(transform(x)), x, rtol=1e-12, atol=1e-12)


def test_one_block_change_equals_the_dense_difference() -> None:
    g = torch.Generator().manual_seed(1)
    y = torch.randn(40, 5, generator=g, dtype=DT)
    x = torch.randn(40, 5, generator=g, dtype=DT)
    z, energy = y.T @ x, x.square().sum(0)
    for i, j in ((0, 3), (4, 1)):
        for k in range(8):
            core = o_cores([k])[0]
            block = embed_block(5, i, j, core)
            expected = (y - x @ block.T).square().sum() - (y - x).square().sum()
            assert float(o_block_change(z, energy, i, j, core)) == pytest.approx(float(expected), rel=1e-12)


def test_non_g1_cores_are_refused() -> None:
    with pytest.raises(ValueError, match="G1 indices 0..7"):
        o_cores([8])
