"""M_q-DLA (Rusu, Algorithm 3): learn an M-transform by stage-wise perfect matchings.

An M-transform (eq. 15) is ``M = Mbar_q ... Mbar_1``, each stage ``Mbar_l`` a product of ``n/2`` binary blocks on
pairs that partition ``{0..n-1}``, every core in G1 (types ``t = 1..8``, :mod:`binary_cores` index ``t - 1``).
It is returned as a :class:`~lightning_ortho.transforms.blocks.BinaryBlockProduct` with ``q n / 2`` blocks, stage
``l`` in rows ``l n/2 .. (l+1) n/2 - 1`` of ``pairs`` (stage 0 acts first).

Orientation. The paper has data ``Y`` ``(n, N)`` and codes ``X`` ``(n, N)`` with ``Y ~ D X``. Here data and codes
are batch-first, ``Yb = Y^T`` and ``Xb = X^T`` ``(N, n)``, so ``Yb ~ Xb D^T``. Then

* ``Z = Y X^T = Yb^T Xb`` ``(n, n)``, ``Z_ij = <column i of Yb, column j of Xb>`` (the correlation matrix of Rusu's costs, eq. 8);
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

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lightning_ortho._extras import require
from lightning_ortho.transforms.binary_cores import G1_INDICES, binary_cores
from lightning_ortho.transforms.blocks import BinaryBlockProduct
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest
from lightning_ortho.transforms.statistics import PassLearner, TransformStatistics, fit_in_memory, principal_basis

_NEEDS_NETWORKX = "the M-transform (family 'm') finds its stages as perfect matchings"


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
    """All single-block costs ``C_ij^(t)`` of Rusu eq. (8) for the G1 cores: ``(n, n) -> (n, n, 8)``.

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
    return m_stage_from_cross(data.T @ codes)  # Z = Y X^T in the paper's orientation


def m_stage_from_cross(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`learn_m_stage` from ``Z = Yb^T Xb`` ``(n, n)`` alone (``n`` even): same returns."""
    nx = require("networkx", _NEEDS_NETWORKX)
    n = z.shape[0]
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


class MTransformLearner(PassLearner):
    """M_q-DLA as one alternation per pass over the data (:class:`~lightning_ortho.transforms.statistics.
    TransformLearner`): what :func:`learn_m_transform` runs in memory and the Lightning module runs on a stream.

    Passes: (0) the Gram matrix gives the principal basis ``U`` (step 1; codes ``T_s(Y)``, the error of no
    transform); then each pass's codes (``T_s(Y U)`` the
    first time, ``T_s(Y M)`` after) give ``Z = Y^T X`` and every stage is rebuilt from it, ``Z_{l+1} = Z_l
    Mbar_l^T`` (step 2; ``X_{l+1} = X_l Mbar_l^T``); the pass after round ``r`` measures its error (step 3).
    ``rounds`` rounds take ``rounds + 2`` passes; the last one only measures. ``on_step`` (no argument) is called
    after each stage, ``q rounds`` times in all (progress reporting; not part of the state).

    Args:
        n: features (even: the stages are perfect matchings).
        q: number of stages (``>= 1``).
        s: nonzeros per code row (``1 <= s <= n``).
        rounds: outer rounds (``>= 1``).
        on_step: called with no argument after each stage.

    Raises:
        ValueError: ``n`` odd, ``q``/``rounds`` not ints ``>= 1`` or ``s`` not in ``[1, n]``.
        MissingExtraError: networkx is not installed (the ``transforms`` extra), before any work is done.
    """

    def __init__(self, n: int, q: int, s: int, *, rounds: int = 1, on_step: Callable[[], object] | None = None) -> None:
        where = "learn_m_transform"
        require("networkx", _NEEDS_NETWORKX)
        if not isinstance(n, int) or n < 2 or n % 2:
            raise ValueError(f"{where}: n must be even (its stages are perfect matchings), got n = {n}.")
        for name, value in (("q", q), ("rounds", rounds)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}.")
        if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:
            raise ValueError(f"{where}: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
        super().__init__(n, s)
        self.q, self.rounds, self.on_step = q, rounds, on_step
        self.pairs: torch.Tensor | None = None
        self.core_index: torch.Tensor | None = None
        self.errors: list[float] = []

    def transform(self, dtype: torch.dtype = torch.float64) -> BinaryBlockProduct:
        """The current ``M`` (no blocks, the identity, before the first round)."""
        if self.pairs is None or self.core_index is None:
            return BinaryBlockProduct(self.n, [], [], dtype=dtype)
        return BinaryBlockProduct(self.n, self.pairs, self.core_index, dtype=dtype)

    def encode(self, data: torch.Tensor) -> torch.Tensor | None:
        if self.basis is None:
            return self.code(data)  # T_s(Y): no transform yet
        y = data.detach().to(torch.float64)
        basis = self.basis if self.pairs is None else self.dictionary()
        return keep_largest(y @ basis.to(y.device), self.s)

    def op_count(self) -> OpCount:
        """Operations of one ``M x`` as the paper counts them: ``nq`` additions and ``n`` multiplications (shifts
        for even ``q``), the ``2^{-1/2}`` factors deferred (``BinaryBlockProduct.op_count(defer_scaling=True)``)."""
        return self.transform().op_count(defer_scaling=True)

    def code(self, data: torch.Tensor) -> torch.Tensor:
        """Best ``s``-sparse codes of a batch ``(B, n)`` under the current transform, ``T_s(Y D)`` (float64)."""
        return keep_largest(data.detach().to(torch.float64) @ self.dictionary().to(data.device), self.s)

    def update(self, statistics: TransformStatistics) -> float | None:
        """End of a pass: the next step of Algorithm 3 from the pass's sums; returns the pass's error."""
        if self.finished:
            raise RuntimeError("MTransformLearner.update: the learner has finished; start a new one to learn again.")
        if self.basis is None:
            error = statistics.error(self.dictionary())  # of T_s(Y): the identity, before any transform
            self.basis = principal_basis(statistics.gram).cpu()
            return error
        if self.pairs is None:
            error = statistics.error(self.basis)
        else:
            error = statistics.error(self.dictionary())
            self.errors.append(error)
            if len(self.errors) >= self.rounds:
                self.finished = True
                return error
        z = statistics.cross.cpu()
        all_pairs, all_cores = [], []
        for _stage in range(self.q):
            pairs, core_index = m_stage_from_cross(z)
            stage = BinaryBlockProduct(self.n, pairs, core_index, dtype=torch.float64)
            z = z @ stage.matrix().T  # Z_{l+1} = Y^T X_l Mbar_l^T
            all_pairs.append(pairs)
            all_cores.append(core_index)
            if self.on_step is not None:
                self.on_step()
        self.pairs, self.core_index = torch.cat(all_pairs), torch.cat(all_cores)
        self._changed()
        return error

    STATE = ("pairs", "core_index", "errors")


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
    on_step: Callable[[], object] | None = None,
) -> MTransformResult:
    """M_q-DLA (Rusu, Algorithm 3): learn ``M = Mbar_q ... Mbar_1`` and ``s``-sparse codes with ``Y ~ X M^T``.

    Steps (batch-first, see the module docstring for the orientation):

    1. ``X <- T_s(Y U)``, ``U`` the left singular vectors of ``Y^T`` (the paper's SVD initialisation; from the
       Gram matrix ``Y^T Y`` with a fixed column order and sign, :func:`principal_basis`).
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
        on_step: called with no argument after each stage (one perfect matching), ``q rounds`` times, for progress
            reporting.

    Returns:
        :class:`MTransformResult` (transform in ``Y``'s dtype, codes ``(N, n)``, one error per round).

    Raises:
        ValueError: ``Y`` not a 2-d finite nonzero floating tensor, ``n`` odd or ``< 2``, ``q``/``rounds`` not
            ints ``>= 1``, ``s`` not an int in ``[1, n]``, or ``generator`` neither ``None`` nor a Generator.
    """
    _check_inputs(Y, q, s, rounds, generator)
    n = Y.shape[1]
    learner = MTransformLearner(n, q, s, rounds=rounds, on_step=on_step)
    data = Y.detach().to(torch.float64)
    fit_in_memory(learner, data)
    codes = keep_largest(data @ learner.dictionary().to(data.device), s)
    transform = learner.transform(Y.dtype).to(Y.device)
    return MTransformResult(transform=transform, codes=codes.to(Y.dtype), errors=learner.errors)
