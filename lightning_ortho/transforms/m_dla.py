"""M_q-DLA (spec section 8, the paper's Algorithm 3): learn an M-transform by stage-wise perfect matchings.

An M-transform (eq. 15) is ``M = Mbar_q ... Mbar_1``, each stage ``Mbar_l`` a product of ``n/2`` binary blocks on
pairs that partition ``{0..n-1}``, every core in G1 (spec ``t = 1..8``, :mod:`binary_cores` index ``t - 1``).
It is returned as a :class:`~lightning_ortho.transforms.blocks.BinaryBlockProduct` with ``q n / 2`` blocks, stage
``l`` in rows ``l n/2 .. (l+1) n/2 - 1`` of ``pairs`` (stage 0 acts first).

Orientation. The paper has data ``Y`` ``(n, N)`` and codes ``X`` ``(n, N)`` with ``Y ~ D X``. Here data and codes
are batch-first, ``Yb = Y^T`` and ``Xb = X^T`` ``(N, n)``, so ``Yb ~ Xb D^T``. Then

* ``Z = Y X^T = Yb^T Xb`` ``(n, n)``, ``Z_ij = <column i of Yb, column j of Xb>`` (spec eq. 9);
* ``X_{l+1} = Mbar_l X_l`` becomes ``Xb_{l+1} = Xb_l Mbar_l^T``, i.e. ``stage.forward(Xb_l)``;
* the SVD ``Y = U S V^T`` gives ``U`` as the left singular vectors of ``Yb^T``, and the codes
  ``T_s(U^T Y)``, ``T_s(M^T Y)`` become ``T_s(Yb U)``, ``T_s(Yb M)`` (``T_s`` = :func:`keep_largest` per row);
* the error is ``100 ||Yb - Xb M^T||_F^2 / ||Yb||_F^2`` (:func:`representation_error` with ``D = M``).

One stage (eqs. 7, 8, 16), with later stages taken as the identity:
``||Y - Mbar X_l||_F^2 = ||Y||^2 + ||X_l||^2 - 2 tr Z + sum_k (C_{i_k j_k}^{(t_k)} + 2 tr Z)`` where
``C_ij^(t) = -2 tr Z + 2[(1 - g11) Z_ii + (1 - g22) Z_jj - g12 Z_ij - g21 Z_ji]`` for the core ``[[g11, g12],
[g21, g22]]``. So the best stage is the perfect matching of maximum total weight ``w_ij = -min_t C_ij^(t)``
(``t`` over G1), each pair with its argmin core; it is found exactly by the blossom algorithm
(``networkx.max_weight_matching(..., maxcardinality=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import torch

from lightning_ortho.transforms.binary_cores import G1_INDICES, binary_cores
from lightning_ortho.transforms.blocks import BinaryBlockProduct
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest, representation_error


@dataclass
class MTransformResult:
    """Output of :func:`learn_m_transform`.

    Attributes:
        transform: the learned ``M`` as a :class:`BinaryBlockProduct` with ``q n / 2`` G1 blocks, ``q`` stages of
            ``n / 2`` disjoint pairs (stage ``l`` in rows ``l n/2 .. (l+1) n/2 - 1``; stage 0 acts first).
        codes: ``(N, n)`` codes ``T_s(Y M)``, at most ``s`` nonzeros per row (``Y ~ codes @ M^T``).
        errors: the error in percent, ``100 ||Y - codes M^T||^2 / ||Y||^2``, after each round.
    """

    transform: BinaryBlockProduct
    codes: torch.Tensor
    errors: list[float] = field(default_factory=list)


def m_pair_costs(z: torch.Tensor) -> torch.Tensor:
    """All single-block costs ``C_ij^(t)`` of spec eq. (8) for the G1 cores: ``(n, n) -> (n, n, 8)``.

    ``C[i, j, t-1] = -2 tr Z + 2[(1 - g11) Z_ii + (1 - g22) Z_jj - g12 Z_ij - g21 Z_ji]`` with ``[[g11, g12],
    [g21, g22]]`` the G1 core of index ``t - 1``; then ``||Y - B_ij X||^2 = ||Y||^2 + ||X||^2 + C_ij^(t)``
    (eq. 7) with ``Z = Yb^T Xb`` for batch-first ``Yb, Xb`` ``(N, n)``. Entries with ``i == j`` are meaningless.

    Raises:
        ValueError: ``z`` is not a square 2-d floating-point tensor.
    """
    if z.dim() != 2 or z.shape[0] != z.shape[1] or not z.is_floating_point():
        raise ValueError(f"m_pair_costs: Z must be a square (n, n) floating tensor, got {tuple(z.shape)} {z.dtype}.")
    g = binary_cores(z.dtype, z.device)[list(G1_INDICES)]  # (8, 2, 2)
    diag = z.diagonal()
    zii, zjj = diag[:, None, None], diag[None, :, None]
    zij, zji = z[:, :, None], z.T[:, :, None]
    inner = (1 - g[:, 0, 0]) * zii + (1 - g[:, 1, 1]) * zjj - g[:, 0, 1] * zij - g[:, 1, 0] * zji
    return -2 * diag.sum() + 2 * inner


def learn_m_stage(data: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One M-transform stage: the perfect matching and G1 cores minimising ``||Yb - Xb Mbar^T||_F^2`` (eq. 16).

    Args:
        data: ``Yb`` ``(N, n)``, ``n`` even.
        codes: ``Xb`` ``(N, n)`` (the current stage's input ``X_l``, batch-first).

    Returns:
        ``pairs`` ``(n/2, 2)`` ``int64`` with ``i < j``, sorted by ``i``, partitioning ``{0..n-1}``, and
        ``core_index`` ``(n/2,)`` ``int64`` in ``0..7`` (the argmin G1 core of each pair, first on ties).

    Raises:
        ValueError: shapes differ or ``n`` is odd (no perfect matching).
    """
    if data.shape != codes.shape or data.dim() != 2:
        raise ValueError(
            f"learn_m_stage: data and codes must both be (N, n), got {tuple(data.shape)}, {tuple(codes.shape)}."
        )
    n = data.shape[1]
    if n % 2:
        raise ValueError(f"learn_m_stage: n must be even for a perfect matching, got n = {n}.")
    z = data.T @ codes  # Z = Y X^T in the paper's orientation
    costs = m_pair_costs(z).double().cpu()
    best, argbest = costs.min(dim=2)
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    best_list = best.tolist()
    for i in range(n):
        for j in range(i + 1, n):
            graph.add_edge(i, j, weight=-best_list[i][j])
    matching = nx.max_weight_matching(graph, maxcardinality=True)
    pairs = sorted(tuple(sorted(edge)) for edge in matching)
    if len(pairs) != n // 2:  # pragma: no cover - the complete graph on an even number of nodes
        raise AssertionError("learn_m_stage: the matching is not perfect")
    pair_tensor = torch.tensor(pairs, dtype=torch.int64).view(-1, 2)
    core_index = torch.tensor([G1_INDICES[int(argbest[i, j])] for i, j in pairs], dtype=torch.int64)
    return pair_tensor, core_index


def _check_inputs(data: object, q: object, s: object, rounds: object, generator: object) -> None:
    where = "learn_m_transform"
    check_training_data(data, s, where, even=True)
    for name, value in (("q", q), ("rounds", rounds)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}.")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"{where}: generator must be a torch.Generator or None, got {type(generator).__name__}.")


def learn_m_transform(
    Y: torch.Tensor,  # noqa: N803 - the paper's name
    q: int,
    s: int,
    *,
    rounds: int = 1,
    generator: torch.Generator | None = None,
) -> MTransformResult:
    """M_q-DLA (spec section 8): learn ``M = Mbar_q ... Mbar_1`` and ``s``-sparse codes with ``Y ~ X M^T``.

    Steps (batch-first, see the module docstring for the orientation):

    1. ``X <- T_s(Y U)``, ``U`` the left singular vectors of ``Y^T`` (the paper's SVD initialisation).
    2. For ``l = 1..q``: ``Z = Y^T X_l`` with ``X_1 = X``; ``Mbar_l`` = maximum-weight perfect matching of
       ``w_ij = -min_{t in G1} C_ij^(t)`` with argmin cores (:func:`learn_m_stage`); ``X_{l+1} = X_l Mbar_l^T``.
    3. ``X <- T_s(Y M)``, record ``100 ||Y - X M^T||^2 / ||Y||^2``.

    ``rounds > 1`` repeats steps 2-3, each round rebuilding every stage from scratch from the new ``X`` (the
    author's outer loop; the paper uses one round). Later rounds are not guaranteed to lower the error.

    Args:
        Y: data ``(N, n)``, floating point, finite, not all zero, ``n`` even (odd ``n`` has no perfect matching).
        q: number of stages, int ``>= 1``.
        s: nonzeros per code row, int in ``[1, n]``.
        rounds: outer rounds, int ``>= 1``.
        generator: accepted for API symmetry with the other learners; unused (the algorithm is deterministic:
            SVD initialisation and exact matchings, ties broken by the lowest core index).

    Returns:
        :class:`MTransformResult` (transform in ``Y``'s dtype, codes ``(N, n)``, one error per round).

    Raises:
        ValueError: ``Y`` not a 2-d finite nonzero floating tensor, ``n`` odd or ``< 2``, ``q``/``rounds`` not
            ints ``>= 1``, ``s`` not an int in ``[1, n]``, or ``generator`` neither ``None`` nor a Generator.
    """
    _check_inputs(Y, q, s, rounds, generator)
    data = Y.detach()
    count, n = data.shape
    u = torch.linalg.svd(data.T, full_matrices=count < n).U  # (n, n): Y = U S V^T in the paper's orientation
    codes = keep_largest(data @ u, s)
    errors: list[float] = []
    transform = None
    for _ in range(rounds):
        all_pairs, all_cores = [], []
        stage_input = codes
        for _stage in range(q):
            pairs, core_index = learn_m_stage(data, stage_input)
            stage = BinaryBlockProduct(n, pairs, core_index, dtype=data.dtype).to(data.device)
            stage_input = stage(stage_input)  # X_{l+1} = Mbar_l X_l
            all_pairs.append(pairs)
            all_cores.append(core_index)
        transform = BinaryBlockProduct(n, torch.cat(all_pairs), torch.cat(all_cores), dtype=data.dtype)
        transform = transform.to(data.device)
        dictionary = transform.matrix()
        codes = keep_largest(data @ dictionary, s)
        errors.append(float(representation_error(data, codes, dictionary)))
    assert transform is not None
    return MTransformResult(transform=transform, codes=codes, errors=errors)
