"""S-DLA (Rusu, arXiv 1812.03412): learn ``D = S_m ... S_1``, a product of shears and scalings with SOPOT (power-of-two)
coefficients, and ``s``-sparse codes minimising ``||Y - X D^T||_F^2``.

Orientation as in :mod:`~lightning_ortho.transforms.b_dla`: batch-first data ``Y`` and codes ``X`` ``(N, n)``,
``Y ~ X D^T``; the paper's ``Y_p = Y^T``, ``X_p = X^T``. The learner touches the data only through the sums

    z = Y^T X (the paper's Z = Y_p X_p^T),   w = X^T X (W = X_p X_p^T),   data_energy = ||Y||_F^2,

so a streaming learner that accumulates them over batches (and all-reduces them) gets the same transform.
``X_p <- S X_p`` is ``X <- X S^T`` and gives ``z <- z S^T``, ``w <- S w S^T`` verbatim.

Blocks: a shear or scaling is a core of a :class:`~lightning_ortho.transforms.blocks.BlockProduct`: lower shear
``[[1, 0], [b, 1]]`` (``y_j += b x_i``), upper shear ``[[1, c], [0, 1]]`` (``y_i += c x_j``), both on a pair
``i < j``, and scaling ``[[g, 0], [0, 1]]`` of ``i`` on ``(i, (i + 1) mod n)``. Closed forms:
:mod:`~lightning_ortho.transforms.shear_updates`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lightning_ortho.transforms import shear_updates as su
from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.shear_suffixes import suffix_products, suffix_statistics
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest, omp_codes
from lightning_ortho.transforms.statistics import PassLearner, TransformStatistics, fit_in_memory, principal_basis


@dataclass
class ShearTransformResult:
    """Output of :func:`learn_shear_transform`.

    Attributes:
        transform: the learned ``D = S_m ... S_1`` (a non-trainable :class:`BlockProduct`, dtype of ``Y``).
        codes: ``(N, n)`` OMP codes for ``D`` (at most ``s`` nonzeros per row), ``Y ~ codes @ D^T``.
        errors: ``100 ||Y - X D^T||^2 / ||Y||^2`` (percent) after each sweep and its OMP, in order.
        initial_error: the error after the greedy init and its OMP, before any sweep.
    """

    transform: BlockProduct
    codes: torch.Tensor
    errors: list[float] = field(default_factory=list)
    initial_error: float = math.nan


# ------------------------------------------------------------------------------------------------- validation
def _check_int(value: object, name: str, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{where}: {name} must be an int >= {low}, got {value!r}.")
    return value


def _check_bits(bits: object, where: str) -> int | None:
    if bits is not None and (not isinstance(bits, int) or isinstance(bits, bool) or bits < 1):
        raise ValueError(
            f"{where}: bits must be None (exact coefficients) or an int >= 1 (SOPOT terms per shear), got {bits!r}."
        )
    return bits


def _check_statistics(z: object, w: object, where: str, *, rescale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    for name, value in (("z", z), ("w", w)):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ValueError(f"{where}: {name} must be a floating-point (n, n) tensor, got {not_floating(value)}.")
        if value.dim() != 2 or value.shape[0] != value.shape[1] or value.shape[0] < 2:
            raise ValueError(f"{where}: {name} must be square (n, n) with n >= 2, got {tuple(value.shape)}.")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{where}: {name} holds NaN or inf.")
    assert isinstance(z, torch.Tensor) and isinstance(w, torch.Tensor)
    if z.shape != w.shape:
        raise ValueError(
            f"{where}: z = Y^T X and w = X^T X must have one shape, got {tuple(z.shape)}, {tuple(w.shape)}."
        )
    z = z.detach().to(torch.float64).clone()
    w = w.detach().to(device=z.device, dtype=torch.float64).clone()
    # Every choice is invariant to scaling z and w together (values are ratios, scores scale alike), but the
    # scores square them: bring the larger to O(1) by an exact power of two so data of any magnitude gives the
    # same transform (without it, data of magnitude 1e100 overflowed the scores and 1e-100 underflowed them).
    largest = float(torch.maximum(z.abs().max(), w.abs().max()))
    if rescale and largest > 0:
        shift = -math.frexp(largest)[1]
        z, w = torch.ldexp(z, torch.tensor(shift)), torch.ldexp(w, torch.tensor(shift))
    return z, w


def _check_energy(data_energy: object, where: str) -> float:
    if isinstance(data_energy, torch.Tensor) and data_energy.numel() == 1:
        data_energy = float(data_energy)
    if not isinstance(data_energy, (int, float)) or isinstance(data_energy, bool):
        kind = (
            f"a {data_energy.dtype} tensor of shape {tuple(data_energy.shape)}"
            if isinstance(data_energy, torch.Tensor)
            else type(data_energy).__name__
        )
        raise ValueError(f"{where}: data_energy must be the number ||Y||_F^2, got {kind}.")
    if not math.isfinite(data_energy) or data_energy <= 0:
        raise ValueError(f"{where}: data_energy = ||Y||_F^2 must be finite and > 0, got {data_energy!r}.")
    return float(data_energy)


# ------------------------------------------------------------------------------------------------- one pick
def _pick(
    m: torch.Tensor,
    a_norms: torch.Tensor,
    x_norms: torch.Tensor,
    bits: int | None,
    *,
    rounded_scaling_score: bool,
    scale: float,
    incumbent: tuple[int, int] | None = None,
) -> su.Entry:
    """The best entry ``(a, b)`` by the paper's scores and its stored (rounded) value. Scores within
    ``su.TIE_RTOL * max(|best|, scale)`` of the best are ties (:func:`~lightning_ortho.transforms.shear_updates.
    stable_argmin`): the ``incumbent`` entry if it is tied, else the lowest row-major index."""
    values, scores = su.entry_optima(m, a_norms, x_norms)
    g = 1 + values.diagonal()
    g_stored = su.round_scaling(g, bits)
    if rounded_scaling_score:  # init: the scaling is scored at its rounded g
        scores.diagonal().copy_(su.scaling_decrease(m.diagonal(), a_norms, x_norms, g_stored))
    scores.diagonal().masked_fill_(g.abs() <= su.MIN_SCALE, math.inf)
    a, b = su.stable_argmin(scores, scale, incumbent)
    if a == b:
        return a, a, float(g_stored[a])
    return a, b, su.round_entry(a, b, values[a, b], bits)


def shear_greedy_init(
    z: torch.Tensor, w: torch.Tensor, m: int, bits: int | None, on_step: Callable[[], object] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy init of S-DLA (Rusu, eqs. 18-20), from the identity, from the statistics alone.

    ``m`` times: score every ordered pair's shear by its unrounded minimum (``-(Z_ji - W_ij)^2 / W_ii`` for the
    lower shear on ``(i, j)``, ``-(Z_ij - W_ji)^2 / W_jj`` for the upper one) and every scaling by its decrease at
    the rounded ``g``, ``-2(g - 1) Z_ii + (g^2 - 1) W_ii``, ``g = round(Z_ii / W_ii)``; take the smallest score
    (even if positive: there is no "keep the identity"), store its rounded value (shear: ``sopot(v, bits)``;
    scaling: ``sign(g) 2^round(log2|g|)``), then ``Z <- Z S^T`` and ``W <- S W S^T`` (``X <- X S^T``). Scores
    within ``TIE_RTOL * max(|best|, tr W)`` of the smallest are ties, won by the lowest row-major entry ``(a, b)``
    (:func:`~lightning_ortho.transforms.shear_updates.stable_argmin`): exact ties are common (a zero code column
    filled by a shear copies another column) and their computed scores differ only by BLAS rounding.

    Args:
        z: ``(n, n)`` ``Y^T X``. w: ``(n, n)`` ``X^T X`` (computed in float64; not modified).
        m: number of blocks (``>= 1``). bits: SOPOT terms per shear, or ``None`` for exact values.
        on_step: called with no argument after each pick (progress reporting).

    Returns:
        ``pairs`` ``(m, 2)`` int64 and ``cores`` ``(m, 2, 2)`` float64 (on ``z``'s device), block 0 acting first.

    Raises:
        ValueError: ``z``/``w`` not finite floating ``(n, n)`` tensors of one shape; ``m`` or ``bits`` out of range.
    """
    where = "shear_greedy_init"
    z, w = _check_statistics(z, w, where, rescale=True)
    m, bits = _check_int(m, "m (number of blocks)", where, 1), _check_bits(bits, where)
    n = z.shape[0]
    ones = torch.ones(n, dtype=torch.float64, device=z.device)
    entries: list[su.Entry] = []
    for _ in range(m):
        # The scores are decreases of ||Y - X_k S^T||^2, of the order of ||X_k||^2 = tr W.
        scale = float(w.diagonal().sum())
        entry = _pick(z - w, ones, w.diagonal().clone(), bits, rounded_scaling_score=True, scale=scale)
        entries.append(entry)
        su.right_transposed(z, *entry)
        su.left(w, *entry)
        su.right_transposed(w, *entry)
        if on_step is not None:
            on_step()
    return su.blocks_of_entries(entries, n, z.device)


def shear_sweep(
    z: torch.Tensor,
    w: torch.Tensor,
    data_energy: float | torch.Tensor,
    pairs: torch.Tensor,
    cores: torch.Tensor,
    bits: int | None,
    on_step: Callable[[], object] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One update sweep of S-DLA (Rusu, eqs. 21-23) with the codes fixed, from the statistics alone.

    For ``k = 1..m`` (in product order): ``A_k = S_m ... S_{k+1}`` (old blocks), ``X_k = S_{k-1} ... S_1 X``
    (blocks already re-chosen), ``Z_k = Z P_k^T`` and ``W_k = P_k W P_k^T`` for ``P_k = S_{k-1} ... S_1``. Block
    ``k`` is removed and re-chosen among all shears and scalings at all positions (the position may move): entry
    ``(a, b)`` scores ``-M_ab^2 / (||a_a||^2 (W_k)_bb)`` with ``M = A_k^T (Z_k - A_k W_k) = (A_k^T F_k X_k^T)``,
    unrounded for shears and scalings alike; the stored value is rounded as in :func:`shear_greedy_init`. As in
    the paper the old block is one of the candidates. Ties: scores within ``TIE_RTOL * max(|best|,
    tr(A_k W_k A_k^T))`` of the smallest are tied; the old block's entry wins a tie (it is replaced only by a clear
    improvement), else the lowest row-major entry, so BLAS rounding never decides. Either way, with
    ``bits=None`` no re-pick increases ``||Y - X D^T||^2``: the old entry re-optimised is no worse than the old
    block, and any other winner beats it by more than the tolerance. With rounding a re-pick may increase it.

    Args:
        z, w: ``(n, n)`` ``Y^T X`` and ``X^T X`` for the codes ``X`` (of ``D``'s input, not of ``A_k``).
        data_energy: ``||Y||_F^2`` (validated; the choices do not depend on it).
        pairs, cores: ``(m, 2)`` and ``(m, 2, 2)``, the current shears/scalings (as returned by this module).
        bits: SOPOT terms per shear, or ``None``.
        on_step: called with no argument after each re-pick (progress reporting).

    Returns:
        New ``pairs`` ``(m, 2)`` int64 and ``cores`` ``(m, 2, 2)`` float64 on ``z``'s device.

    Memory: ``O(sqrt(m) n^2)`` float64; time ``O(n^2 sum_k |C_k|)``, ``|C_k| <= min(n, m - k)`` the columns where
    ``A_k`` differs from the identity (:mod:`~lightning_ortho.transforms.shear_suffixes`).

    Raises:
        ValueError: bad statistics, ``data_energy`` not finite and ``> 0``, blocks that are not shears/scalings on
            valid pairs, or ``bits`` out of range.
    """
    where = "shear_sweep"
    z, w = _check_statistics(z, w, where, rescale=True)
    _check_energy(data_energy, where)
    bits = _check_bits(bits, where)
    n = z.shape[0]
    entries = su.entries_of_blocks(pairs, cores, n, where)
    for k, a_k, columns in suffix_products(entries, n, z.device):
        a_w, m = suffix_statistics(a_k, columns, z, w)
        scale = float((a_w * a_k).sum())  # tr(A_k W_k A_k^T) = ||X_k A_k^T||^2, the scores' magnitude
        old = entries[k][:2]
        entry = _pick(
            m, a_k.square().sum(0), w.diagonal().clone(), bits, rounded_scaling_score=False, scale=scale, incumbent=old
        )
        entries[k] = entry
        su.right_transposed(z, *entry)
        su.left(w, *entry)
        su.right_transposed(w, *entry)
        if on_step is not None:
            on_step()
    return su.blocks_of_entries(entries, n, z.device)


def shear_error(z: torch.Tensor, w: torch.Tensor, data_energy: float | torch.Tensor, dictionary: torch.Tensor) -> float:
    """``100 (||Y||^2 - 2 tr(D^T Z) + tr(D W D^T)) / ||Y||^2 = 100 ||Y - X D^T||_F^2 / ||Y||_F^2`` (percent) from the
    statistics and a dense ``(n, n)`` dictionary ``D`` (float64; the difference may round slightly below 0).

    Raises:
        ValueError: bad statistics or ``data_energy``, or ``D`` not a finite ``(n, n)`` tensor.
    """
    where = "shear_error"
    z, w = _check_statistics(z, w, where)
    energy = _check_energy(data_energy, where)
    if not isinstance(dictionary, torch.Tensor) or dictionary.shape != z.shape:
        raise ValueError(f"{where}: dictionary must be an ({z.shape[0]}, {z.shape[0]}) tensor.")
    d = dictionary.detach().to(device=z.device, dtype=torch.float64)
    if not bool(torch.isfinite(d).all()):
        raise ValueError(f"{where}: dictionary holds NaN or inf.")
    return float(100 * (energy - 2 * (d * z).sum() + ((d @ w) * d).sum()) / energy)


def learn_shear_transform(
    Y: torch.Tensor,  # noqa: N803 - the paper's name
    m: int,
    s: int,
    *,
    bits: int | None = None,
    iterations: int = 15,
    tol: float | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[], object] | None = None,
) -> ShearTransformResult:
    """S-DLA (Rusu, arXiv 1812.03412): ``m`` shears/scalings ``D = S_m ... S_1`` and ``s``-sparse OMP codes.

    Steps (each alternation only through ``z = Y^T X``, ``w = X^T X``, ``||Y||^2``, as a stream would do it):

    1. SVD init, as the author's ``s_dla.m``: ``X <- T_s(Y V)`` with ``V`` the principal basis of ``Y^T Y``
       (:func:`~lightning_ortho.transforms.statistics.principal_basis`, deterministic signs).
    2. :func:`shear_greedy_init` on ``(z, w)`` of these codes; ``X <- omp_codes(Y, D, s)``; ``initial_error``.
    3. ``iterations`` times (the paper's ``K = 15``): :func:`shear_sweep` on ``(z, w, ||Y||^2)`` of the current
       codes, ``X <- omp_codes(Y, D, s)``, record :func:`shear_error`. With ``tol`` given, stop early once two
       consecutive errors differ by at most ``tol`` (percent); the paper has no early stop (``tol=None``).

    OMP is not an exact sparse coder, so the errors need not decrease; each sweep alone does not increase the
    error for its codes when ``bits=None``.

    Args:
        Y: ``(N, n)`` data (float64 internally; outputs in ``Y``'s dtype).
        m: blocks (``>= 1``).
        s: nonzeros per code (``1 <= s <= n``).
        bits: SOPOT terms per shear (``>= 1``; scalings become signed powers of two), or ``None`` for exact values.
        iterations: sweeps (``>= 1``).
        tol: optional early-stop threshold (finite, ``>= 0``).
        generator: unused (the algorithm is deterministic; ties, up to a relative ``TIE_RTOL``, go to the
            old block in a sweep, else to the lowest row-major entry ``(a, b)``, whatever the CPU or BLAS).
        on_step: called with no argument after each block choice, for progress reporting: ``m`` in the greedy
            init, then ``m`` per sweep (``m (1 + iterations)`` in all unless ``tol`` stops the sweeps early).

    Returns:
        :class:`ShearTransformResult`.

    Raises:
        ValueError: ``Y`` not a 2-d floating tensor with ``n >= 2``, ``N >= 1``, finite and not all zero; ``m``,
            ``s``, ``bits``, ``iterations`` or ``tol`` out of range.
    """
    del generator
    where = "learn_shear_transform"
    n = check_training_data(Y, s, where)
    _check_int(m, "m (number of blocks)", where, 1)
    _check_bits(bits, where)
    _check_int(iterations, "iterations (sweeps)", where, 1)
    if tol is not None and (not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 0 <= tol < math.inf):
        raise ValueError(f"{where}: tol must be None or a finite number >= 0 (percent), got {tol!r}.")
    learner = ShearTransformLearner(n, m, s, bits=bits, iterations=iterations, tol=tol, on_step=on_step)
    y = Y.detach().to(torch.float64)
    fit_in_memory(learner, y)
    codes = learner.code(y)
    return ShearTransformResult(learner.transform(Y.dtype), codes.to(Y.dtype), learner.errors, learner.initial_error)


class ShearTransformLearner(PassLearner):
    """S-DLA as one alternation per pass over the data (:class:`~lightning_ortho.transforms.statistics.
    TransformLearner`): what :func:`learn_shear_transform` runs in memory and the Lightning module on a stream.

    Passes: (0) the Gram matrix gives the principal basis ``V`` (codes ``T_s(Y)``: the error of no transform); (1) codes ``T_s(Y V)`` give ``z, w`` for
    :func:`shear_greedy_init`; (2, 3, ...) OMP codes under the current ``D`` give its error (the first one is
    ``initial_error``) and ``z, w, ||Y||^2`` for one :func:`shear_sweep`, until ``iterations`` sweeps (or the
    ``tol`` rule). The last pass only measures. ``on_step`` (no argument) is called after each block choice of the
    greedy init and of the sweeps (progress reporting only, not part of the state).

    Args:
        n: features (``>= 2``).
        m: blocks (``>= 1``).
        s: nonzeros per code (``1 <= s <= n``).
        bits: SOPOT terms per shear (``>= 1``), or ``None`` for exact values.
        iterations: sweeps (``>= 1``).
        tol: optional early-stop threshold (finite, ``>= 0``), as :func:`learn_shear_transform`.
        on_step: called with no argument after each block choice.

    Raises:
        ValueError: ``m``, ``s``, ``bits``, ``iterations`` or ``tol`` out of range.
    """

    def __init__(
        self,
        n: int,
        m: int,
        s: int,
        *,
        bits: int | None = None,
        iterations: int = 15,
        tol: float | None = None,
        on_step: Callable[[], object] | None = None,
    ) -> None:
        where = "learn_shear_transform"
        _check_int(n, "n (features)", where, 2)
        _check_int(m, "m (number of blocks)", where, 1)
        _check_bits(bits, where)
        _check_int(iterations, "iterations (sweeps)", where, 1)
        if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:
            raise ValueError(f"{where}: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
        if tol is not None and (not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 0 <= tol < math.inf):
            raise ValueError(f"{where}: tol must be None or a finite number >= 0 (percent), got {tol!r}.")
        super().__init__(n, s)
        self.m, self.bits, self.iterations, self.tol = m, bits, iterations, tol
        self.on_step = on_step  # progress reporting only: not part of the state
        self.pairs: torch.Tensor | None = None
        self.cores: torch.Tensor | None = None
        self.initial_error = math.nan
        self.errors: list[float] = []

    def transform(self, dtype: torch.dtype = torch.float64) -> BlockProduct:
        """The current ``D = S_m ... S_1`` (no blocks, the identity, before the greedy init)."""
        if self.pairs is None or self.cores is None:
            return BlockProduct(self.n, torch.empty(0, 2, dtype=torch.int64), trainable=False, dtype=dtype)
        return BlockProduct(self.n, self.pairs.cpu(), self.cores.cpu(), trainable=False, dtype=dtype)

    def op_count(self) -> OpCount:
        """Operations of one ``D x``: with ``bits=p`` every shear value costs its SOPOT terms as shifts plus
        additions, scalings one shift; exact values one multiplication each."""
        return self.transform().op_count(self.bits)

    def encode(self, data: torch.Tensor) -> torch.Tensor | None:
        """Codes of a batch ``(B, n)`` for this pass (float64): ``T_s(Y)`` (no transform yet), ``T_s(Y V)`` in
        the principal basis (for the greedy init), then the OMP codes of :meth:`code` under the current ``D``
        (the shears are not orthogonal, so the ``s`` largest entries of ``Y D`` are not the best codes)."""
        if self.basis is None:
            return self.code(data)  # T_s(Y): no transform yet
        if self.pairs is None:
            return keep_largest(data.detach().to(torch.float64) @ self.basis.to(data.device), self.s)
        return self.code(data)

    def code(self, data: torch.Tensor) -> torch.Tensor:
        """OMP codes of a batch ``(B, n)`` under the current ``D`` (float64; ``T_s(Y)``, the same, before any block)."""
        if self.pairs is None:
            return keep_largest(data.detach().to(torch.float64), self.s)
        return omp_codes(data.detach().to(torch.float64), self.dictionary(), self.s)

    def update(self, statistics: TransformStatistics) -> float | None:
        """End of a pass: the next step of S-DLA from the pass's sums; returns the pass's error."""
        if self.finished:
            raise RuntimeError("ShearTransformLearner.update: the learner has finished; start a new one.")
        if self.basis is None:
            error = statistics.error(self.dictionary())  # of T_s(Y): the identity, before any transform
            self.basis = principal_basis(statistics.gram).cpu()
            return error
        z, w = statistics.cross.cpu(), statistics.code_gram.cpu()
        if self.pairs is None:
            error = statistics.error(self.basis)
            self.pairs, self.cores = shear_greedy_init(z, w, self.m, self.bits, self.on_step)
            self._changed()
            return error
        error = statistics.error(self.dictionary())
        if math.isnan(self.initial_error):
            self.initial_error = error
        else:
            self.errors.append(error)
            converged = self.tol is not None and len(self.errors) >= 2
            if len(self.errors) >= self.iterations or (
                converged and abs(self.errors[-1] - self.errors[-2]) <= self.tol
            ):
                self.finished = True
                return error
        assert self.cores is not None
        self.pairs, self.cores = shear_sweep(
            z, w, statistics.data_energy, self.pairs, self.cores, self.bits, self.on_step
        )
        self._changed()
        return error

    STATE = ("pairs", "cores", "initial_error", "errors")
