"""B_m-DLA (spec section 5, Algorithm 2): learn an orthonormal B-transform ``D = B_m ... B_1`` and sparse codes.

Problem (spec eq. 1) with batch-first data ``Y`` ``(N, n)`` (the paper's ``Y`` transposed) and codes ``X``
``(N, n)`` with ``s`` nonzeros per row:

    min_{D, X} ||Y - X D^T||_F^2,   D = B_{i_m j_m} ... B_{i_1 j_1} with binary cores (spec section 3).

Orientation. Write ``Y_p = Y^T`` and ``X_p = X^T`` for the paper's ``(n, N)`` matrices. Then
``||Y_p - D X_p|| = ||Y - X D^T||`` and the paper's ``Z = Y_p X_p^T`` (eq. 9) is, batch-first,

    Z = Y^T X    (n, n),   Z_ab = sum_r Y[r, a] X[r, b].

``Z`` keeps the paper's orientation, so every update of the spec applies to it verbatim: ``X_p <- B_k X_p`` is
``X <- X B_k^T`` and gives ``Z <- Z B_k^T``; ``B^T Y_p`` is ``(Y B)^T`` and gives ``Z = B^T Y^T X``; peeling
``B_k^T`` off the front is ``Z <- B_k Z``.

Cost of one block (eqs. 7-8): ``||Y - X B_ij^T||^2 = ||Y||^2 + ||X||^2 + C_ij^(t)`` with, for the core
``[[g11, g12], [g21, g22]]`` placed at rows/columns ``(i, j)``,

    C_ij^(t) = -2 tr Z + 2 [(1 - g11) Z_ii + (1 - g22) Z_jj - g12 Z_ij - g21 Z_ji].

Every pick (eq. 10) evaluates this for all pairs ``i < j`` and all candidate cores from the current ``Z``
(vectorised; no cached, stale costs as in the author's code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lightning_ortho.transforms.binary_cores import G1_INDICES, IDENTITY_INDEX, SWAP_INDEX, binary_cores
from lightning_ortho.transforms.blocks import BinaryBlockProduct
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest, representation_error

#: Candidate core indices before the first convergence (G1, the spec's t = 1..8) and after it (t = 1..15: every
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
    its cost is positive (there is no "keep the identity" option, spec section 4).
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


def greedy_init(
    y: torch.Tensor, x: torch.Tensor, m: int, candidates: torch.Tensor
) -> tuple[list[tuple[int, int]], list[int]]:
    """Step 2: ``Z <- Y^T X``; ``m`` times pick ``B_k`` by eq. (10), then ``Z <- Z B_k^T`` (i.e. ``X <- X B_k^T``).

    Args:
        y, x: ``(N, n)`` float64 data and codes. m: number of blocks. candidates: ``(T,)`` int64 core indices.

    Returns:
        ``pairs`` (``m`` tuples ``(i, j)``, ``i < j``) and ``index`` (``m`` core indices), block 0 acting first.
    """
    cores = binary_cores(y.dtype, y.device)
    pairs: list[tuple[int, int]] = []
    index: list[int] = []
    z = y.T @ x
    for _ in range(m):
        i, j, k, _cost = best_block(z, candidates)
        pairs.append((i, j))
        index.append(k)
        _right_transposed(z, i, j, cores[k])
    return pairs, index


def sweep(
    y: torch.Tensor,
    x: torch.Tensor,
    d: torch.Tensor,
    pairs: list[tuple[int, int]],
    index: list[int],
    candidates: torch.Tensor,
) -> None:
    """One sweep of step 4, re-picking every block in place in ``pairs`` / ``index`` (codes ``x`` fixed).

    ``Z <- (Y D)^T X = B^T Y_p X_p^T``; for ``k = 1..m``: ``Z <- B_k Z`` (so ``Z = Y_k X_k^T``, eq. 12 with the
    blocks ``< k`` already re-picked), ``B_k <-`` eq. (10) on ``Z``, ``Z <- Z B_k^T``.

    Args:
        y, x: ``(N, n)`` float64 data and codes. d: ``(n, n)`` the current ``D`` built from ``pairs`` / ``index``.
        pairs, index: the blocks (``m`` entries each), modified in place.
        candidates: ``(T,)`` int64 candidate core indices.
    """
    cores = binary_cores(y.dtype, y.device)
    z = (y @ d).T @ x
    for k in range(len(pairs)):
        i, j = pairs[k]
        _left(z, i, j, cores[index[k]])
        i, j, t, _cost = best_block(z, candidates)
        pairs[k] = (i, j)
        index[k] = t
        _right_transposed(z, i, j, cores[t])


def _check(y: object, m: object, s: object, iterations: object, tol: object) -> None:
    where = "learn_b_transform"
    check_training_data(y, s, where)
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"{where}: m must be an int >= 1 (number of blocks), got {m!r}.")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"{where}: iterations must be an int >= 1 (sweeps), got {iterations!r}.")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"{where}: tol must be a finite number >= 0 (percent), got {tol!r}.")


def learn_b_transform(
    Y: torch.Tensor,  # noqa: N803 - the paper's name
    m: int,
    s: int,
    *,
    iterations: int = 10,
    tol: float = 1e-5,
    generator: torch.Generator | None = None,
    allow_swap: bool = True,
) -> BTransformResult:
    """B_m-DLA (spec section 5): ``m`` binary blocks and ``s``-sparse codes minimising ``||Y - X D^T||_F^2``.

    Steps (``Z`` as in the module docstring, ``T_s`` = :func:`keep_largest`):

    1. SVD init: ``Y = U' S V^T`` (batch-first; the paper's ``U`` is ``V``), ``X <- T_s(Y V)``, ``D = I``.
    2. Greedy init: ``Z <- Y^T X``; for ``k = 1..m`` pick ``B_k`` by eq. (10) among G1, then ``Z <- Z B_k^T``.
    3. ``X <- T_s(Y D)``.
    4. Sweep ``it = 1..iterations``: ``Z <- (Y D)^T X``; for each ``k``: ``Z <- B_k Z`` (now ``Z_k = Y_k X_k^T``,
       eq. 12), re-pick ``B_k`` by eq. (10) (pair and core may change), ``Z <- Z B_k^T``. Then ``X <- T_s(Y D)``
       and record the error ``100 ||Y - X D^T||^2 / ||Y||^2``.
    5. Stop when ``it >= 3`` and ``|err_it - err_{it-1}| <= tol``: the first time, the candidates widen from G1
       (8 cores) to all 15 non-identity cores and sweeping resumes (same sweep budget); the second time, stop.

    Each re-pick is exact for fixed ``X`` (``D`` orthonormal, eq. 12) and ``T_s`` is exact for fixed ``D``, so
    the recorded errors do not increase (the current block is always a candidate: the set only grows).

    Differences from the author's ``b_dla.m``: costs are recomputed for every pair at every pick (no stale
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

    Returns:
        :class:`BTransformResult`.

    Raises:
        ValueError: ``Y`` is not a 2-d floating tensor with ``n >= 2``, ``N >= 1``, finite and not all zero;
            ``m``, ``s``, ``iterations`` or ``tol`` out of range.
        TypeError: ``allow_swap`` is not a bool.
    """
    del generator
    _check(Y, m, s, iterations, tol)
    if not isinstance(allow_swap, bool):
        raise TypeError(f"learn_b_transform: allow_swap must be a bool, got {allow_swap!r}.")
    y = Y.detach().to(torch.float64)
    n = y.shape[1]

    # 1. SVD init: the paper's U (left singular vectors of Y_p = Y^T) are the right singular vectors of Y.
    _, _, vh = torch.linalg.svd(y, full_matrices=False)
    x = keep_largest(y @ vh.T, s)

    # 2. Greedy init with the G1 candidates.
    candidates = torch.tensor(NARROW_CANDIDATES, dtype=torch.int64, device=y.device)
    pairs, index = greedy_init(y, x, m, candidates)

    def dense() -> torch.Tensor:
        return BinaryBlockProduct(n, pairs, index, dtype=torch.float64).matrix()

    # 3. Codes for the initial transform.
    d = dense()
    x = keep_largest(y @ d, s)
    initial_error = float(representation_error(y, x, d))

    errors: list[float] = []
    widened_at: int | None = None
    for it in range(1, iterations + 1):
        # 4. One sweep: Z = B^T Y_p X_p^T = (Y D)^T X, then peel and re-pick every block in product order.
        sweep(y, x, d, pairs, index, candidates)
        d = dense()
        x = keep_largest(y @ d, s)
        errors.append(float(representation_error(y, x, d)))
        # 5. Stopping rule with one widening of the candidate set.
        if it >= 3 and abs(errors[-1] - errors[-2]) <= tol:
            if widened_at is not None:
                break
            widened_at = it
            wide = [k for k in WIDE_CANDIDATES if allow_swap or k != SWAP_INDEX]
            candidates = torch.tensor(wide, dtype=torch.int64, device=y.device)

    transform = BinaryBlockProduct(n, pairs, index, dtype=Y.dtype)
    return BTransformResult(transform, x.to(Y.dtype), errors, widened_at, initial_error)
