"""Structured, multiplication-free starting points for :func:`~lightning_ortho.transforms.learn_fast_transform.
learn_fast_transform`: the 2-D 8x8 DCT-II by butterflies and dyadic lifting steps (in the manner of Liang & Tran's
binDCT, "Fast multiplierless approximations of the DCT with the lifting scheme", IEEE TSP 2001) and the
Walsh-Hadamard transform by butterflies.

Factors. A factorisation is a list of factors in application order (factor 0 acts first on ``x``), each either

* a butterfly ``("butterfly", i, j)``: ``x_i <- x_i + x_j``, ``x_j <- x_i - x_j`` (the core ``[[1, 1], [1, -1]]`` of
  Rusu eq. 2 on the pair ``(i, j)``; 2 additions), or
* a shear ``("shear", a, b, v)``: ``x_a <- x_a + v x_b`` (the S-DLA shear of Rusu eq. 17, ``S = I + v e_a e_b^T``);
  with ``v`` a sum of ``k`` signed powers of two (Rusu eq. 4) it costs ``k`` shifts and ``k`` additions
  (``x_a +- x_b``: one addition); ``a = b`` is a scaling ``x_a <- v x_a`` (a power of two: one shift), or
* a tied group ``("tied", ((a_1, b_1), ...), v)``: the shears ``(a_r, b_r, v)`` with one shared ``v``, on
  coordinates where no ``b_r`` is an ``a_s`` (e.g. one 1-D shear on the 8 rows of a patch), so they commute and
  their product is ``I + v sum_r e_{a_r} e_{b_r}^T``, linear in ``v``.

The 1-D 8-point DCT (Chen's factorisation; derived here, not copied): butterflies ``(k, 7 - k)`` give the sums
``a_k`` (coordinates 0..3) and differences ``b_k`` (coordinates 7..4); the even half is two butterflies, a
butterfly for ``X_0, X_4`` and a 2x2 map for ``X_2, X_6``; the odd half rotates ``(b_1, b_2)`` by ``-pi/4``
(three lifting steps ``[1 p; 0 1][1 0; u 1][1 p; 0 1]``, ``p = (cos t - 1) / sin t``, ``u = sin t``: Rusu
property P2), two butterflies, then a 2x2 map for each of ``(X_1, X_7)`` and ``(X_3, X_5)``. Every output 2x2 map
``M`` is written ``M = diag(d) [1 0; l 1] [1 u; 0 1]`` (two shears); the diagonal ``diag(d)`` is left out: it
only scales the outputs (each one a DCT row times a constant), and sparse codes under a dictionary with scaled
atoms absorb it (OMP normalises the atoms). With exact coefficients the rows of the factorisation are the DCT
rows scaled and permuted; with ``bits`` the lifting coefficients are rounded to ``R_bits`` (Algorithm 1), the
binDCT idea. The 2-D transform is separable: the 1-D factors on every patch row, then on every patch column
(patches row-major, coordinate ``8 r + c``), i.e. ``kron(T_1, T_1)``.

Op counts of the 2-D DCT init: 16 x (18 butterfly additions + 9 shears); with 1-term shears 576 operations, each
further term 2 more.
"""

from __future__ import annotations

import math

import torch

from lightning_ortho.transforms import shear_updates as su
from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.sopot import sopot_with_cost

#: One factor: ``("butterfly", i, j)``, ``("shear", a, b, v)`` or ``("tied", ((a_1, b_1), ...), v)`` (module
#: docstring).
Factor = tuple
BUTTERFLY = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)


def _rows_of(factors: list[Factor], size: int) -> torch.Tensor:
    """The ``(size, size)`` float64 matrix ``T`` of the factors (``T x`` applies them in order)."""
    t = torch.eye(size, dtype=torch.float64)
    for factor in factors:
        if factor[0] == "butterfly":
            _, i, j = factor
            t[i], t[j] = t[i] + t[j], t[i] - t[j]
        else:
            _, a, b, v = factor
            t[a] = t[a] + v * t[b]
    return t


def dct_rows(size: int = 8) -> torch.Tensor:
    """The orthonormal DCT-II ``(size, size)`` float64, row ``k`` = frequency ``k``."""
    k = torch.arange(size, dtype=torch.float64)
    c = torch.cos(math.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * size)) * math.sqrt(2 / size)
    c[0] /= math.sqrt(2)
    return c


def _output_shears(current: torch.Tensor, i: int, j: int, targets: torch.Tensor) -> list[Factor]:
    """Two shears taking rows ``i, j`` of ``current`` to the two ``targets`` rows up to scale: the 2x2 ``M`` with
    ``M [t_i; t_j] = targets`` is ``diag(d) [1 0; l 1] [1 u; 0 1]``, ``u = M_01 / M_00``, ``d_2 = M_11 - M_10 u``,
    ``l = M_10 / d_2``; the target order is chosen so that ``|M_00|`` is the larger."""
    basis = torch.stack([current[i], current[j]])
    m = torch.linalg.lstsq(basis.T, targets.T).solution.T  # m @ basis = targets
    if float((m @ basis - targets).abs().max()) > 1e-9:
        raise AssertionError("the DCT factorisation does not span its target rows")  # a bug, not bad input
    if abs(float(m[1, 0])) > abs(float(m[0, 0])):
        m = m.flip(0)
    u = float(m[0, 1] / m[0, 0])
    d2 = float(m[1, 1] - m[1, 0] * u)
    return [("shear", i, j, u), ("shear", j, i, float(m[1, 0]) / d2)]


def dct_lifting_1d() -> list[Factor]:
    """Exact (unrounded) butterflies and lifting shears of the 8-point DCT-II (module docstring): 18 factors whose
    matrix has rows ``d_k C[f_k]`` (``C`` the orthonormal DCT, ``f`` a permutation, ``d_k != 0``)."""
    factors: list[Factor] = [("butterfly", k, 7 - k) for k in range(4)]  # a_k at k, b_k at 7 - k
    factors += [("butterfly", 0, 3), ("butterfly", 1, 2), ("butterfly", 0, 1)]  # X0, X4 at 0, 1
    angle = -math.pi / 4  # (b1, b2) at (6, 5) -> (r (b1 + b2), r (b2 - b1)) by three lifting steps
    p, u = (math.cos(angle) - 1) / math.sin(angle), math.sin(angle)
    factors += [("shear", 6, 5, p), ("shear", 5, 6, u), ("shear", 6, 5, p)]
    factors += [("butterfly", 7, 6), ("butterfly", 4, 5)]  # b0 +- r (b1 + b2), b3 +- r (b2 - b1)
    dct = dct_rows(8)
    current = _rows_of(factors, 8)
    factors += _output_shears(current, 3, 2, dct[[2, 6]])
    for i, j in ((7, 5), (6, 4)):  # (b0 + r (b1 + b2), b3 + r (b1 - b2)) and (b0 - ..., b3 - ...)
        pair = torch.stack([current[i], current[j]])
        odd = [
            f
            for f in (1, 3, 5, 7)
            if float((pair.T @ torch.linalg.lstsq(pair.T, dct[f]).solution - dct[f]).abs().max()) < 1e-9
        ]
        factors += _output_shears(current, i, j, dct[odd])
    return factors


def round_factors(factors: list[Factor], terms: list[int]) -> list[Factor]:
    """The factors with shear ``k`` (counted among shears only) rounded to ``terms[k]`` SOPOT terms (Algorithm 1,
    ``tol = 0``); butterflies unchanged."""
    out, k = [], 0
    for factor in factors:
        if factor[0] == "shear":
            value = sopot_with_cost(torch.tensor(factor[3], dtype=torch.float64), terms[k], tol=0.0).values
            out.append(("shear", factor[1], factor[2], float(value)))
            k += 1
        else:
            out.append(factor)
    return out


def dyadic_dct_1d(bits: int | None, extra_terms: int = 0) -> list[Factor]:
    """The 1-D binDCT-style factors with dyadic coefficients: every shear rounded to 1 SOPOT term, then the
    ``extra_terms`` further terms given one at a time to the shear whose rounding error ``|v - v_hat|`` is then
    the largest, each up to ``bits`` terms (``bits=None``: exact coefficients, ``extra_terms`` ignored)."""
    exact = dct_lifting_1d()
    if bits is None:
        return exact
    values = [f[3] for f in exact if f[0] == "shear"]
    terms = [1] * len(values)

    def error(k: int, t: int) -> float:
        return abs(values[k] - float(sopot_with_cost(torch.tensor(values[k]), t, tol=0.0).values))

    for _ in range(extra_terms):
        open_ = [k for k in range(len(values)) if terms[k] < bits and error(k, terms[k]) > 0]
        if not open_:
            break
        k = max(open_, key=lambda k: error(k, terms[k]))
        terms[k] += 1
    return round_factors(exact, terms)


def separable_2d(factors: list[Factor], size: int = 8, *, tied: bool = False) -> list[Factor]:
    """The 1-D factors on every row of a row-major ``size x size`` patch (coordinate ``size r + c``), then on every
    column: the factors of ``kron(T_1, T_1)``, each 1-D factor on all ``size`` lines before the next (lines are
    disjoint, so this order gives the same product). ``tied``: the ``size`` copies of each shear are one tied
    group (a separable transform stays separable when the group is updated)."""
    out: list[Factor] = []
    for stride, base in ((1, lambda r: size * r), (size, lambda c: c)):
        for factor in factors:
            if factor[0] == "butterfly":
                out += [("butterfly", base(r) + stride * factor[1], base(r) + stride * factor[2]) for r in range(size)]
                continue
            _, a, b, v = factor
            entries = tuple((base(r) + stride * a, base(r) + stride * b) for r in range(size))
            out += [("tied", entries, v)] if tied else [("shear", i, j, v) for i, j in entries]
    return out


def dct_2d_factors(bits: int | None, max_ops: int | None = None, *, tied: bool = False) -> list[Factor]:
    """Factors of the separable 2-D 8x8 binDCT-style transform (``n = 64``), coefficients in ``R_bits``; the SOPOT
    terms beyond one per shear are given while the op count stays within ``max_ops`` (each term of the 1-D
    factorisation costs 2 operations in each of its 16 copies; ``None``: every shear gets ``bits`` terms).

    Raises:
        ValueError: ``bits`` is not ``None`` or an int ``>= 1``; ``max_ops`` is below the 1-term count (576).
    """
    if bits is not None and (not isinstance(bits, int) or isinstance(bits, bool) or bits < 1):
        raise ValueError(f"dct_2d_factors: bits must be None or an int >= 1 (SOPOT terms per shear), got {bits!r}.")
    base = 16 * (18 + 2 * 9)
    if max_ops is not None and max_ops < base:
        raise ValueError(f"dct_2d_factors: max_ops must be at least {base} (the 1-term binDCT), got {max_ops}.")
    extra = 9 * ((bits or 1) - 1) if max_ops is None else (max_ops - base) // 32
    return separable_2d(dyadic_dct_1d(bits, extra), tied=tied)


def wht_factors(n: int) -> list[Factor]:
    """Butterflies ``(i, i + 2^t)`` for ``t = 0..log2(n) - 1``: their product is Sylvester's Hadamard matrix
    ``H_n`` exactly (``n log2 n`` additions, no shifts; ``H_n / sqrt(n)`` is the orthonormal WHT).

    Raises:
        ValueError: ``n`` is not a power of two ``>= 2``.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n & (n - 1):
        raise ValueError(f"wht_factors: n must be a power of two >= 2, got {n!r}.")
    return [("butterfly", i, i + (1 << t)) for t in range(int(math.log2(n))) for i in range(n) if not i >> t & 1]


def factors_matrix(factors: list[Factor], n: int) -> torch.Tensor:
    """Dense ``(n, n)`` float64 ``T`` of the factors, ``T x`` = the factors applied in order (a reference)."""
    return _rows_of(factors, n)


# ---------------------------------------------------------------------------------------------- factor algebra
def _entries(factor: Factor) -> list[tuple[int, int, float]]:
    """The shears/scalings ``(a, b, v)`` of an entry factor or a tied group."""
    if factor[0] == "tied":
        return [(a, b, factor[2]) for a, b in factor[1]]
    return [(factor[1], factor[2], factor[3])]


def entry_cost(a: int, b: int, v: float) -> int:
    """Operations of ``x_a <- x_a + v x_b`` (``a != b``) or ``x_a <- v x_a`` (``a = b``) with ``v`` in ``R_p``:
    nothing for ``v = 0`` (shear) or ``|v| = 1`` (scaling); 1 for ``x_a +- x_b`` or a power-of-two scaling;
    ``2 k`` for a ``k``-term shear (``k`` shifts, ``k - 1`` additions, the addition into ``x_a``)."""
    if a == b:
        return 0 if abs(v) == 1.0 else 1
    if v == 0.0:
        return 0
    if abs(v) == 1.0:
        return 1
    return 2 * int(sopot_with_cost(torch.tensor(abs(v), dtype=torch.float64), 64, tol=0.0).shifts)


def factor_cost(factor: Factor) -> int:
    """Operations (additions + shifts) of one factor: a butterfly 2, an entry or tied group by :func:`entry_cost`."""
    if factor[0] == "butterfly":
        return 2
    return sum(entry_cost(*entry) for entry in _entries(factor))


def apply_left(matrix: torch.Tensor, factor: Factor) -> None:
    """``matrix <- F matrix`` in place."""
    if factor[0] == "butterfly":
        _, i, j = factor
        matrix[i], matrix[j] = matrix[i] + matrix[j], matrix[i] - matrix[j]
    else:
        for entry in _entries(factor):
            su.left(matrix, *entry)


def apply_right_transposed(matrix: torch.Tensor, factor: Factor) -> None:
    """``matrix <- matrix F^T`` in place."""
    if factor[0] == "butterfly":
        _, i, j = factor
        matrix[:, i], matrix[:, j] = matrix[:, i] + matrix[:, j], matrix[:, i] - matrix[:, j]
    else:
        for entry in _entries(factor):
            su.right_transposed(matrix, *entry)


def apply_right(matrix: torch.Tensor, factor: Factor) -> None:
    """``matrix <- matrix F`` in place (a butterfly is symmetric; the shears of a tied group commute)."""
    if factor[0] == "butterfly":
        apply_right_transposed(matrix, factor)
    else:
        for entry in _entries(factor):
            su.right(matrix, *entry)


def factors_to_blocks(factors: list[Factor], n: int, dtype: torch.dtype = torch.float64) -> BlockProduct:
    """The factors as a non-trainable :class:`BlockProduct` (``matrix() = F_{m-1} ... F_0``; a tied group is its
    shears, a shear or scaling the block of :func:`~lightning_ortho.transforms.shear_updates.block_of_entry`)."""
    pairs, cores = [], []
    for factor in factors:
        if factor[0] == "butterfly":
            pairs.append((factor[1], factor[2]))
            cores.append(BUTTERFLY.tolist())
            continue
        for entry in _entries(factor):
            pair, core = su.block_of_entry(n, *entry)
            pairs.append(pair)
            cores.append(core)
    return BlockProduct(n, pairs, torch.tensor(cores, dtype=torch.float64).view(-1, 2, 2).to(dtype), trainable=False)


def transposed(factors: list[Factor]) -> list[Factor]:
    """Factors of ``T^T`` for the factors of ``T``: order reversed, each factor transposed."""
    out: list[Factor] = []
    for f in reversed(factors):
        if f[0] == "butterfly":
            out.append(f)
        elif f[0] == "tied":
            out.append(("tied", tuple((b, a) for a, b in f[1]), f[2]))
        else:
            out.append(("shear", f[2], f[1], f[3]))
    return out


def with_free_slots(factors: list[Factor], count: int) -> list[Factor]:
    """``factors`` with ``count`` empty shears (``v = 0``: the identity, cost 0) inserted at evenly spaced
    positions; a sweep may turn each into any shear or scaling the budget allows."""
    out = list(factors)
    m = len(factors)
    for t in range(count, 0, -1):  # from the back, so earlier positions stay valid
        out.insert(round(t * m / (count + 1)), ("shear", 0, 1, 0.0))
    return out
