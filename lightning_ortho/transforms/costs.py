"""Operation counts of fast transforms, as Rusu's "Learning multiplication-free linear transformations"
counts them (its R-, B- and shear transforms).

Conventions (inferred where the paper is silent, chosen so that the paper's own counts come out):

* A negation or a multiplication by ``+-1`` is free (signs are absorbed into the following addition or
  subtraction); a subtraction counts as an addition.
* One output coordinate ``y = sum_k e_k x_k`` over its ``nz`` nonzero entries costs ``nz - 1`` additions plus the
  cost of its multipliers. When all nonzero entries of the row share one magnitude ``|e|`` the multiplier is
  factored out and paid once (``r (x_2 - x_1)`` for the binary cores: 1 addition + 1 multiplication).
* A multiplier ``|e| != 1``: without SOPOT terms, a power of two costs 1 shift and anything else 1
  multiplication; with ``terms=p`` (entries in ``R_p``, Rusu eq. 4) a multiplier whose greedy SOPOT expansion
  has ``k <= p`` terms costs ``k`` shifts and ``k - 1`` additions ("multiplying by a in R_p takes p shifts and
  p - 1 additions").

With these rules a generic 2x2 block costs 2 additions + 4 multiplications, a binary G1 core 2 additions + 2
multiplications, a signed permutation (G2) nothing, a shear ``[1 0; b 1]`` 1 addition + 1 multiplication (or
``p`` shifts + ``p`` additions in ``R_p``), and an ``R_p`` block with four ``p``-term entries ``4p`` shifts +
``4p - 2`` additions, as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OpCount:
    """Additions (subtractions included), multiplications and shifts of one application to a vector; counts add
    (``a + b``, ``sum(counts)``) and scale by an int (``count * positions``), and :attr:`total` is all three."""

    additions: int = 0
    multiplications: int = 0
    shifts: int = 0

    @property
    def total(self) -> int:
        """All operations: additions + multiplications + shifts."""
        return self.additions + self.multiplications + self.shifts

    def __add__(self, other: OpCount) -> OpCount:
        if not isinstance(other, OpCount):
            return NotImplemented
        return OpCount(
            self.additions + other.additions,
            self.multiplications + other.multiplications,
            self.shifts + other.shifts,
        )

    def __radd__(self, other: object) -> OpCount:
        # sum() starts from 0: sum(counts) and sum(counts, OpCount()) both give the total count
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def __mul__(self, k: int) -> OpCount:
        return OpCount(self.additions * k, self.multiplications * k, self.shifts * k)

    __rmul__ = __mul__


def _is_power_of_two(value: float) -> bool:
    mantissa, _ = math.frexp(value)
    return value > 0 and mantissa == 0.5


def multiplier_cost(value: float, terms: int | None = None) -> OpCount:
    """Cost of multiplying by the scalar ``value`` (see the module docstring).

    Args:
        value: the multiplier.
        terms: SOPOT terms per multiplier (entries in ``R_p``), or ``None`` to count multiplications and shifts.

    Raises:
        ValueError: ``terms`` is given and ``value`` is not an exact sum of at most ``terms`` signed powers of two
            (quantise it first with :func:`lightning_ortho.transforms.sopot`), or ``value`` is not finite.
    """
    if not math.isfinite(value):
        raise ValueError(f"multiplier_cost: the multiplier must be finite, got {value!r}.")
    magnitude = abs(value)
    if magnitude == 0.0 or magnitude == 1.0:
        return OpCount()
    if terms is None:
        return OpCount(shifts=1) if _is_power_of_two(magnitude) else OpCount(multiplications=1)
    from lightning_ortho.transforms.sopot import sopot_terms_needed

    k = sopot_terms_needed(magnitude, terms)
    if k is None:
        raise ValueError(
            f"multiplier_cost: {value!r} is not an exact sum of at most {terms} signed powers of two. Quantise the "
            f"entries first (lightning_ortho.transforms.sopot(x, {terms})) or count with terms=None."
        )
    return OpCount(additions=k - 1, shifts=k)


def row_cost(entries: list[float], terms: int | None = None) -> OpCount:
    """Cost of one output coordinate ``sum_k entries[k] * x_k`` (see the module docstring).

    Args:
        entries: the row's entries ``e_k``.
        terms: SOPOT terms per multiplier (entries in ``R_p``), or ``None`` to count multiplications and shifts.

    Raises:
        ValueError: as :func:`multiplier_cost`.
    """
    nonzero = [e for e in entries if e != 0.0]
    if not nonzero:
        return OpCount()
    combine = OpCount(additions=len(nonzero) - 1)
    magnitudes = {abs(e) for e in nonzero}
    if len(magnitudes) == 1:
        return combine + multiplier_cost(nonzero[0], terms)
    total = combine
    for entry in nonzero:
        total = total + multiplier_cost(entry, terms)
    return total


def block_cost(core: list[list[float]], terms: int | None = None) -> OpCount:
    """Cost of applying one 2x2 block ``[[a, c], [b, d]]`` (Rusu eq. 2) to the pair ``(x_i, x_j)``.

    Args:
        core: the block ``[[a, c], [b, d]]``.
        terms: SOPOT terms per multiplier (entries in ``R_p``), or ``None`` to count multiplications and shifts.

    Raises:
        ValueError: as :func:`multiplier_cost`.
    """
    return row_cost(list(core[0]), terms) + row_cost(list(core[1]), terms)
