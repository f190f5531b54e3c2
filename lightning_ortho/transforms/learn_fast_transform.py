"""Refine a structured multiplication-free transform on data: butterflies and dyadic shears/scalings, each factor
re-optimised exactly with the others fixed (the S-DLA update of Rusu, arXiv 1812.03412, eqs. 21-23), within an
operation budget.

Orientation as S-DLA (:mod:`~lightning_ortho.transforms.s_dla`): batch-first ``Y`` ``(N, n)`` and codes ``X``,
``Y ~ X D^T`` with the dictionary ``D = F_{m-1} ... F_0`` a product of factors (factor 0 acts first). A factor is a
butterfly (core ``[[1, 1], [1, -1]]`` on a pair, 2 additions, kept fixed) or an entry ``S = I + v e_a e_b^T``:
a shear (``a != b``, ``v`` in ``R_bits``, Rusu eq. 4: ``k`` terms cost ``k`` shifts and ``k - 1`` additions, plus
the addition into ``x_a``), a scaling (``a = b``, ``g = sign(g) 2^e``: one shift, none for ``+-1``) or nothing
(``v = 0``), or a tied group of commuting shears sharing one ``v`` (``tied=True``: the separable DCT's 1-D shears;
its change in ``v`` is the quadratic of :func:`tied_coefficients`, and only ``v`` is re-picked).

Starting points (``init``): ``"dct"``, the transpose of the separable binDCT-style factorisation of the 8x8 DCT
(:mod:`~lightning_ortho.transforms.fast_transform_init`, ``n = 64``: its atoms are the DCT's up to scale);
``"wht"``, the butterflies of ``H_n``; ``"identity"`` and ``"pca"``, S-DLA's greedy shears (Rusu eqs. 18-20) from
the codes ``T_s(Y)`` or ``T_s(Y V)`` (``V`` the principal basis).

One sweep (codes fixed; ``Z = Y^T X``, ``W = X^T X``): for ``k = 0..m-1``, ``A_k = F_{m-1} ... F_{k+1}`` and
``P_k = F_{k-1} ... F_0`` (already updated), ``Z_k = Z P_k^T``, ``W_k = P_k W P_k^T``. An entry factor is removed
and, with ``M = A_k^T (Z_k - A_k W_k)``, setting entry ``(a, b)`` to ``v`` changes ``||Y - X D^T||^2`` by exactly

    -2 v M_ab + v^2 ||A_k e_a||^2 (W_k)_bb

(for a scaling ``v = g - 1``). Every shear at every position with its optimum rounded to ``1..bits`` SOPOT terms
(the prefixes of Algorithm 1's expansion), every power-of-two scaling, and "nothing" are scored by this exact
change; among those whose cost keeps the transform's total within the budget the best replaces the old factor
only if it is better by more than ``TIE_RTOL`` of ``||Y||^2``. So no sweep increases the error for the codes it
started from. Codes are then OMP (:func:`~lightning_ortho.transforms.sparse_codes.omp_codes`), kept per sample
only where they lower that sample's error: the recorded error never increases from sweep to sweep.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning
from lightning_ortho.transforms import shear_updates as su
from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.fast_transform_init import (
    Factor,
    apply_left,
    apply_right,
    apply_right_transposed,
    dct_2d_factors,
    factor_cost,
    factors_to_blocks,
    transposed,
    wht_factors,
    with_free_slots,
)
from lightning_ortho.transforms.s_dla import shear_greedy_init
from lightning_ortho.transforms.sopot import sopot_with_cost
from lightning_ortho.transforms.sparse_codes import check_training_data, keep_largest, omp_codes
from lightning_ortho.transforms.statistics import principal_basis

INITS = ("dct", "wht", "identity", "pca")
#: One 8-point DCT-II by Loeffler, Ligtenberg & Moschytz (ICASSP 1989, "Practical fast 1-D DCT algorithms with 11
#: multiplications"); its outputs are ``sqrt(8)`` times the orthonormal DCT's.
LLM_8_POINT = OpCount(additions=29, multiplications=11)


def fast_dct_op_count(n: int) -> OpCount | None:
    """Operations of the fast orthonormal DCT-II of ``n`` features, the transform a learned one is compared with
    (and the default budget of :func:`learn_fast_transform`); ``None`` where none is counted here.

    * ``n = 8`` (a line of 8 samples): one 8-point LLM DCT (29 additions + 11 multiplications) and its
      normalisation by ``1 / sqrt(8)``, not a power of two (8 multiplications): 48 operations.
    * ``n = 64`` (an 8x8 patch, row-major): the separable 2-D DCT, row-column, 16 LLM DCTs (464 additions + 176
      multiplications) and the normalisation of their ``8x`` scale, one 3-bit shift per coefficient (64): 704.

    Both are the count of :data:`LLM_8_POINT` times the number of 1-D transforms, plus one operation per
    coefficient for the normalisation; other ``n`` have no such count (the LLM algorithm is 8-point).
    """
    if n == 8:
        return LLM_8_POINT + OpCount(multiplications=8)
    if n == 64:
        return 16 * LLM_8_POINT + OpCount(shifts=64)
    return None


def dense_op_count(n: int) -> OpCount:
    """Operations of the dense ``(n, n)`` matrix-vector product: ``n^2`` multiplications + ``n (n - 1)`` additions."""
    return OpCount(additions=n * (n - 1), multiplications=n * n)


#: The op budget at n = 64: the 8x8 DCT's count (:func:`fast_dct_op_count`), 464 + 176 + 64.
DCT_OPS = fast_dct_op_count(64).total  # type: ignore[union-attr]
#: A re-pick must beat the old factor by more than this fraction of ``||Y||^2`` (else rounding noise decides).
TIE_RTOL = 1e-12


@dataclass
class FastTransformResult:
    """Output of :func:`learn_fast_transform`.

    Attributes:
        transform: the dictionary ``D`` (a non-trainable :class:`BlockProduct`, dtype of ``Y``); ``D(x)`` is
            ``x @ D.matrix().T``; ``Y ~ codes @ D^T``.
        codes: ``(N, n)`` codes with at most ``s`` nonzeros per row.
        errors: ``100 ||Y - X D^T||^2 / ||Y||^2`` (percent) after each sweep and its code update.
        initial_error: the error of the initial transform with OMP codes.
        bits: SOPOT terms allowed per shear.
        budget: the operation budget the sweeps kept to.
    """

    transform: BlockProduct
    codes: torch.Tensor
    errors: list[float] = field(default_factory=list)
    initial_error: float = math.nan
    bits: int = 1
    budget: int = 0

    def op_count(self) -> OpCount:
        """Additions, multiplications and shifts of one ``D x`` (:meth:`BlockProduct.op_count` with ``terms=bits``:
        a ``k``-term shear ``k`` shifts + ``k`` additions, a butterfly 2 additions, a power-of-two scaling 1 shift)."""
        return self.transform.op_count(self.bits)


# ------------------------------------------------------------------------------------------------------ sweep
def _sopot_prefixes(values: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bits, *S)`` values of the first ``1..bits`` greedy SOPOT terms of ``values`` and their term counts."""
    expansion = sopot_with_cost(values, bits, tol=0.0)
    terms = expansion.signs.to(values.dtype) * torch.ldexp(
        torch.ones_like(expansion.signs, dtype=values.dtype), expansion.exponents
    )
    prefixes = terms.cumsum(-1).movedim(-1, 0)
    counts = (expansion.signs != 0).cumsum(-1).movedim(-1, 0)
    return prefixes, counts


def entry_statistics(
    a_k: torch.Tensor, z_k: torch.Tensor, w_k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(M, ||A_k e_a||^2, (W_k)_bb)`` for factor ``k`` (Rusu eqs. 21-23): with ``D = A_k S P_k``, ``Z_k = Z P_k^T``,
    ``W_k = P_k W P_k^T`` and ``S = I + v e_a e_b^T``, ``||Y - X D^T||^2`` exceeds its value at ``S = I`` by
    ``-2 v M_ab + v^2 ||A_k e_a||^2 (W_k)_bb`` with ``M = A_k^T (Z_k - A_k W_k)``. All ``(n, n)`` / ``(n,)``."""
    return a_k.T @ (z_k - a_k @ w_k), a_k.square().sum(0), w_k.diagonal().clone()


def tied_coefficients(
    a_k: torch.Tensor, z_k: torch.Tensor, w_k: torch.Tensor, entries: tuple[tuple[int, int], ...]
) -> tuple[float, float]:
    """``(l, q)`` of a tied group ``S = I + v L``, ``L = sum_r e_{a_r} e_{b_r}^T`` at factor ``k``: setting its
    ``v`` changes ``||Y - X D^T||^2`` (from its value at ``S = I``) by exactly ``-2 v l + v^2 q``, with
    ``l = sum_r M_{a_r b_r}`` (``M`` of :func:`entry_statistics`) and ``q = ||A_k L X_k^T||^2 =
    sum_{r,s} (A_k^T A_k)_{a_r a_s} (W_k)_{b_r b_s}``."""
    rows = torch.tensor([a for a, _ in entries], device=a_k.device)
    cols = torch.tensor([b for _, b in entries], device=a_k.device)
    m = a_k[:, rows].T @ (z_k[:, cols] - a_k @ w_k[:, cols])  # M[a_r, b_s]
    gram = a_k[:, rows].T @ a_k[:, rows]
    return float(m.diagonal().sum()), float((gram * w_k[cols][:, cols]).sum())


def _repick_tied(
    factor: Factor, a_k: torch.Tensor, z_k: torch.Tensor, w_k: torch.Tensor, bits: int, slack: int
) -> tuple[float, float, Factor, int]:
    """``(old change, best change, best factor, its cost)`` for a tied group (same coordinates, any ``v`` in
    ``R_bits`` whose cost fits ``slack``, or ``v = 0``)."""
    _, entries, v = factor
    linear, curvature = tied_coefficients(a_k, z_k, w_k, entries)
    old = -2 * v * linear + v * v * curvature
    best = (0.0, ("tied", entries, 0.0), 0)
    if curvature > 0:
        prefixes, _ = _sopot_prefixes(torch.tensor(linear / curvature, dtype=torch.float64), bits)
        for value in prefixes.tolist():
            candidate = ("tied", entries, value)
            cost = factor_cost(candidate)
            change = -2 * value * linear + value * value * curvature
            if value != 0 and cost <= slack and change < best[0]:
                best = (change, candidate, cost)
    return old, *best


def _repick_entry(
    factor: Factor, a_k: torch.Tensor, z_k: torch.Tensor, w_k: torch.Tensor, bits: int, slack: int
) -> tuple[float, float, Factor, int]:
    """``(old change, best change, best factor, its cost)`` for a shear/scaling: every shear at every position
    rounded to ``1..bits`` terms, every power-of-two scaling, or nothing, among those whose cost fits ``slack``."""
    n = z_k.shape[0]
    m_k, a_norms, x_norms = entry_statistics(a_k, z_k, w_k)
    curvature = a_norms[:, None] * x_norms[None, :]
    values, _ = su.entry_optima(m_k, a_norms, x_norms)
    _, a, b, v = factor
    old_v = v - 1 if a == b else v
    old = float(-2 * old_v * m_k[a, b] + old_v**2 * curvature[a, b])
    best = (0.0, ("shear", a, b if a != b else (a + 1) % n, 0.0), 0)  # "nothing"
    prefixes, counts = _sopot_prefixes(values, bits)
    change = -2 * prefixes * m_k + prefixes.square() * curvature
    costs = torch.where(prefixes.abs() == 1, 1, 2 * counts)
    off = ~torch.eye(n, dtype=torch.bool, device=z_k.device)
    change = change.masked_fill(~(off & (costs <= slack) & (prefixes != 0)), math.inf)
    flat = int(change.argmin())
    t, rest = divmod(flat, n * n)
    if float(change.flatten()[flat]) < best[0]:
        i, j = divmod(rest, n)
        best = (float(change[t, i, j]), ("shear", i, j, float(prefixes[t, i, j])), int(costs[t, i, j]))
    if slack >= 1:
        g = su.round_scaling(1 + values.diagonal(), bits)
        scale_change = su.scaling_decrease(m_k.diagonal(), a_norms, x_norms, g)
        scale_change = scale_change.masked_fill(g.abs() <= su.MIN_SCALE, math.inf)
        i = int(scale_change.argmin())
        if float(scale_change[i]) < best[0]:
            best = (float(scale_change[i]), ("shear", i, i, float(g[i])), 0 if abs(float(g[i])) == 1 else 1)
    return old, *best


def fast_transform_sweep(
    z: torch.Tensor, w: torch.Tensor, energy: float, factors: list[Factor], bits: int, budget: int
) -> list[Factor]:
    """One exact update sweep (module docstring) of ``factors`` for the statistics ``z = Y^T X``, ``w = X^T X``
    (``(n, n)`` float64, not modified) and ``energy = ||Y||^2``; returns the new factors, total cost <= ``budget``
    if it was before. Butterflies stay; a tied group keeps its coordinates and re-picks its shared ``v``."""
    n = z.shape[0]
    factors = list(factors)
    m = len(factors)
    suffixes = torch.empty(m, n, n, dtype=torch.float64, device=z.device)
    product = torch.eye(n, dtype=torch.float64, device=z.device)
    for k in range(m - 1, -1, -1):
        suffixes[k] = product
        apply_right(product, factors[k])
    total = sum(factor_cost(f) for f in factors)
    zk, wk = z.clone(), w.clone()
    for k in range(m):
        factor = factors[k]
        if factor[0] != "butterfly":
            old_cost = factor_cost(factor)
            slack = budget - (total - old_cost)
            repick = _repick_tied if factor[0] == "tied" else _repick_entry
            old, change, candidate, cost = repick(factor, suffixes[k], zk, wk, bits, slack)
            if change < old - TIE_RTOL * energy:
                factor = factors[k] = candidate
                total += cost - old_cost
        apply_right_transposed(zk, factor)
        apply_left(wk, factor)
        apply_right_transposed(wk, factor)
    return factors


# ---------------------------------------------------------------------------------------------------- learner
def _check(
    y: object,
    s: object,
    init: object,
    bits: object,
    iterations: object,
    max_ops: object,
    free_slots: object,
    init_bits: object,
) -> int:
    where = "learn_fast_transform"
    n = check_training_data(y, s, where)
    if init not in INITS:
        raise ValueError(f"{where}: init must be one of {INITS}, got {init!r}.")
    if init == "dct" and n != 64:
        raise ValueError(f"{where}: init='dct' is the 8x8 DCT and needs n = 64 features (8x8 patches), got n = {n}.")
    if init == "wht" and n & (n - 1):
        raise ValueError(f"{where}: init='wht' needs n a power of two, got n = {n}; use init='identity' or 'pca'.")
    for name, value, low in (
        ("bits", bits, 1),
        ("iterations", iterations, 0),
        ("free_slots", free_slots, 0),
        ("init_bits", init_bits, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{where}: {name} must be an int >= {low}, got {value!r}.")
    if max_ops is not None and (not isinstance(max_ops, int) or isinstance(max_ops, bool) or max_ops < 1):
        raise ValueError(f"{where}: max_ops must be None or an int >= 1 (operations per transform), got {max_ops!r}.")
    if max_ops is None and fast_dct_op_count(n) is None:
        dense = dense_op_count(n)
        raise ValueError(
            f"{where}: max_ops=None takes the budget from the fast DCT of n features, counted for n = 8 "
            f"({fast_dct_op_count(8).total}) and n = 64 ({DCT_OPS}) only, got n = {n}: give max_ops, the operations "
            f"(additions + shifts) the transform may cost, below the {dense.total} of the dense {n}x{n} matrix "
            f"({dense.multiplications} multiplications + {dense.additions} additions) for it to be worth having."
        )
    return n


def _default_budget(n: int, max_ops: int | None) -> int:
    """``max_ops``, or the fast DCT's count at ``n`` (the argument check has refused ``None`` where there is none)."""
    return max_ops if max_ops is not None else fast_dct_op_count(n).total  # type: ignore[union-attr]


def _initial_factors(
    y: torch.Tensor, s: int, init: str, bits: int, max_ops: int | None, init_bits: int, tied: bool
) -> list[Factor]:
    n = y.shape[1]
    if init == "dct":
        return transposed(dct_2d_factors(min(init_bits, bits), _default_budget(n, max_ops), tied=tied))
    if init == "wht":
        return wht_factors(n)
    budget = _default_budget(n, max_ops)
    codes = keep_largest(y if init == "identity" else y @ principal_basis(y.T @ y), s)
    pairs, cores = shear_greedy_init(y.T @ codes, codes.T @ codes, max(1, budget // (2 * bits)), bits)
    return [("shear", a, b, v) for a, b, v in su.entries_of_blocks(pairs, cores, n, "learn_fast_transform")]


def _better_codes(y: torch.Tensor, d: torch.Tensor, old: torch.Tensor | None, s: int) -> torch.Tensor:
    """OMP codes for ``D``, each sample keeping its ``old`` code where that one's error is lower."""
    new = omp_codes(y, d, s)
    if old is None:
        return new
    worse = (y - new @ d.T).square().sum(1) > (y - old @ d.T).square().sum(1)
    return torch.where(worse[:, None], old, new)


def learn_fast_transform(
    Y: torch.Tensor,  # noqa: N803 - the paper's name
    s: int,
    *,
    init: str = "dct",
    bits: int = 2,
    iterations: int = 10,
    max_ops: int | None = None,
    free_slots: int | None = None,
    init_bits: int = 1,
    tied: bool = False,
    sweeps: int | None = None,
) -> FastTransformResult:
    """Learn a multiplication-free ``D`` (butterflies, dyadic shears and scalings) and ``s``-sparse codes from a
    structured start (module docstring).

    Args:
        Y: ``(N, n)`` data (float64 internally; outputs in ``Y``'s dtype); ``n = 64`` for ``init="dct"``.
        s: nonzeros per code.
        init: ``"dct"``, ``"wht"``, ``"identity"`` or ``"pca"``.
        bits: SOPOT terms per shear coefficient (``>= 1``).
        iterations: update sweeps (``>= 0``; the name the family table, :func:`compress_linear` and the other
            learners use).
        max_ops: operation budget (additions + shifts). ``None``: the fast DCT's count at this ``n``
            (:func:`fast_dct_op_count`: 48 at ``n = 8``, 704 at ``n = 64``; any other ``n`` must give it), or the
            init's own count when that is larger (the WHT's butterflies). The sweeps never exceed
            ``max(budget, the init's count)``.
        free_slots: empty shears inserted evenly into the start for the sweeps to fill (:func:`with_free_slots`);
            ``None``: as many as the budget left by the start pays for at one term each, ``(budget - count) // 2``.
        init_bits: SOPOT terms of the DCT start's lifting coefficients (at most ``bits``; terms beyond one are
            given only while the budget allows, :func:`~lightning_ortho.transforms.fast_transform_init.
            dct_2d_factors`). The default 1 leaves 128 of the 704 operations to the free slots, for the data to place;
            on the sample photographs (s = 4, 10 sweeps) the starts with 1 and 2 terms end at about the same
            error.
        tied: ``init="dct"`` only: each 1-D lifting shear keeps one coefficient over the 8 rows (or columns) of
            the patch (a tied group), so the refined shears stay separable (fewer parameters, for data unlike
            the training data); the free slots stay untied.
        sweeps: deprecated name of ``iterations`` (warns ``LightningOrthoDeprecationWarning``; removed in the next release).

    Returns:
        :class:`FastTransformResult`; ``op_count().multiplications == 0``.

    Raises:
        ValueError: bad ``Y`` or ``s``; unknown ``init``; ``init="dct"`` with ``n != 64`` or ``"wht"`` with ``n``
            not a power of two; ``bits``, ``iterations``, ``max_ops``, ``free_slots`` or ``init_bits`` out of range
            (``max_ops`` below 576 for ``init="dct"``); ``max_ops=None`` at an ``n`` without a fast DCT count.

    Warns:
        UserWarning: the learned transform costs more operations (additions + shifts) than the dense ``n x n``
            matrix product (:func:`dense_op_count`, ``2 n^2 - n``); the message names both counts.
    """
    if sweeps is not None:
        warnings.warn(
            "learn_fast_transform: 'sweeps' is deprecated and will be removed in the next release; use 'iterations' "
            f"(the vocabulary of the other learners): iterations={sweeps}.",
            LightningOrthoDeprecationWarning,
            stacklevel=2,
        )
        iterations = sweeps
    n = _check(Y, s, init, bits, iterations, max_ops, 0 if free_slots is None else free_slots, init_bits)
    y = Y.detach().to(torch.float64)
    factors = _initial_factors(y, s, init, bits, max_ops, init_bits, bool(tied))
    start_cost = sum(factor_cost(f) for f in factors)
    budget = max(_default_budget(n, max_ops), start_cost)
    factors = with_free_slots(factors, (budget - start_cost) // 2 if free_slots is None else free_slots)
    energy = float(y.square().sum())
    d = factors_to_blocks(factors, n).matrix()
    codes = _better_codes(y, d, None, s)
    initial = float(100 * (y - codes @ d.T).square().sum() / energy)
    errors = []
    for _ in range(iterations):
        factors = fast_transform_sweep(y.T @ codes, codes.T @ codes, energy, factors, bits, budget)
        d = factors_to_blocks(factors, n).matrix()
        codes = _better_codes(y, d, codes, s)
        errors.append(float(100 * (y - codes @ d.T).square().sum() / energy))
    transform = factors_to_blocks(factors, n, Y.dtype)
    result = FastTransformResult(transform, codes.to(Y.dtype), errors, initial, bits, budget)
    ops, dense = result.op_count(), dense_op_count(n)
    if ops.total > dense.total:
        warnings.warn(
            f"learn_fast_transform: the learned transform costs {ops.total} operations ({ops.additions} additions + "
            f"{ops.shifts} shifts) per vector, more than the {dense.total} of the dense {n}x{n} matrix "
            f"({dense.multiplications} multiplications + {dense.additions} additions): it is not a fast transform "
            f"at this n. Give max_ops below {dense.total} (the budget was {budget}), or use the dense matrix.",
            UserWarning,
            stacklevel=2,
        )
    return result
