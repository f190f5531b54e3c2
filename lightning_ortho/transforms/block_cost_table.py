"""The block costs of B_m-DLA (Rusu, arXiv 1812.03412, eqs. 8 and 10) kept up to date as ``Z`` changes.

Every block choice of :func:`~lightning_ortho.transforms.b_dla.greedy_init` and
:func:`~lightning_ortho.transforms.b_dla.sweep` minimises, over the pairs ``i < j`` and the candidate cores
``[[g11, g12], [g21, g22]]``,

    C_ij^(t) = 2 A_ij^(t) - 2 tr Z,   A_ij^(t) = (1 - g11) Z_ii + (1 - g22) Z_jj - g12 Z_ij - g21 Z_ji.

``A_ij`` reads only ``Z_ii, Z_jj, Z_ij, Z_ji``. Placing or peeling a block on ``(i, j)`` changes only rows or columns
``i`` and ``j`` of ``Z``, so only the ``A`` of the ``2n - 3`` pairs that hold ``i`` or ``j`` change. The table keeps
``best[a, b] = min_t A_ab^(t)`` for ``a < b`` (``+inf`` elsewhere) and the minimum of each row, and recomputes only
the pairs of the coordinates it is told changed: ``O(n T)`` work per choice instead of ``O(n^2 T)``.

The choice is the one of :func:`~lightning_ortho.transforms.b_dla.best_block`, bit for bit: every ``A`` is the same
sequence of correctly rounded operations on the same four entries of ``Z`` (elementwise, so it does not matter
which other pairs are computed with it), and the cost ``fl(2 A - 2 tr Z)`` is monotone in ``A``. So the smallest
cost belongs to the smallest ``A``, and every entry whose rounded cost equals it has ``A`` within an ulp of the
cost of that smallest ``A``: the exact costs of those few pairs (all their candidates) are computed as
:func:`best_block` computes them and the first in its order (pairs row-major, then candidates) wins.
"""

from __future__ import annotations

import math

import torch

from lightning_ortho.transforms.binary_cores import binary_cores


class BlockCostTable:
    """``min_t A_ab^(t)`` for every pair ``a < b`` of ``z`` (module docstring), refreshed where ``z`` changed.

    Args:
        z: ``(n, n)`` float ``Z``; the table reads it, the caller changes it in place and then calls
            :meth:`touch` with the coordinates whose rows or columns changed.
        candidates: ``(T,)`` int64 core indices into :func:`~lightning_ortho.transforms.binary_cores.binary_cores`.
    """

    def __init__(self, z: torch.Tensor, candidates: torch.Tensor) -> None:
        self.z, self.candidates = z, candidates
        self.n = n = z.shape[0]
        g = binary_cores(z.dtype, z.device)[candidates]  # (T, 2, 2)
        # the factors exactly as best_block forms them, so every product below rounds the same way
        self._c11, self._c22, self._g12, self._g21 = 1 - g[:, 0, 0], 1 - g[:, 1, 1], g[:, 0, 1], g[:, 1, 0]
        self._coordinates = torch.arange(n, device=z.device)
        self.best = torch.full((n, n), math.inf, dtype=z.dtype, device=z.device)
        first, second = torch.triu_indices(n, n, offset=1, device=z.device)
        self.best[first, second] = self.inner(first, second).amin(dim=1)
        self.row_min, self.row_arg = self.best.min(dim=1)
        self._dirty: set[int] = set()

    def inner(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """``A`` ``(P, T)`` of the pairs ``(first[p], second[p])`` for every candidate, in :func:`best_block`'s
        order of operations."""
        z = self.z
        z_ii, z_jj = z[first, first, None], z[second, second, None]
        z_ij, z_ji = z[first, second, None], z[second, first, None]
        return self._c11 * z_ii + self._c22 * z_jj - self._g12 * z_ij - self._g21 * z_ji

    def touch(self, *coordinates: int) -> None:
        """Rows or columns of ``z`` at these coordinates changed: their pairs are recomputed before the next
        :meth:`choose`."""
        self._dirty.update(coordinates)

    def _refresh(self) -> None:
        if not self._dirty:
            return
        touched = torch.tensor(sorted(self._dirty), device=self.z.device)
        self._dirty.clear()
        first = torch.minimum(touched[:, None], self._coordinates).flatten()
        second = torch.maximum(touched[:, None], self._coordinates).flatten()
        values = self.inner(first, second).amin(dim=1).masked_fill_(first == second, math.inf)
        self.best[first, second] = values  # a pair of two touched coordinates comes twice, with one value
        # Rows whose minimum sat in a touched column (or that are touched) are rescanned; the others only gain the
        # touched columns, so their minimum can only fall to one of them.
        columns, position = self.best[:, touched].min(dim=1)
        stale = torch.isin(self.row_arg, touched)
        stale[touched] = True
        lower = columns < self.row_min
        self.row_min = torch.where(lower, columns, self.row_min)
        self.row_arg = torch.where(lower, touched[position], self.row_arg)
        rows = stale.nonzero().flatten()
        self.row_min[rows], self.row_arg[rows] = self.best[rows].min(dim=1)

    def choose(self) -> tuple[int, int, int, float]:
        """Eq. (10) on the current ``z``: ``(i, j, core_index, cost)``, exactly what
        :func:`~lightning_ortho.transforms.b_dla.best_block` returns (ties: first pair row-major, then candidate)."""
        self._refresh()
        trace = torch.diagonal(self.z).sum()
        smallest = float(self.row_min.min())
        cost = 2 * smallest - 2 * float(trace)  # about the smallest rounded cost (rounding is monotone in A)
        # every A whose rounded cost equals it lies within half an ulp of that cost of the smallest A; a margin of
        # a few ulps (of the cost and of A, in z's dtype) keeps every such entry among those recomputed exactly below
        precision = torch.finfo(self.z.dtype)
        limit = smallest + 4 * precision.eps * (abs(cost) + abs(smallest)) + precision.tiny
        rows = (self.row_min <= limit).nonzero().flatten()
        row, column = (self.best[rows] <= limit).nonzero().unbind(1)
        first, second = rows[row], column  # row-major order, as best_block's pairs
        costs = 2 * self.inner(first, second) - 2 * trace
        flat = int(costs.argmin())
        p, t = divmod(flat, costs.shape[1])
        return int(first[p]), int(second[p]), int(self.candidates[t]), float(costs[p, t])
