"""B⊗_m-DLA (Rusu 2018, the B-transforms with 4x4 blocks): learn ``D = B_m ... B_1`` of 4x4 Hadamard blocks and codes.

Problem (Rusu eq. 1) with batch-first data ``Y`` ``(N, n)`` and ``s``-sparse codes ``X`` ``(N, n)``:

    min_{D, X} ||Y - X D^T||_F^2,   D = B_{q_m} ... B_{q_1},

each ``B_q`` the identity except a core of :func:`~lightning_ortho.transforms.quad_cores.quad_cores` (a 4x4 Hadamard
matrix scaled by ``1/2``) on the rows and columns ``q = (i, j, r, p)``, ``i < j < r < p``. ``D`` is orthonormal and
``D x`` costs ``12 m`` additions and ``4 m`` shifts.

The paper learns it with the steps of B_m-DLA (its Algorithm 2) and ``K = 1``; ``Z = Y^T X`` as in
:mod:`~lightning_ortho.transforms.b_dla` (the paper's ``Y_p X_p^T``, eq. 9), and each block choice is eq. (10) over the
``C(n, 4)`` quadruples and the 768 cores with the cost of
:mod:`~lightning_ortho.transforms.quad_cost_table` (``C = -2 tr Z + 2 sum_ab (I - H)_ab S_ab``, eqs. 7-8 for a 4x4
block). Each choice is exact and made from an incrementally updated table
(:class:`~lightning_ortho.transforms.quad_cost_table.QuadCostTable`); ``rescan=True`` rescans every quadruple at every
pick instead (:func:`~lightning_ortho.transforms.quad_cost_table.best_quad_block`), with the same picks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.quad_cores import QuadBlockProduct, quad_cores
from lightning_ortho.transforms.quad_cost_table import QuadCostTable, best_quad_block, quadruples
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest
from lightning_ortho.transforms.statistics import PassLearner, TransformStatistics, fit_in_memory, principal_basis

Quad = tuple[int, ...]


@dataclass
class B4x4TransformResult:
    """Output of :func:`learn_b4x4_transform`.

    Attributes:
        transform: the learned ``D = B_m ... B_1`` (``m`` 4x4 blocks, dtype of the data).
        codes: ``(N, n)`` ``s``-sparse codes ``T_s(Y D)`` (dtype of the data); ``Y ~ codes @ D^T``.
        errors: ``100 ||Y - X D^T||^2 / ||Y||^2`` (percent) after each sweep, in order.
        initial_error: the error after the greedy init and ``X <- T_s(Y D)`` (step 3), before any sweep.
        greedy_errors: during the greedy init (codes ``X`` of the SVD init fixed), the error
            ``100 ||Y - X (B_k ... B_1)^T||^2 / ||Y||^2`` after each of the ``m`` blocks, in order.
    """

    transform: QuadBlockProduct
    codes: torch.Tensor
    errors: list[float] = field(default_factory=list)
    initial_error: float = math.nan
    greedy_errors: list[float] = field(default_factory=list)


def _left(z: torch.Tensor, quad: Quad, core: torch.Tensor) -> None:
    """In place ``Z <- B_q Z`` (rows ``q`` mixed by ``core``)."""
    index = list(quad)
    z[index, :] = core @ z[index, :]


def _right_transposed(z: torch.Tensor, quad: Quad, core: torch.Tensor) -> None:
    """In place ``Z <- Z B_q^T`` (columns ``q`` mixed by ``core^T``)."""
    index = list(quad)
    z[:, index] = z[:, index] @ core.T


def _choose(z: torch.Tensor, table: QuadCostTable | None, quads: torch.Tensor) -> tuple[Quad, int, float]:
    """One block choice by eq. (10): from the incremental ``table``, or by a full scan without one."""
    return best_quad_block(z, quads) if table is None else table.choose()


def greedy_init(
    z: torch.Tensor, m: int, on_step: Callable[[], object] | None = None, *, rescan: bool = False
) -> tuple[list[Quad], list[int], list[float]]:
    """Step 2: from ``Z = Y^T X``, ``m`` times pick ``B_k`` by eq. (10), then ``Z <- Z B_k^T`` (``X <- X B_k^T``).

    Args:
        z: ``(n, n)`` float64 ``Y^T X``, ``n >= 4`` (not modified). m: number of blocks.
        on_step: called with no argument after each pick (progress reporting).
        rescan: ``False``: incremental costs (only quadruples sharing a coordinate with the last block are
            recomputed); ``True``: every quadruple at every pick. Both make the same picks.

    Returns:
        ``quads`` (``m`` increasing 4-tuples), ``index`` (``m`` core indices) and ``costs`` (``m`` values of ``C``
        of the picks, ``||Y - X_k B_k^T||^2 - ||Y||^2 - ||X||^2``), block 0 acting first.
    """
    cores = quad_cores(z.dtype, z.device)
    z = z.clone()
    every = quadruples(z.shape[0]).to(z.device)
    table = None if rescan else QuadCostTable(z, every)
    quads: list[Quad] = []
    index: list[int] = []
    costs: list[float] = []
    for _ in range(m):
        quad, k, cost = _choose(z, table, every)
        quads.append(quad)
        index.append(k)
        costs.append(cost)
        _right_transposed(z, quad, cores[k])
        if table is not None:
            table.touch(*quad)
        if on_step is not None:
            on_step()
    return quads, index, costs


def sweep(
    z: torch.Tensor,
    quads: list[Quad],
    index: list[int],
    on_step: Callable[[], object] | None = None,
    *,
    rescan: bool = False,
) -> None:
    """One sweep of step 4, re-picking every block in place in ``quads`` / ``index`` (codes fixed).

    Args:
        z: ``(n, n)`` float64 ``(Y D)^T X`` for the current ``D`` of ``quads`` / ``index`` (not modified).
        quads, index: the blocks (``m`` entries each), modified in place.
        on_step, rescan: as in :func:`greedy_init`.

    For ``k = 1..m``: ``Z <- B_k Z`` (so ``Z = Y_k X_k^T``, Rusu eq. 12), ``B_k <-`` eq. (10) on ``Z`` (quadruple and
    core may change), ``Z <- Z B_k^T``. The current block stays a candidate, so the objective cannot increase.
    """
    cores = quad_cores(z.dtype, z.device)
    z = z.clone()
    every = quadruples(z.shape[0]).to(z.device)
    table = None if rescan else QuadCostTable(z, every)
    for k in range(len(quads)):
        _left(z, quads[k], cores[index[k]])
        if table is not None:
            table.touch(*quads[k])
        quad, t, _cost = _choose(z, table, every)
        quads[k], index[k] = quad, t
        _right_transposed(z, quad, cores[t])
        if table is not None:
            table.touch(*quad)
        if on_step is not None:
            on_step()


class B4x4TransformLearner(PassLearner):
    """B⊗_m-DLA as one alternation per pass over the data (the
    :class:`~lightning_ortho.transforms.statistics.TransformLearner` protocol): what :func:`learn_b4x4_transform`
    runs in memory and a streaming driver runs batch by batch.

    Passes: (0) the Gram matrix gives the principal basis ``V`` (step 1; its codes ``T_s(Y)`` give the error of no
    transform); (1) codes ``T_s(Y V)`` give ``Z`` and the greedy init (step 2); (2, 3, ...) codes ``T_s(Y D)`` give the
    error of ``D`` (the first is ``initial_error``) and ``Z`` for one sweep (step 4), until ``iterations`` sweeps (or,
    from the third sweep on, a change of the error ``<= tol``). The last pass only measures.

    Args:
        n: features (``>= 4``).
        m: number of blocks (``>= 1``).
        s: nonzeros per code (``1 <= s <= n``).
        iterations: number of sweeps (``>= 0``).
        tol: convergence threshold on the error change, in percent.
        rescan: every pick recomputes the costs of every quadruple instead of only those a block changed (as
            :func:`learn_b4x4_transform`).
        on_step: called with no argument after each block choice.

    Raises:
        ValueError: an argument out of range (see :func:`learn_b4x4_transform`).
    """

    def __init__(
        self,
        n: int,
        m: int,
        s: int,
        *,
        iterations: int = 1,
        tol: float = 1e-5,
        rescan: bool = False,
        on_step: Callable[[], object] | None = None,
    ) -> None:
        _check_settings(n, m, s, iterations, tol, rescan)
        super().__init__(n, s)
        self.m, self.iterations, self.tol, self.rescan = m, iterations, float(tol), rescan
        self.on_step = on_step  # progress reporting only: not part of the state
        self.phase = "basis"
        self.quads: list[Quad] = []
        self.index: list[int] = []
        self.initial_error = math.nan
        self.errors: list[float] = []
        self.greedy_errors: list[float] = []

    def transform(self, dtype: torch.dtype = torch.float64) -> QuadBlockProduct:
        """The current ``D = B_m ... B_1`` (the identity with no blocks before the greedy init)."""
        return QuadBlockProduct(self.n, self.quads, self.index, dtype=dtype)

    def encode(self, data: torch.Tensor) -> torch.Tensor | None:
        """Codes of a batch ``(B, n)`` for this pass (float64): ``T_s(Y)``, ``T_s(Y V)`` or ``T_s(Y D)``."""
        if self.phase == "basis":
            return self.code(data)
        y = data.detach().to(torch.float64)
        basis = self.basis if self.phase == "greedy" else self.dictionary()
        assert basis is not None
        return keep_largest(y @ basis.to(y.device), self.s)

    def code(self, data: torch.Tensor) -> torch.Tensor:
        """Best ``s``-sparse codes of a batch ``(B, n)`` under the current transform, ``T_s(Y D)`` (float64)."""
        return keep_largest(data.detach().to(torch.float64) @ self.dictionary().to(data.device), self.s)

    def op_count(self) -> OpCount:
        """Operations of one ``D x``: 12 additions + 4 shifts per block."""
        return self.transform().op_count()

    def update(self, statistics: TransformStatistics) -> float | None:
        """End of a pass: the next step of the algorithm from the pass's sums; returns the pass's error."""
        if self.finished:
            raise RuntimeError("B4x4TransformLearner.update: the learner has finished; start a new one to learn again.")
        if self.phase == "basis":
            error = statistics.error(self.dictionary())
            self.basis = principal_basis(statistics.gram).cpu()
            self.phase = "greedy"
            return error
        if self.phase == "greedy":
            assert self.basis is not None
            error = statistics.error(self.basis)
            self.quads, self.index, costs = greedy_init(
                statistics.cross.cpu(), self.m, self.on_step, rescan=self.rescan
            )
            energy = float(statistics.data_energy)
            base = energy + float(statistics.code_energy)
            self.greedy_errors = [100 * (base + cost) / energy for cost in costs]
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
            converged = it >= 3 and abs(self.errors[-1] - self.errors[-2]) <= self.tol
            if converged or it >= self.iterations:
                self.finished = True
                return error
        if self.iterations == 0:
            self.finished = True
            return error
        sweep(d.T @ statistics.cross.cpu(), self.quads, self.index, self.on_step, rescan=self.rescan)
        self._changed()
        return error

    STATE = ("phase", "quads", "index", "initial_error", "errors", "greedy_errors")


def _check_settings(n: object, m: object, s: object, iterations: object, tol: object, rescan: object) -> None:
    where = "learn_b4x4_transform"
    if not isinstance(n, int) or isinstance(n, bool) or n < 4:
        raise ValueError(f"{where}: Y needs n >= 4 features (a block acts on four coordinates), got n = {n!r}.")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"{where}: m must be an int >= 1 (number of blocks), got {m!r}.")
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:
        raise ValueError(f"{where}: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 0:
        raise ValueError(f"{where}: iterations must be an int >= 0 (sweeps; 0 = greedy init only), got {iterations!r}.")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"{where}: tol must be a finite number >= 0 (percent), got {tol!r}.")
    if not isinstance(rescan, bool):
        raise TypeError(f"{where}: rescan must be a bool, got {rescan!r}.")


def learn_b4x4_transform(
    Y: torch.Tensor,  # noqa: N803 - the paper's name
    m: int,
    s: int,
    *,
    iterations: int = 1,
    tol: float = 1e-5,
    generator: torch.Generator | None = None,
    rescan: bool = False,
    on_step: Callable[[], object] | None = None,
) -> B4x4TransformResult:
    """B⊗_m-DLA (Rusu 2018: the steps of Algorithm 2 with 4x4 blocks and ``K = 1``): ``m`` 4x4 Hadamard blocks and
    ``s``-sparse codes minimising ``||Y - X D^T||_F^2``.

    Steps (``Z = Y^T X``, ``T_s`` = :func:`keep_largest`):

    1. SVD init: ``X <- T_s(Y V)`` with ``V`` the principal basis of ``Y^T Y`` (:func:`principal_basis`), ``D = I``.
    2. Greedy init: for ``k = 1..m`` pick ``B_k`` by eq. (10) over all quadruples and the 768 cores, then
       ``Z <- Z B_k^T``.
    3. ``X <- T_s(Y D)``.
    4. ``iterations`` sweeps (the paper's ``K``, default 1; 0 skips them, as the author's code does): re-pick each
       ``B_k`` with the others fixed (eq. 12), then ``X <- T_s(Y D)`` and record the error. From the third sweep on,
       stop early when the error changed by at most ``tol``.

    Each re-pick is exact for fixed ``X`` and ``T_s`` is exact for fixed ``D``, so the recorded errors do not
    increase. Unlike the 2x2 cores, the 768 cores do not hold the identity, so a greedy block can raise the objective
    (when ``X`` already fits ``Y`` on its four coordinates); on data such as image patches each one lowers it.

    Args:
        Y: ``(N, n)`` data, floating point, ``n >= 4`` (computation in float64; outputs in ``Y``'s dtype).
        m: number of blocks (``>= 1``).
        s: nonzeros per code (``1 <= s <= n``).
        iterations: number of sweeps (``>= 0``).
        tol: convergence threshold on the error change, in percent.
        generator: unused (deterministic; ties go to the first quadruple in lexicographic order, then core index).
        rescan: every pick recomputes the costs of every quadruple (the reference) instead of only those a block
            changed; the picks are the same.
        on_step: called with no argument after each block choice (``m`` in the greedy init, ``m`` per sweep).

    Returns:
        :class:`B4x4TransformResult`.

    Raises:
        ValueError: ``Y`` not a 2-d finite, not all-zero floating tensor with ``N >= 1`` and ``n >= 4``; ``m``, ``s``,
            ``iterations`` or ``tol`` out of range.
        TypeError: ``rescan`` is not a bool.
    """
    del generator
    n = check_training_data(Y, s, "learn_b4x4_transform")
    learner = B4x4TransformLearner(n, m, s, iterations=iterations, tol=tol, rescan=rescan, on_step=on_step)
    y = Y.detach().to(torch.float64)
    fit_in_memory(learner, y)
    codes = keep_largest(y @ learner.dictionary().to(y.device), s)
    transform = learner.transform(Y.dtype).to(Y.device)
    return B4x4TransformResult(
        transform, codes.to(Y.dtype), learner.errors, learner.initial_error, learner.greedy_errors
    )
