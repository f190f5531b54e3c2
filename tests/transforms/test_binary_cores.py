"""The 16 binary cores G1 u G2 of Rusu's B-transforms: the octagon group, its inverse table and the operation counts."""

import math

import torch

from lightning_ortho.transforms import OpCount, binary_cores
from lightning_ortho.transforms.binary_cores import (
    BINARY_CORE_COSTS,
    CORE_INVERSE,
    CORE_PRODUCT_TABLE,
    G1_INDICES,
    G2_INDICES,
    IDENTITY_INDEX,
    SELF_INVERSE_INDICES,
    SWAP_INDEX,
    binary_core_cost,
)

# (det, rotation angle in degrees or None for a reflection), spec table, t = index + 1
SPEC = [(-1, None), (1, -45), (1, 45), (-1, None), (-1, None), (1, 135), (1, -135), (-1, None),
        (1, -90), (1, 90), (-1, None), (-1, None), (-1, None), (-1, None), (1, 180), (1, 0)]  # fmt: skip


def test_shape_orthonormal_distinct():
    cores = binary_cores()
    assert cores.shape == (16, 2, 2) and cores.dtype == torch.float64
    eye = torch.eye(2, dtype=torch.float64)
    assert torch.allclose(cores.mT @ cores, eye.expand(16, 2, 2), atol=1e-15, rtol=0)
    assert len({tuple(c.flatten().tolist()) for c in cores}) == 16
    assert torch.equal(cores[IDENTITY_INDEX], eye)
    assert torch.equal(cores[SWAP_INDEX], torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64))


def test_determinants_and_rotation_angles_match_spec_table():
    cores = binary_cores()
    for k, (det, angle) in enumerate(SPEC):
        assert round(float(torch.linalg.det(cores[k]))) == det, k
        if angle is not None:  # [[cos, -sin], [sin, cos]]
            measured = math.degrees(math.atan2(float(cores[k, 1, 0]), float(cores[k, 0, 0])))
            assert abs((measured - angle + 180) % 360 - 180) < 1e-9, (k, measured, angle)


def test_g1_scaled_and_g2_signed_permutations():
    cores = binary_cores()
    r = 1 / math.sqrt(2)
    assert torch.allclose(
        cores[list(G1_INDICES)].abs(), torch.full((8, 2, 2), r, dtype=torch.float64), atol=1e-16, rtol=0
    )
    g2 = cores[list(G2_INDICES)]
    assert bool(((g2 == 0) | (g2.abs() == 1)).all()) and bool(((g2 != 0).sum(-1) == 1).all())


def test_product_table_is_the_group_law():
    cores = binary_cores()
    for a in range(16):
        for b in range(16):
            assert torch.allclose(cores[a] @ cores[b], cores[CORE_PRODUCT_TABLE[a, b]], atol=1e-15, rtol=0)
    # a group: every row and column of the Cayley table is a permutation, identity is neutral
    assert all(sorted(row.tolist()) == list(range(16)) for row in CORE_PRODUCT_TABLE)
    assert all(sorted(col.tolist()) == list(range(16)) for col in CORE_PRODUCT_TABLE.T)
    assert CORE_PRODUCT_TABLE[IDENTITY_INDEX].tolist() == list(range(16))


def test_subgroup_structure():
    g1, g2 = set(G1_INDICES), set(G2_INDICES)
    assert {int(CORE_PRODUCT_TABLE[a, b]) for a in g2 for b in g2} == g2
    assert {int(CORE_PRODUCT_TABLE[a, b]) for a in g2 for b in g1} == g1
    assert {int(CORE_PRODUCT_TABLE[a, b]) for a in g1 for b in g1} == g2


def test_inverse_table_and_self_inverse_cores():
    cores = binary_cores()
    eye = torch.eye(2, dtype=torch.float64)
    for k in range(16):
        assert torch.allclose(cores[CORE_INVERSE[k]] @ cores[k], eye, atol=1e-15, rtol=0)
        assert CORE_PRODUCT_TABLE[CORE_INVERSE[k], k] == IDENTITY_INDEX
    reflections = {k for k, (det, _) in enumerate(SPEC) if det == -1}
    assert set(SELF_INVERSE_INDICES) == reflections | {14, 15}  # reflections, -I and I


def test_costs():
    for k in G1_INDICES:
        assert BINARY_CORE_COSTS[k] == binary_core_cost(k) == OpCount(additions=2, multiplications=2)
    for k in G2_INDICES:
        assert BINARY_CORE_COSTS[k] == OpCount()


def test_dtype_and_errors():
    assert binary_cores(torch.float32).dtype == torch.float32
    try:
        binary_cores(torch.int64)
    except TypeError as error:
        assert "floating" in str(error)
    else:
        raise AssertionError("integer dtype accepted")
    for bad in (16, -1, 1.0):
        try:
            binary_core_cost(bad)
        except IndexError:
            pass
        else:
            raise AssertionError(bad)
