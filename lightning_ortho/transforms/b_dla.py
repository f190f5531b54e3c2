"""B_m-DLA (Rusu, Algorithm 2): learn an orthonormal B-transform ``D = B_m ... B_1`` and sparse codes.

Problem (Rusu eq. 1) with batch-first data ``Y`` ``(N, n)`` (the paper's ``Y`` transposed) and codes ``X``
``(N, n)`` with ``s`` nonzeros per row:

    min_{D, X} ||Y - X D^T||_F^2,   D = B_{i_m j_m} ... B_{i_1 j_1} with binary cores (:mod:`binary_cores`).

Orientation. Write ``Y_p = Y^T`` and ``X_p = X^T`` for the paper's ``(n, N)`` matrices. Then
``||Y_p - D X_p|| = ||Y - X D^T||`` and the paper's ``Z = Y_p X_p^T`` (eq. 9) is, batch-first,

    Z = Y^T X    (n, n),   Z_ab = sum_r Y[r, a] X[r, b].

``Z`` keeps the paper's orientation, so every update of the paper applies to it verbatim: ``X_p <- B_k X_p`` is
``X <- X B_k^T`` and gives ``Z <- Z B_k^T``; ``B^T Y_p`` is ``(Y B)^T`` and gives ``Z = B^T Y^T X``; peeling
``B_k^T`` off the front is ``Z <- B_k Z``.

Cost of one block (eqs. 7-8): ``||Y - X B_ij^T||^2 = ||Y||^2 + ||X||^2 + C_ij^(t)`` with, for the core
``[[g11, g12], [g21, g22]]`` placed at rows/columns ``(i, j)``,

    C_ij^(t) = -2 tr Z + 2 [(1 - g11) Z_ii + (1 - g22) Z_jj - g12 Z_ij - g21 Z_ji].

Every pick (eq. 10) minimises this over all pairs ``i < j`` and all candidate cores of the current ``Z``. A block
on ``(i, j)`` changes only rows or columns ``i, j`` of ``Z``, so only the costs of the pairs that hold ``i`` or
``j`` change: :class:`~lightning_ortho.transforms.block_cost_table.BlockCostTable` recomputes those (``O(n)``
pairs per pick instead of ``n (n - 1) / 2``) and makes exactly the choice of a full scan (:func:`best_block`,
kept as the reference: ``rescan=True``). No cost is ever stale, unlike the author's code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lightning_ortho.transforms.binary_cores import G1_INDICES, IDENTITY_INDEX, SWAP_INDEX, binary_cores
from lightning_ortho.transforms.block_cost_table import BlockCostTable
from lightning_ortho.transforms.blocks import BinaryBlockProduct
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest
from lightning_ortho.transforms.statistics import PassLearner, TransformStatistics, fit_in_memory, principal_basis

#: Candidate core indices before the first convergence (G1, types t = 1..8 of :mod:`binary_cores`) and after it (t = 1..15: every
#: core except the identity; this includes the swap t = 14, which the author's code disables).
NARROW_CANDIDATES = tuple(G1_INDICES)
WIDE_CANDIDATES = tuple(k for k in range(16) if k != IDENTITY_INDEX)


@dataclass
class BTransformResult:
    """Output of :func:`learn_b_transform`.

    Attributes:
        transform: the learned ``D = B_m ... B_1`` (``m`` blocks, dtype of the data).
        codes: ``(N, n)`` ``s``-sparse codes ``T_s(Y D)`` (dtype of the data); ``Y ~ codes @ D^T``.
        errors: ``100 ||Y - X D^T||^2 / ||Y||^2`` (percent) after each sweep, in order.
        candidates_widened_at: the 1-based sweep after which the candidate set grew from G1 (8 cores) to all 15
            non-identity cores, or ``None`` if the error never converged. Convergence at the last allowed sweep
            is still recorded, though no sweep then used the wider set.
        initial_error: the error after the greedy init and ``X <- T_s(Y D)`` (step 3), before any sweep.
    """

    transform: BinaryBlockProduct
    codes: torch.Tensor
    errors: list[float] = field(default_factory=list)
    candidates_widened_at: int | None = None
    initial_error: float = math.nan


def block_costs(z: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All costs ``C_ij^(t)`` (eq. 8) for the pairs ``i < j`` and the candidate cores.

    Args:
        z: ``(n, n)`` ``Z = Y^T X`` (paper orientation ``Y_p X_p^T``).
        candidates: ``(T,)`` int64 core indices into :func:`binary_cores`.

    Returns:
        ``costs`` ``(P, T)`` with ``P = n (n - 1) / 2`` and ``pairs`` ``(P, 2)`` (row-major order of ``i < j``):
        ``costs[p, t] = -2 tr Z + 2[(1 - g11) Z_ii + (1 - g22) Z_jj - g12 Z_ij - g21 Z_ji]``.
    """
    n = z.shape[0]
    pairs = torch.triu_indices(n, n, offset=1, device=z.device).T
    i, j = pairs[:, 0], pairs[:, 1]
    g = binary_cores(z.dtype, z.device)[candidates]  # (T, 2, 2)
    z_ii, z_jj, z_ij, z_ji = z[i, i, None], z[j, j, None], z[i, j, None], z[j, i, None]
    costs = (
        2 * ((1 - g[:, 0, 0]) * z_ii + (1 - g[:, 1, 1]) * z_jj - g[:, 0, 1] * z_ij - g[:, 1, 0] * z_ji)
        - 2 * torch.diagonal(z).sum()
    )
    return costs, pairs


def best_block(z: torch.Tensor, candidates: torch.Tensor) -> tuple[int, int, int, float]:
    """Eq. (10): ``(i, j, core_index, cost)`` minimising ``C_ij^(t)`` over all pairs ``i < j`` and candidates.

    Ties go to the first pair in row-major order, then the first candidate. The best block is returned even when
    its cost is positive (there is no "keep the identity" option in the paper's choice of a B-transform, eq. 10).
    """
    costs, pairs = block_costs(z, candidates)
    flat = int(costs.argmin())
    p, t = divmod(flat, costs.shape[1])
    return int(pairs[p, 0]), int(pairs[p, 1]), int(candidates[t]), float(costs[p, t])


def _left(z: torch.Tensor, i: int, j: int, core: torch.Tensor) -> None:
    """In place ``Z <- B_ij Z`` (rows ``i, j`` mixed by ``core``)."""
    rows = z[[i, j], :]
    z[[i, j], :] = core @ rows


def _right_transposed(z: torch.Tensor, i: int, j: int, core: torch.Tensor) -> None:
    """In place ``Z <- Z B_ij^T`` (columns ``i, j`` mixed by ``core^T``)."""
    cols = z[:, [i, j]]
    z[:, [i, j]] = cols @ core.T


def _choose(z: torch.Tensor, candidates: torch.Tensor, table: BlockCostTable | None) -> tuple[int, int, int, float]:
    """One block choice by eq. (10): from the incremental ``table``, or by :func:`best_block` (every pair) without."""
    return best_block(z, candidates) if table is None else table.choose()


def greedy_init(
    z: torch.Tensor,
    m: int,
    candidates: torch.Tensor,
    on_step: Callable[[], object] | None = None,
    *,
    rescan: bool = False,
) -> tuple[list[tuple[int, int]], list[int]]:
    """Step 2: from ``Z = Y^T X``, ``m`` times pick ``B_k`` by eq. (10), then ``Z <- Z B_k^T`` (``X <- X B_k^T``).

    Args:
        z: ``(n, n)`` float64 ``Y^T X`` (not modified). m: number of blocks. candidates: ``(T,)`` core indices.
        on_step: called with no argument after each pick (progress reporting).
        rescan: ``False`` (default): each pick updates only the costs of the pairs that share a coordinate with the
            last block (:class:`~lightning_ortho.transforms.block_cost_table.BlockCostTable`, ``O(n)`` pairs);
            ``True``: each pick recomputes every pair (:func:`best_block`, ``O(n^2)``). Both make the same picks.

    Returns:
        ``pairs`` (``m`` tuples ``(i, j)``, ``i < j``) and ``index`` (``m`` core indices), block 0 acting first.
    """
    cores = binary_cores(z.dtype, z.device)
    pairs: list[tuple[int, int]] = []
    index: list[int] = []
    z = z.clone()
    table = None if rescan else BlockCostTable(z, candidates)
    for _ in range(m):
        i, j, k, _cost = _choose(z, candidates, table)
        pairs.append((i, j))
        index.append(k)
        _right_transposed(z, i, j, cores[k])
        if table is not None:
            table.touch(i, j)
        if on_step is not None:
            on_step()
    return pairs, index


def sweep(
    z: torch.Tensor,
    pairs: list[tuple[int, int]],
    index: list[int],
    candidates: torch.Tensor,
    on_step: Callable[[], object] | None = None,
    *,
    rescan: bool = False,
) -> None:
    """One sweep of step 4, re-picking every block in place in ``pairs`` / ``index`` (codes fixed).

    Args:
        z: ``(n, n)`` float64 ``(Y D)^T X = D^T Y^T X`` (the paper's ``B^T Y_p X_p^T``) for the current ``D``
            built from ``pairs`` / ``index`` (not modified).
        pairs, index: the blocks (``m`` entries each), modified in place.
        candidates: ``(T,)`` int64 candidate core indices.
        on_step: called with no argument after each re-pick (progress reporting).
        rescan: as in :func:`greedy_init` (``False``: incremental costs; ``True``: every pair at every pick).

    For ``k = 1..m``: ``Z <- B_k Z`` (so ``Z = Y_k X_k^T``, eq. 12 with the blocks ``< k`` already re-picked),
    ``B_k <-`` eq. (10) on ``Z``, ``Z <- Z B_k^T``.
    """
    cores = binary_cores(z.dtype, z.device)
    z = z.clone()
    table = None if rescan else BlockCostTable(z, candidates)
    for k in range(len(pairs)):
        i, j = pairs[k]
        _left(z, i, j, cores[index[k]])
        if table is not None:
            table.touch(i, j)
        i, j, t, _cost = _choose(z, candidates, table)
        pairs[k] = (i, j)
        index[k] = t
        _right_transposed(z, i, j, cores[t])
        if table is not None:
            table.touch(i, j)
        if on_step is not None:
            on_step()


class BTransformLearner(PassLearner):
    """B_m-DLA as one alternation per pass over the data (:class:`~lightning_ortho.transforms.statistics.
    TransformLearner`): what :func:`learn_b_transform` runs in memory and the Lightning module runs on a stream.

    Passes: (0) the Gram matrix ``Y^T Y`` gives the principal basis ``V`` (step 1; the pass's codes are ``T_s(Y)``,
    so its error is that of no transform); (1) codes ``T_s(Y V)`` give
    ``Z`` and the greedy init (step 2); (2, 3, ...) codes ``T_s(Y D)`` give the error of ``D`` (the first one is
    ``initial_error``, step 3) and ``Z`` for one sweep (step 4), until the stopping rule of step 5 or
    ``iterations`` sweeps. The last pass only measures: its codes are the final ``T_s(Y D)``.

    Args:
        n: features (``>= 2``).
        m: number of blocks (``>= 1``).
        s: nonzeros per code (``1 <= s <= n``).
        iterations: maximum number of sweeps (``>= 1``).
        tol: convergence threshold on the change of the error, in percent.
        allow_swap: whether the widened set holds the swap ``[0 1; 1 0]`` (as :func:`learn_b_transform`).
        on_step: called with no argument after each block choice.

    Raises:
        ValueError: an argument out of range (see :func:`learn_b_transform`).
    """

    def __init__(
        self,
        n: int,
        m: int,
        s: int,
        *,
        iterations: int = 10,
        tol: float = 1e-5,
        allow_swap: bool = True,
        on_step: Callable[[], object] | None = None,
    ) -> None:
        _check_settings(n, m, s, iterations, tol, allow_swap)
        super().__init__(n, s)
        self.m, self.iterations, self.tol, self.allow_swap = m, iterations, float(tol), allow_swap
        self.on_step = on_step  # progress reporting only: not part of the state
        self.phase = "basis"
        self.pairs: list[tuple[int, int]] = []
        self.index: list[int] = []
        self.initial_error = math.nan
        self.errors: list[float] = []
        self.widened_at: int | None = None

    def candidates(self) -> torch.Tensor:
        """The current candidate cores: G1 before the widening, all 15 non-identity cores (or 14) after."""
        if self.widened_at is None:
            return torch.tensor(NARROW_CANDIDATES, dtype=torch.int64)
        return torch.tensor([k for k in WIDE_CANDIDATES if self.allow_swap or k != SWAP_INDEX], dtype=torch.int64)

    def transform(self, dtype: torch.dtype = torch.float64) -> BinaryBlockProduct:
        """The current ``D = B_m ... B_1`` (the identity with no blocks before the greedy init)."""
        return BinaryBlockProduct(self.n, self.pairs, self.index, dtype=dtype)

    def encode(self, data: torch.Tensor) -> torch.Tensor | None:
        """Codes of a batch ``(B, n)`` for this pass (float64): ``T_s(Y)`` (no transform yet), ``T_s(Y V)`` or
        ``T_s(Y D)``."""
        if self.phase == "basis":
            return self.code(data)
        y = data.detach().to(torch.float64)
        basis = self.basis if self.phase == "greedy" else self.dictionary()
        assert basis is not None
        return keep_largest(y @ basis.to(y.device), self.s)

    def op_count(self) -> OpCount:
        """Operations of one ``D x``: 2 additions + 2 multiplications per G1 block, none per G2 block."""
        return self.transform().op_count()

    def code(self, data: torch.Tensor) -> torch.Tensor:
        """Best ``s``-sparse codes of a batch ``(B, n)`` under the current transform, ``T_s(Y D)`` (float64)."""
        return keep_largest(data.detach().to(torch.float64) @ self.dictionary().to(data.device), self.s)

    def update(self, statistics: TransformStatistics) -> float | None:
        """End of a pass: the next step of Algorithm 2 from the pass's sums; returns the pass's error."""
        if self.finished:
            raise RuntimeError("BTransformLearner.update: the learner has finished; start a new one to learn again.")
        if self.phase == "basis":
            error = statistics.error(self.dictionary())  # of T_s(Y): the identity, before any transform
            self.basis = principal_basis(statistics.gram).cpu()
            self.phase = "greedy"
            return error
        if self.phase == "greedy":
            assert self.basis is not None
            error = statistics.error(self.basis)
            self.pairs, self.index = greedy_init(statistics.cross.cpu(), self.m, self.candidates(), self.on_step)
            self._changed()
            self.phase = "sweep"
            return error
        d = self.dictionary()
        error = statistics.error(d)
        if math.isnan(self.initial_error):
            self.initial_error = error
        else:
            self.errors.append(error)
            it = len(self.errors)
            if it >= 3 and abs(self.errors[-1] - self.errors[-2]) <= self.tol:
                if self.widened_at is not None:
                    self.finished = True
                    return error
                self.widened_at = it  # step 5: widen the candidates from G1 and sweep on
            if it >= self.iterations:
                self.finished = True
                return error
        sweep(d.T @ statistics.cross.cpu(), self.pairs, self.index, self.candidates(), self.on_step)
        self._changed()
        return error

    STATE = ("phase", "pairs", "index", "initial_error", "errors", "widened_at")


def _check_settings(n: object, m: object, s: object, iterations: object, tol: object, allow_swap: object) -> None:
    where = "learn_b_transform"
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"{where}: m must be an int >= 1 (number of blocks), got {m!r}.")
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:  # type: ignore[operator]
        raise ValueError(f"{where}: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"{where}: iterations must be an int >= 1 (sweeps), got {iterations!r}.")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"{where}: tol must be a finite number >= 0 (percent), got {tol!r}.")
    if not isinstance(allow_swap, bool):
        raise TypeError(f"{where}: allow_swap must be a bool, got {allow_swap!r}.")


def learn_b_transform(
    Y: torch.Tensor,  # noqa: N803 - the paper's name
    m: int,
    s: int,
    *,
    iterations: int = 10,
    tol: float = 1e-5,
    generator: torch.Generator | None = None,
    allow_swap: bool = True,
    on_step: Callable[[], object] | None = None,
) -> BTransformResult:
    """B_m-DLA (Rusu, Algorithm 2): ``m`` binary blocks and ``s``-sparse codes minimising ``||Y - X D^T||_F^2``.

    Steps (``Z`` as in the module docstring, ``T_s`` = :func:`keep_largest`):

    1. SVD init: ``Y = U' S V^T`` (batch-first; the paper's ``U`` is ``V``), ``X <- T_s(Y V)``, ``D = I``; ``V``
       from the Gram matrix ``Y^T Y`` with a fixed column order and sign (:func:`principal_basis`).
    2. Greedy init: ``Z <- Y^T X``; for ``k = 1..m`` pick ``B_k`` by eq. (10) among G1, then ``Z <- Z B_k^T``.
    3. ``X <- T_s(Y D)``.
    4. Sweep ``it = 1..iterations``: ``Z <- (Y D)^T X``; for each ``k``: ``Z <- B_k Z`` (now ``Z_k = Y_k X_k^T``,
       eq. 12), re-pick ``B_k`` by eq. (10) (pair and core may change), ``Z <- Z B_k^T``. Then ``X <- T_s(Y D)``
       and record the error ``100 ||Y - X D^T||^2 / ||Y||^2``.
    5. Stop when ``it >= 3`` and ``|err_it - err_{it-1}| <= tol``: the first time, the candidates widen from G1
       (8 cores) to all 15 non-identity cores and sweeping resumes (same sweep budget); the second time, stop.

    Each re-pick is exact for fixed ``X`` (``D`` orthonormal, eq. 12) and ``T_s`` is exact for fixed ``D``, so
    the recorded errors do not increase (the current block is always a candidate: the set only grows).

    Differences from the author's ``b_dla.m``: every pick sees the exact costs of every pair (those a block
    changed are recomputed, :class:`~lightning_ortho.transforms.block_cost_table.BlockCostTable`; no stale
    ``-2 tr Z``; no zero entries for ``i >= j`` competing in the argmin), and the error list is not overwritten
    at the widening (the author sets ``err(k) = err(1)`` there). In practice the greedy init is often already a
    fixed point of the sweeps for small ``n`` (seen for ``n <= 16``); for ``n = 32, 64`` sweeps and widening
    lower the error by a few percent.

    Args:
        Y: ``(N, n)`` data, floating point (computation in float64; outputs in ``Y``'s dtype).
        m: number of blocks (``>= 1``).
        s: nonzeros per code (``1 <= s <= n``).
        iterations: maximum number of sweeps ``K`` (``>= 1``).
        tol: convergence threshold on the change of the error, in percent.
        generator: unused (the algorithm is deterministic; ties go to the lowest pair, then core, index).
        allow_swap: whether the widened set holds the swap ``[0 1; 1 0]`` (t = 14). ``False`` reproduces the
            author's code, which sets its cost to ``+inf`` (14 candidates after widening).
        on_step: called with no argument after each block choice (eq. 10), for progress reporting: ``m`` in the
            greedy init and ``m`` per sweep, so at most ``m (1 + iterations)``.

    Returns:
        :class:`BTransformResult`.

    Raises:
        ValueError: ``Y`` is not a 2-d floating tensor with ``n >= 2``, ``N >= 1``, finite and not all zero;
            ``m``, ``s``, ``iterations`` or ``tol`` out of range.
        TypeError: ``allow_swap`` is not a bool.
    """
    del generator
    n = check_training_data(Y, s, "learn_b_transform")
    learner = BTransformLearner(n, m, s, iterations=iterations, tol=tol, allow_swap=allow_swap, on_step=on_step)
    y = Y.detach().to(torch.float64)
    fit_in_memory(learner, y)
    codes = keep_largest(y @ learner.dictionary().to(y.device), s)
    transform = learner.transform(Y.dtype).to(Y.device)
    return BTransformResult(transform, codes.to(Y.dtype), learner.errors, learner.widened_at, learner.initial_error)
