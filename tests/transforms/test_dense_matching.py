"""The dense blossom algorithm returns NetworkX's maximum-weight perfect matching (ties included), and the M-transform
learner makes the same stages with it as with NetworkX (Rusu, arXiv 1812.03412, Algorithm 3)."""

import itertools

import networkx as nx
import numpy as np
import pytest
import torch

from lightning_ortho.transforms import m_dla
from lightning_ortho.transforms.dense_matching import max_weight_perfect_matching


def _networkx(weights: np.ndarray) -> list[tuple[int, int]]:
    """NetworkX on the complete graph, nodes and edges added in increasing order (what the learner did before)."""
    n = weights.shape[0]
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    rows = weights.tolist()
    for i in range(n):
        for j in range(i + 1, n):
            graph.add_edge(i, j, weight=rows[i][j])
    return sorted(tuple(sorted(edge)) for edge in nx.max_weight_matching(graph, maxcardinality=True))


def _weights(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "generic":
        w = rng.standard_normal((n, n))
    elif kind == "negative":  # every weight below zero: the duals start at 0
        w = -np.abs(rng.standard_normal((n, n)))
    elif kind == "small integers":  # many optimal matchings: the tie rule decides
        w = rng.integers(-3, 4, (n, n)).astype(float)
    else:  # two values only: blossoms everywhere
        w = 2.0 * rng.integers(0, 2, (n, n))
    w = np.triu(w, 1)
    return w + w.T


@pytest.mark.parametrize("kind", ["generic", "negative", "small integers", "two values"])
def test_the_matching_is_networkx_matching(kind: str) -> None:
    for seed, n in enumerate([2, 4, 6, 8, 10, 12, 16, 20, 30]):
        weights = _weights(kind, n, seed)
        assert max_weight_perfect_matching(weights) == _networkx(weights), (kind, n)


def test_the_matching_has_the_largest_weight_of_all_perfect_matchings() -> None:
    weights = _weights("generic", 8, 11)

    def matchings(left):
        if not left:
            yield []
            return
        first, rest = left[0], left[1:]
        for k, partner in enumerate(rest):
            for tail in matchings(rest[:k] + rest[k + 1 :]):
                yield [(first, partner), *tail]

    best = max(sum(weights[i, j] for i, j in m) for m in matchings(list(range(8))))
    found = max_weight_perfect_matching(weights)
    assert sorted(itertools.chain(*found)) == list(range(8))
    assert sum(weights[i, j] for i, j in found) == pytest.approx(best, rel=1e-12)


def test_bad_weights_raise() -> None:
    with pytest.raises(ValueError, match="n even"):
        max_weight_perfect_matching(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="n even"):
        max_weight_perfect_matching(np.zeros((4, 2)))
    bad = np.zeros((4, 4))
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        max_weight_perfect_matching(bad)


@pytest.mark.parametrize("sparse", [False, True], ids=["generic", "sparse codes"])
def test_learner_makes_networkx_stages(sparse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(2)
    y = torch.randn(48, 16, generator=g, dtype=torch.float64)
    if sparse:  # few distinct values: tied pair costs
        y = (y * (y.abs() > 1)).round()
    fast = m_dla.learn_m_transform(y, 4, 3, rounds=2)
    monkeypatch.setattr(m_dla, "max_weight_perfect_matching", _networkx)
    reference = m_dla.learn_m_transform(y, 4, 3, rounds=2)
    assert fast.transform.pairs.tolist() == reference.transform.pairs.tolist()
    assert fast.transform.core_index.tolist() == reference.transform.core_index.tolist()
    assert fast.errors == reference.errors and torch.equal(fast.codes, reference.codes)
