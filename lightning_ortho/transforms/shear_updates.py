"""Closed forms of S-DLA (Rusu, arXiv 1812.03412, eqs. 17-23): the best single shear or scaling, its rounding, and its
place in a :class:`~lightning_ortho.transforms.blocks.BlockProduct`.

Entry form. Every shear or scaling is ``S = I + L`` with ``L`` one entry: ``L = v e_a e_b^T``. An off-diagonal
entry ``a != b`` is a shear (``y_a += v x_b``): the lower shear ``[1 0; b 1]`` on the pair ``(i, j) = (b, a)``
when ``a > b`` and the upper shear ``[1 c; 0 1]`` on ``(i, j) = (a, b)`` when ``a < b``; so the paper's
``t in {1, 2}`` over ``i < j`` is exactly the set of off-diagonal entries. A diagonal entry ``a = b`` is a
scaling of coordinate ``a`` by ``g = 1 + v`` (core ``[g 0; 0 1]`` on the pair ``(a, (a + 1) mod n)``).

One entry with everything else fixed (eqs. 21-23, paper orientation ``Y_p ~ A S X_k``, ``F = Y_p - A X_k``):

    ||F - v a_a x_b^T||_F^2 = ||F||^2 - 2 v M_ab + v^2 ||a_a||^2 ||x_b||^2,   M = A^T F X_k^T,

with ``a_a`` column ``a`` of ``A`` and ``x_b^T`` row ``b`` of ``X_k``; the optimum is ``v = M_ab / (||a_a||^2
||x_b||^2)`` and the decrease ``-M_ab^2 / (||a_a||^2 ||x_b||^2)`` (``M_ab = f^T (x_b (x) a_a)`` of the paper).
With ``Z_k = Y_p X_k^T`` and ``W_k = X_k X_k^T``: ``M = A^T Z_k - A^T A W_k`` and ``||x_b||^2 = (W_k)_bb``. For
the greedy init ``A = I`` and this is eqs. (18)-(20): ``b_opt = (Z_ji - W_ij)/W_ii`` (entry ``(j, i)``),
``c_opt = (Z_ij - W_ji)/W_jj`` (entry ``(i, j)``), ``g_opt = Z_ii/W_ii`` with decrease
``-2(g - 1) Z_ii + (g^2 - 1) W_ii`` at any ``g``.
"""

from __future__ import annotations

import math

import torch

from lightning_ortho.transforms.sopot import sopot

#: One shear or scaling ``(a, b, value)``: ``S = I + v e_a e_b^T``, value ``v`` (shear) or ``g`` (``a = b``).
Entry = tuple[int, int, float]

#: Scalings with ``|g|`` at most this are never candidates: they would make the transform (numerically) singular.
MIN_SCALE = 1e-12

#: Scores within ``TIE_RTOL * max(|best|, scale)`` of the best are ties (:func:`stable_argmin`). Exact ties are
#: common, not rare: a code column that is zero (a principal direction never among the ``s`` largest) becomes a
#: copy of another after a shear fills it, and every shear reading either column then has the same score. Their
#: computed scores differ only by rounding, which depends on the BLAS kernel's summation order (CPU, thread count),
#: so an exact argmin made the learned transform differ between machines. Rounding noise is ~1e-15 of the scale;
#: real differences this small do not matter.
TIE_RTOL = 1e-9


def entry_optima(m: torch.Tensor, a_norms: torch.Tensor, x_norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal value and decrease of every entry ``L = v e_a e_b^T`` (module docstring).

    Args:
        m: ``(n, n)`` ``M = A^T (Z_k - A W_k)``.
        a_norms: ``(n,)`` ``||a_a||^2`` (the diagonal of ``A^T A``).
        x_norms: ``(n,)`` ``||x_b||^2`` (the diagonal of ``W_k``).

    Returns:
        ``values`` ``(n, n)`` with ``values[a, b] = M_ab / (||a_a||^2 ||x_b||^2)`` (the shear ``v``; for ``a = b``
        the scaling is ``g = 1 + values[a, a]``) and ``decrease`` ``(n, n)`` ``= -M_ab^2 / (||a_a||^2 ||x_b||^2)``,
        the change of ``||Y - X D^T||^2`` at that optimum. Where ``||a_a||^2 ||x_b||^2 = 0`` the objective does
        not depend on ``v``: value ``0`` and decrease ``0``.
    """
    denominator = a_norms[:, None] * x_norms[None, :]
    zero = denominator <= 0
    denominator.masked_fill_(zero, 1.0)
    values = (m / denominator).masked_fill_(zero, 0.0)
    decrease = m.square().div_(denominator).neg_().masked_fill_(zero, 0.0)  # -(m^2 / d) is -m^2 / d exactly
    return values, decrease


def stable_argmin(scores: torch.Tensor, scale: float, preferred: tuple[int, int] | None = None) -> tuple[int, int]:
    """The entry ``(a, b)`` of the smallest score, with ties decided by a fixed order, not by rounding noise.

    Scores within ``TIE_RTOL * max(|best|, scale)`` of the smallest one (``best``) are tied; among them the
    ``preferred`` entry wins if it is tied (an incumbent is replaced only by a clear improvement), else the first
    in row-major order. ``scale`` (``>= 0``) is the magnitude of the objective the scores change (e.g.
    ``||Y||_F^2``), so that near-zero scores (nothing left to gain) are tied too. Only a real difference of more
    than the tolerance decides, so the choice is the same whatever order the BLAS summed the statistics in.

    Args:
        scores: ``(n, n)`` (``+inf`` for entries that are not candidates; at least one finite).
        scale: the objective's magnitude, in the units of ``scores``.
        preferred: an entry to keep when it is tied with the best, or ``None``.

    Returns:
        ``(a, b)`` as ints.
    """
    best = float(scores.min())
    tied = scores <= best + TIE_RTOL * max(abs(best), scale)
    if preferred is not None and bool(tied[preferred]):
        return preferred
    a, b = divmod(int(tied.flatten().to(torch.uint8).argmax()), scores.shape[1])  # the first tied entry
    return a, b


def round_scaling(g: torch.Tensor, bits: int | None) -> torch.Tensor:
    """A scaling rounded as the author's code does: ``sign(g) 2^round(log2 |g|)`` (``round`` half away from zero,
    like MATLAB's); ``bits=None`` returns ``g``. ``g = 0`` stays ``0``. Elementwise, any shape."""
    if bits is None:
        return g
    exponent = torch.log2(g.abs())
    exponent = torch.sign(exponent) * torch.floor(exponent.abs() + 0.5)
    rounded = torch.sign(g) * torch.exp2(torch.where(g == 0, torch.zeros_like(exponent), exponent))
    return rounded


def round_entry(a: int, b: int, value: torch.Tensor, bits: int | None) -> float:
    """The stored value of entry ``(a, b)``: a shear ``v`` -> ``sopot(v, bits)`` (Algorithm 1), a scaling ``g``
    (``a = b``; ``value`` is ``g`` itself) -> :func:`round_scaling`. ``bits=None`` keeps ``value``."""
    if a == b:
        return float(round_scaling(value, bits))
    return float(sopot(value, bits))


def scaling_decrease(
    m_diag: torch.Tensor, a_norms: torch.Tensor, x_norms: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    """Change of ``||Y - X D^T||^2`` when scaling ``a`` is set to ``g`` (``v = g - 1``), for each ``a``:
    ``-2 v M_aa + v^2 ||a_a||^2 ||x_a||^2`` with ``m_diag`` the diagonal of ``M`` (of ``Z - W`` at the init, where
    ``A = I`` and this is ``-2(g - 1) Z_aa + (g^2 - 1) W_aa``)."""
    v = g - 1
    return -2 * v * m_diag + v.square() * a_norms * x_norms


def block_of_entry(n: int, a: int, b: int, value: float) -> tuple[tuple[int, int], list[list[float]]]:
    """``(pair, core)`` of the entry ``(a, b)`` with stored ``value`` (``g`` for a scaling, ``v`` for a shear):
    ``a = b``: ``(a, (a + 1) mod n)``, ``[[g, 0], [0, 1]]``; ``a > b``: ``(b, a)``, ``[[1, 0], [v, 1]]`` (lower);
    ``a < b``: ``(a, b)``, ``[[1, v], [0, 1]]`` (upper)."""
    if a == b:
        return (a, (a + 1) % n), [[value, 0.0], [0.0, 1.0]]
    if a > b:
        return (b, a), [[1.0, 0.0], [value, 1.0]]
    return (a, b), [[1.0, value], [0.0, 1.0]]


def entry_of_block(pair: tuple[int, int], core: list[list[float]]) -> tuple[int, int, float] | None:
    """Inverse of :func:`block_of_entry`: ``(a, b, value)`` of a shear or scaling core on ``pair``, or ``None``
    when the core is neither ``[[1, 0], [b, 1]]``, ``[[1, c], [0, 1]]`` nor ``[[g, 0], [0, 1]]`` (``g != 0``). The
    identity is read as the lower shear with ``b = 0``."""
    i, j = pair
    (p, c), (b, d) = core
    if d != 1.0:
        return None
    if p == 1.0 and c == 0.0:
        return j, i, b
    if p == 1.0 and b == 0.0:
        return i, j, c
    if b == 0.0 and c == 0.0 and p != 0.0:
        return i, i, p
    return None


def right_transposed(matrix: torch.Tensor, a: int, b: int, value: float) -> None:
    """In place ``matrix <- matrix S^T`` for ``S = I + L`` of entry ``(a, b)``: column ``a`` += ``v`` column ``b``
    (a scaling, ``a = b``, multiplies column ``a`` by ``g = value``)."""
    if a == b:
        matrix[:, a] *= value
    else:
        matrix[:, a] += value * matrix[:, b]


def left(matrix: torch.Tensor, a: int, b: int, value: float) -> None:
    """In place ``matrix <- S matrix``: row ``a`` += ``v`` row ``b`` (a scaling multiplies row ``a`` by ``g``)."""
    if a == b:
        matrix[a, :] *= value
    else:
        matrix[a, :] += value * matrix[b, :]


def right(matrix: torch.Tensor, a: int, b: int, value: float) -> None:
    """In place ``matrix <- matrix S``: column ``b`` += ``v`` column ``a`` (a scaling multiplies column ``a``)."""
    if a == b:
        matrix[:, a] *= value
    else:
        matrix[:, b] += value * matrix[:, a]


def entries_of_blocks(pairs: object, cores: object, n: int, where: str) -> list[Entry]:
    """The blocks ``pairs`` ``(m, 2)``, ``cores`` ``(m, 2, 2)`` as entries ``(a, b, value)``.

    Raises:
        ValueError: wrong types or shapes, ``m = 0``, or a block that is not a shear or a nonzero scaling on two
            distinct coordinates in ``0..n-1`` (the message names it, prefixed by ``where``).
    """
    if (
        not isinstance(pairs, torch.Tensor)
        or pairs.is_floating_point()
        or pairs.dtype == torch.bool
        or not isinstance(cores, torch.Tensor)
        or not cores.is_floating_point()
    ):
        got = [f"a {v.dtype} tensor" if isinstance(v, torch.Tensor) else type(v).__name__ for v in (pairs, cores)]
        raise ValueError(
            f"{where}: pairs must be an (m, 2) int tensor and cores an (m, 2, 2) float tensor, got {got[0]} and "
            f"{got[1]}."
        )
    if pairs.dim() != 2 or pairs.shape[1] != 2 or cores.shape != (pairs.shape[0], 2, 2) or pairs.shape[0] < 1:
        raise ValueError(
            f"{where}: pairs must be (m, 2) and cores (m, 2, 2) with m >= 1, got {tuple(pairs.shape)}, "
            f"{tuple(cores.shape)}."
        )
    entries = []
    for k, (pair, core) in enumerate(zip(pairs.tolist(), cores.double().tolist(), strict=True)):
        entry = entry_of_block(tuple(pair), core) if all(0 <= p < n for p in pair) and pair[0] != pair[1] else None
        if entry is None or not math.isfinite(entry[2]):
            raise ValueError(
                f"{where}: block {k} (pair {tuple(pair)}, core {core}) is not a shear [[1, 0], [b, 1]] / [[1, c], "
                f"[0, 1]] or scaling [[g, 0], [0, 1]] (g != 0) on two distinct coordinates in 0..{n - 1}."
            )
        entries.append(entry)
    return entries


def blocks_of_entries(entries: list[Entry], n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``pairs`` ``(m, 2)`` int64 and ``cores`` ``(m, 2, 2)`` float64 on ``device`` of the entries (by
    :func:`block_of_entry`)."""
    blocks = [block_of_entry(n, a, b, value) for a, b, value in entries]
    pairs = torch.tensor([pair for pair, _ in blocks], dtype=torch.int64, device=device).view(-1, 2)
    cores = torch.tensor([core for _, core in blocks], dtype=torch.float64, device=device).view(-1, 2, 2)
    return pairs, cores
