"""The incremental cost table of B_m-DLA equals the full recomputation after every placement, and the learner makes
the same choices with it as with a full scan of every pair at every pick (eq. 10 of Rusu, arXiv 1812.03412)."""

import pytest
import torch

from lightning_ortho.transforms import b_dla
from lightning_ortho.transforms.b_dla import NARROW_CANDIDATES, WIDE_CANDIDATES, best_block, block_costs
from lightning_ortho.transforms.binary_cores import binary_cores
from lightning_ortho.transforms.block_cost_table import BlockCostTable

NARROW = torch.tensor(NARROW_CANDIDATES)
WIDE = torch.tensor(WIDE_CANDIDATES)


def _z(kind: str, n: int, seed: int) -> torch.Tensor:
    """``Z`` ``(n, n)`` float64: generic, with zero rows and columns (a principal direction never in a code: many
    exactly equal costs), or small integers (ties everywhere)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "integers":
        return torch.randint(-2, 3, (n, n), generator=g).double()
    z = torch.randn(n, n, generator=g, dtype=torch.float64)
    if kind == "zero columns":
        z[:, n // 2 :] = 0
        z[n // 3 :, :] = 0
    return z


def _full_minimum(z: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """``min_t A_ij^(t)`` of every pair from block_costs (the independent full recomputation), ``+inf`` off pairs."""
    costs, pairs = block_costs(z, candidates)
    expected = torch.full_like(z, float("inf"))
    expected[pairs[:, 0], pairs[:, 1]] = (costs.amin(dim=1) + 2 * torch.diagonal(z).sum()) / 2
    return expected


@pytest.mark.parametrize("kind", ["generic", "zero columns", "integers"])
@pytest.mark.parametrize("candidates", [NARROW, WIDE], ids=["G1", "wide"])
def test_table_equals_the_full_recomputation_after_every_placement(kind: str, candidates: torch.Tensor) -> None:
    n = 9
    z = _z(kind, n, 3)
    cores = binary_cores()
    table = BlockCostTable(z, candidates)
    for step in range(25):
        i, j, k, cost = table.choose()
        assert (i, j, k, cost) == best_block(z, candidates), step  # same pick, same cost, bit for bit
        table_best = table.best.clone()
        full = _full_minimum(z, candidates)
        finite = torch.isfinite(full)
        assert torch.equal(torch.isfinite(table_best), finite)
        torch.testing.assert_close(table_best[finite], full[finite], rtol=1e-12, atol=1e-12)
        assert torch.equal(table.row_min, table_best.min(dim=1).values)
        # place the block (greedy init: Z <- Z B^T), every third step also peel one (sweep: Z <- B Z)
        z[:, [i, j]] = z[:, [i, j]] @ cores[k].T
        table.touch(i, j)
        if step % 3 == 2:
            a, b = (step % n, (step * 5 + 1) % n)
            if a != b:
                z[[a, b], :] = cores[step % 16] @ z[[a, b], :]
                table.touch(a, b)


def _learn(y: torch.Tensor, m: int, s: int, monkeypatch: pytest.MonkeyPatch, rescan: bool, **kwargs):
    if rescan:  # every pick by a full scan of every pair, the reference
        monkeypatch.setattr(b_dla, "_choose", lambda z, candidates, table: best_block(z, candidates))
    result = b_dla.learn_b_transform(y, m, s, **kwargs)
    monkeypatch.undo()
    return result


@pytest.mark.parametrize("kind", ["generic", "repeated rows"])
def test_learner_makes_the_choices_of_the_full_scan(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(5)
    y = torch.randn(40, 12, generator=g, dtype=torch.float64)
    if kind == "repeated rows":  # rank 4 and repeated samples: many exactly tied costs
        y = (y[:4].repeat(10, 1) * 3).round()
    # tol=0.1 makes the sweeps converge and widen the candidates within the 12 sweeps
    fast = _learn(y, 30, 3, monkeypatch, rescan=False, iterations=12, tol=0.1)
    reference = _learn(y, 30, 3, monkeypatch, rescan=True, iterations=12, tol=0.1)
    assert fast.transform.pairs.tolist() == reference.transform.pairs.tolist()
    assert fast.transform.core_index.tolist() == reference.transform.core_index.tolist()
    assert fast.errors == reference.errors and fast.initial_error == reference.initial_error
    assert fast.candidates_widened_at == reference.candidates_widened_at
    assert torch.equal(fast.codes, reference.codes)


@pytest.mark.parametrize("kind", ["generic", "zero columns", "integers"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_greedy_init_and_sweep_rescan_switch_gives_the_same_blocks(kind: str, dtype: torch.dtype) -> None:
    z = _z(kind, 10, 7).to(dtype)
    for candidates in (NARROW, WIDE):
        pairs, index = b_dla.greedy_init(z, 20, candidates)
        assert (pairs, index) == b_dla.greedy_init(z, 20, candidates, rescan=True)
        swept = (list(pairs), list(index))
        reference = (list(pairs), list(index))
        b_dla.sweep(z, *swept, candidates)
        b_dla.sweep(z, *reference, candidates, rescan=True)
        assert swept == reference
