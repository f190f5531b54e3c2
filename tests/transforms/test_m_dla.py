"""M_q-DLA (Rusu, Algorithm 3): stage costs (eqs. 7-8) against brute force, optimal matchings, structure, costs."""

import itertools

import pytest
import torch

from lightning_ortho.transforms import BinaryBlockProduct, OpCount, binary_cores
from lightning_ortho.transforms.binary_cores import G1_INDICES
from lightning_ortho.transforms.blocks import embed_block
from lightning_ortho.transforms.m_dla import MTransformResult, learn_m_stage, learn_m_transform, m_pair_costs
from lightning_ortho.transforms.sparse_codes import keep_largest, representation_error
from lightning_ortho.transforms.statistics import principal_basis

DT = torch.float64


def perfect_matchings(items: list[int]) -> list[list[tuple[int, int]]]:
    """All perfect matchings of ``items`` (15 for 6 items)."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for k, partner in enumerate(rest):
        for tail in perfect_matchings(rest[:k] + rest[k + 1 :]):
            out.append([(first, partner), *tail])
    return out


def stage_error(y: torch.Tensor, x: torch.Tensor, pairs, cores) -> float:
    """Direct ``||Y - X Mbar^T||^2`` with the dense stage matrix."""
    stage = BinaryBlockProduct(y.shape[1], pairs, cores, dtype=DT).matrix()
    return float((y - x @ stage.T).square().sum())


def brute_force_best(y: torch.Tensor, x: torch.Tensor) -> float:
    """Minimum of ``||Y - X Mbar^T||^2`` over all perfect matchings x all G1 core choices (batched)."""
    n = y.shape[1]
    g1 = binary_cores(DT)[list(G1_INDICES)]
    best = float("inf")
    for matching in perfect_matchings(list(range(n))):
        matrices = []
        for choice in itertools.product(range(8), repeat=len(matching)):
            m = torch.zeros(n, n, dtype=DT)
            for (i, j), t in zip(matching, choice, strict=True):
                idx = torch.tensor([i, j])
                m[idx[:, None], idx[None, :]] = g1[t]
            matrices.append(m)
        stack = torch.stack(matrices)  # (8^(n/2), n, n)
        errors = (y[None] - x[None] @ stack.mT).square().sum(dim=(1, 2))
        best = min(best, float(errors.min()))
    return best


def data(n: int = 6, count: int = 100, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, n, generator=g, dtype=DT) * torch.linspace(2, 0.5, n, dtype=DT)


# ------------------------------------------------------------------------------------ eqs. (7)-(8) by brute force
def test_pair_costs_match_direct_single_block_errors():
    g = torch.Generator().manual_seed(1)
    n = 5
    y = torch.randn(40, n, generator=g, dtype=DT)
    x = torch.randn(40, n, generator=g, dtype=DT)
    z = y.T @ x  # Z = Y X^T in the paper's orientation
    costs = m_pair_costs(z)
    assert costs.shape == (n, n, 8)
    base = float(y.square().sum() + x.square().sum())
    cores = binary_cores(DT)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            for t in range(8):
                block = embed_block(n, i, j, cores[G1_INDICES[t]])
                direct = float((y - x @ block.T).square().sum())
                assert direct == pytest.approx(base + float(costs[i, j, t]), rel=1e-12, abs=1e-10)


def test_stage_objective_is_sum_of_pair_costs():
    """||Y - Mbar X||^2 = ||Y||^2 + ||X||^2 - 2 tr Z + sum_k (C_k + 2 tr Z) for a perfect-matching stage."""
    g = torch.Generator().manual_seed(2)
    n = 8
    y = torch.randn(60, n, generator=g, dtype=DT)
    x = torch.randn(60, n, generator=g, dtype=DT)
    z = y.T @ x
    costs = m_pair_costs(z)
    trace = float(z.trace())
    pairs = torch.randperm(n, generator=g).view(-1, 2)
    cores = torch.randint(0, 8, (n // 2,), generator=g)
    predicted = float(y.square().sum() + x.square().sum()) - 2 * trace
    predicted += sum(
        float(costs[i, j, t]) + 2 * trace for (i, j), t in zip(pairs.tolist(), cores.tolist(), strict=True)
    )
    assert stage_error(y, x, pairs, cores) == pytest.approx(predicted, rel=1e-12)


def test_stage_recovers_a_known_stage_orientation():
    """Y = X Mbar^T exactly: the best stage is Mbar itself (error 0); a transposed Z would pick transposed cores."""
    g = torch.Generator().manual_seed(3)
    n = 8
    x = torch.randn(100, n, generator=g, dtype=DT)
    pairs = torch.randperm(n, generator=g).view(-1, 2)
    cores = torch.tensor([0, 1, 2, 5])  # includes rotations, whose transposes are different cores
    y = BinaryBlockProduct(n, pairs, cores, dtype=DT)(x)
    found_pairs, found_cores = learn_m_stage(y, x)
    assert stage_error(y, x, found_pairs, found_cores) < 1e-20
    expected = {tuple(sorted(p)): None for p in pairs.tolist()}
    assert {tuple(p) for p in found_pairs.tolist()} == set(expected)


# ------------------------------------------------------------------------------------------ optimal matchings
def test_stage_matching_is_optimal_by_brute_force_random_codes():
    g = torch.Generator().manual_seed(4)
    y = torch.randn(100, 6, generator=g, dtype=DT)
    x = keep_largest(torch.randn(100, 6, generator=g, dtype=DT), 3)
    pairs, cores = learn_m_stage(y, x)
    assert stage_error(y, x, pairs, cores) == pytest.approx(brute_force_best(y, x), rel=1e-12)


def test_every_learned_stage_is_optimal_given_its_input():
    y = data(6, 100, seed=5)
    q, s = 2, 2
    result = learn_m_transform(y, q, s)
    basis = principal_basis(y.T @ y)
    # step 1 (X = T_s(U^T Y), batch-first); U is the SVD's U up to column signs
    u = torch.linalg.svd(y.T, full_matrices=False).U
    torch.testing.assert_close((basis.T @ u).abs(), torch.eye(6, dtype=DT), atol=1e-10, rtol=0)
    x = keep_largest(y @ basis, s)
    half = 3
    for stage_index in range(q):
        rows = slice(stage_index * half, (stage_index + 1) * half)
        pairs = result.transform.pairs[rows]
        cores = result.transform.core_index[rows]
        chosen = stage_error(y, x, pairs, cores)
        assert chosen == pytest.approx(brute_force_best(y, x), rel=1e-12)
        x = BinaryBlockProduct(6, pairs, cores, dtype=DT)(x)  # X_{l+1} = Mbar_l X_l


# ------------------------------------------------------------------------------------------------ structure
@pytest.mark.parametrize(("n", "q", "s", "rounds"), [(4, 1, 1, 1), (6, 2, 2, 2), (8, 3, 3, 3)])
def test_result_structure(n, q, s, rounds):
    y = data(n, 100, seed=n)
    result = learn_m_transform(y, q, s, rounds=rounds)
    assert isinstance(result, MTransformResult)
    transform = result.transform
    assert isinstance(transform, BinaryBlockProduct)
    assert transform.num_blocks == q * n // 2
    assert all(k in G1_INDICES for k in transform.core_index.tolist())
    for stage in range(q):
        stage_pairs = transform.pairs[stage * n // 2 : (stage + 1) * n // 2]
        assert sorted(stage_pairs.flatten().tolist()) == list(range(n))
    d = transform.matrix()
    torch.testing.assert_close(d.T @ d, torch.eye(n, dtype=DT), atol=1e-12, rtol=0)
    codes = result.codes
    assert codes.shape == (100, n)
    assert int((codes != 0).sum(dim=1).max()) <= s
    torch.testing.assert_close(codes, keep_largest(y @ d, s), atol=1e-12, rtol=0)
    assert len(result.errors) == rounds
    assert result.errors[-1] == pytest.approx(float(representation_error(y, codes, d)), rel=1e-12)
    assert 0 <= result.errors[-1] <= 100


def test_deterministic_and_rounds_extend_the_first_round():
    y = data(8, 100, seed=9)
    one = learn_m_transform(y, 2, 2)
    again = learn_m_transform(y, 2, 2, generator=torch.Generator().manual_seed(123))
    more = learn_m_transform(y, 2, 2, rounds=4)
    assert one.errors == again.errors
    assert torch.equal(one.transform.pairs, again.transform.pairs)
    assert more.errors[0] == one.errors[0]


# -------------------------------------------------------------------------------------------------- op counts
@pytest.mark.parametrize(("n", "q"), [(4, 1), (6, 2), (8, 3), (8, 4)])
def test_op_count_matches_paper(n, q):
    """Mx takes nq additions and n multiplications (shifts when q is even), Rusu Algorithm 3."""
    result = learn_m_transform(data(n, 100, seed=q), q, 2)
    deferred = result.transform.op_count(defer_scaling=True)
    if q % 2:
        assert deferred == OpCount(additions=n * q, multiplications=n)
    else:
        assert deferred == OpCount(additions=n * q, shifts=n)
    assert result.transform.op_count() == OpCount(additions=n * q, multiplications=n * q)


# ------------------------------------------------------------------------------------------- known M recovery
@pytest.mark.parametrize("q", [1, 2])
def test_recovers_data_from_a_known_m_transform(q):
    """Y = X0 M0^T with s-sparse X0 of distinct scales per coordinate: errors seen ~1e-29 %."""
    g = torch.Generator().manual_seed(0)
    n, s = 8, 2
    pairs = torch.cat([torch.randperm(n, generator=g).view(-1, 2) for _ in range(q)])
    cores = torch.randint(0, 8, (q * n // 2,), generator=g)
    m0 = BinaryBlockProduct(n, pairs, cores, dtype=DT).matrix()
    x0 = keep_largest(torch.randn(200, n, generator=g, dtype=DT) * torch.linspace(3, 1, n, dtype=DT), s)
    y = x0 @ m0.T
    result = learn_m_transform(y, q, s)
    assert result.errors[0] < 1e-10
    # a generic start (unstructured data) stays far from zero, so the bound above is informative
    assert learn_m_transform(data(n, 200, seed=1), q, s).errors[0] > 1.0


# ------------------------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((torch.ones(10, 4, dtype=torch.int64), 1, 1), {}, "floating-point"),
        ((torch.ones(10, 4, 2, dtype=DT), 1, 1), {}, "2-d"),
        ((torch.ones(10, 5, dtype=DT), 1, 1), {}, "even"),
        ((torch.ones(0, 4, dtype=DT), 1, 1), {}, "at least one sample"),
        ((torch.full((10, 4), float("nan"), dtype=DT), 1, 1), {}, "NaN"),
        ((torch.zeros(10, 4, dtype=DT), 1, 1), {}, "all zero"),
        ((torch.ones(10, 4, dtype=DT), 0, 1), {}, "q must"),
        ((torch.ones(10, 4, dtype=DT), 1.0, 1), {}, "q must"),
        ((torch.ones(10, 4, dtype=DT), 1, 0), {}, "s must"),
        ((torch.ones(10, 4, dtype=DT), 1, 5), {}, "s must"),
        ((torch.ones(10, 4, dtype=DT), 1, 1), {"rounds": 0}, "rounds must"),
        ((torch.ones(10, 4, dtype=DT), 1, 1), {"generator": 3}, "generator"),
    ],
)
def test_bad_inputs_raise(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        learn_m_transform(*args, **kwargs)


def test_stage_rejects_odd_n_and_mismatched_shapes():
    with pytest.raises(ValueError, match="even"):
        learn_m_stage(torch.ones(3, 5, dtype=DT), torch.ones(3, 5, dtype=DT))
    with pytest.raises(ValueError, match="both be"):
        learn_m_stage(torch.ones(3, 4, dtype=DT), torch.ones(3, 6, dtype=DT))
    with pytest.raises(ValueError, match="square"):
        m_pair_costs(torch.ones(3, 4, dtype=DT))
