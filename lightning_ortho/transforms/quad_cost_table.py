"""The block costs of B⊗_m-DLA (Rusu 2018, 4x4 blocks): exact per candidate, fast per quadruple, kept up to date.

A block ``B`` with core ``H`` (:mod:`~lightning_ortho.transforms.quad_cores`) on the quadruple ``q = (i, j, r, p)``
changes the objective as in Rusu's eqs. (7)-(8) for 2x2 blocks: with ``Z = Y^T X`` (the paper's ``Y_p X_p^T``,
eq. 9) and ``S = Z[q][:, q]`` its 4x4 submatrix,

    ||Y - X B^T||_F^2 = ||Y||^2 + ||X||^2 + C_q(H),   C_q(H) = -2 tr Z + 2 A_q(H),
    A_q(H) = sum_ab (I - H)_ab S_ab = tr S - <H, S>.

Every pick (eq. 10) takes the ``(q, H)`` of least ``C`` over the ``C(n, 4)`` quadruples (lexicographic order) and
the 768 cores (index order); the first in that order wins ties.

Best core of a quadruple in a few products. With ``H = diag(r) N_pi diag(c) / 2`` (the factorisation of
:mod:`quad_cores`), ``<H, S> = 1/2 sum_a r_a P_a(w_pi(a) o c)`` where ``P_a(v) = sum_b S_ab v_b``; ``w_k o c`` is
again a column sign vector with first entry ``+1``. So ``P = S E^T`` (``E`` the 8 column sign vectors) gives, with
the row signs chosen as the signs of the terms,

    max_H <H, S> = 1/2 max_{pi, c} ( |P_0(c)| + sum_{a=1..3} |P_a(w_pi(a) o c)| ),

48 sums of four gathered entries per quadruple instead of 768 sums of sixteen products. That value (``A_fast``)
rounds differently from :func:`quad_block_costs`, so a pick takes the least ``A_fast``, keeps every quadruple within
a rounding margin of it, and recomputes those exactly (all 768 cores) in the order above: the pick is the exact
argmin of :func:`quad_block_costs` over all candidates, whatever the margin let through.

Incremental table. A block placed or peeled on ``(i, j, r, p)`` changes only rows or columns ``i, j, r, p`` of
``Z``, so :class:`QuadCostTable` recomputes only the quadruples that hold one of them (``C(n, 4) - C(n - 4, 4)``,
23% at ``n = 64``); :func:`best_quad_block` rescans them all (the reference, ``rescan=True`` of the learner).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from lightning_ortho.transforms.quad_cores import COLUMN_SIGNS, PERMUTATIONS, WALSH_ROWS, quad_cores

#: Quadruples per chunk of the vectorised evaluations (bounds the memory of the intermediate tensors).
_CHUNK = 1 << 15


def quadruples(n: int) -> torch.Tensor:
    """All ``(C(n, 4), 4)`` int64 quadruples ``i < j < r < p`` of ``0..n-1`` in lexicographic order.

    Raises:
        ValueError: ``n`` is not an int ``>= 4``.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 4:
        raise ValueError(f"quadruples: n must be an int >= 4, got {n!r}.")
    count = math.comb(n, 4)
    flat = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), 4)), np.int64, 4 * count)
    return torch.from_numpy(flat.reshape(count, 4))


def _submatrices(z: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """``(Q, 4, 4)``: ``z[q][:, q]`` for every row ``q`` of ``quads``."""
    flat = (quads[:, :, None] * z.shape[1] + quads[:, None, :]).flatten()
    return z.reshape(-1).index_select(0, flat).view(-1, 4, 4)


def quad_block_costs(z: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """Exact costs ``C_q(H) = -2 tr Z + 2 sum_ab (I - H)_ab S_ab`` (module docstring) ``(Q, 768)`` of every core on
    every row of ``quads`` ``(Q, 4)``; the sum runs over ``(a, b)`` row-major, elementwise, so an entry does not
    depend on which other quadruples are evaluated with it."""
    factors = (torch.eye(4, dtype=z.dtype, device=z.device) - quad_cores(z.dtype, z.device)).flatten(1)  # (768, 16)
    sub = _submatrices(z, quads).flatten(1)  # (Q, 16)
    total = torch.zeros(quads.shape[0], factors.shape[0], dtype=z.dtype, device=z.device)
    for ab in range(16):
        total = total + factors[:, ab] * sub[:, ab, None]
    return 2 * total - 2 * torch.diagonal(z).sum()


def _walsh_sign_columns() -> torch.Tensor:
    """``(4, 4, 8)``: ``[k, :, e]`` is the column sign vector ``w_k o COLUMN_SIGNS[e]`` (again one of them)."""
    return (WALSH_ROWS[:, None, :] * COLUMN_SIGNS[None, :, :]).transpose(1, 2).contiguous()


_WALSH_SIGN_COLUMNS = _walsh_sign_columns()


def fast_inner_minimum(z: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """``A_fast`` ``(Q,)``: ``min_H A_q(H) = tr S - max_H <H, S>`` of every row of ``quads``, by the factorised
    maximum of the module docstring (ten ``(Q, 4) x (4, 8)`` products and 48 sums of four entries per quadruple;
    rounding differs from :func:`quad_block_costs` by a few ulps of ``sum |S|``)."""
    columns = _WALSH_SIGN_COLUMNS.to(device=z.device, dtype=z.dtype)
    out = torch.empty(quads.shape[0], dtype=z.dtype, device=z.device)
    for start in range(0, quads.shape[0], _CHUNK):
        sub = _submatrices(z, quads[start : start + _CHUNK])  # (C, 4, 4)
        first = (sub[:, 0] @ columns[0]).abs_()  # |P_0(c_e)|, (C, 8)
        # terms[a - 1][k - 1][:, e] = |P_a(w_k o c_e)| for rows a and Walsh rows k in 1..3
        terms = [[(sub[:, a] @ columns[k]).abs_() for k in (1, 2, 3)] for a in (1, 2, 3)]
        best = None
        for pi in PERMUTATIONS:
            total = terms[0][pi[0] - 1] + terms[1][pi[1] - 1] + terms[2][pi[2] - 1]
            best = total if best is None else torch.maximum(best, total, out=best)
        assert best is not None
        gain = (best + first).amax(dim=1)
        out[start : start + _CHUNK] = torch.diagonal(sub, dim1=1, dim2=2).sum(1) - gain / 2
    return out


def _resolve(z: torch.Tensor, quads: torch.Tensor, inner: torch.Tensor) -> tuple[tuple[int, ...], int, float]:
    """The exact pick from ``A_fast`` of every quadruple: ``(quad, core_index, cost)`` (module docstring)."""
    precision = torch.finfo(z.dtype)
    smallest = float(inner.min())
    trace = float(torch.diagonal(z).sum())
    cost = 2 * smallest - 2 * trace
    # A_fast and the exact A of the best core differ by a few ulps of sum |S| <= 16 max |Z|; the exact costs that round
    # to the least one lie within an ulp of the cost itself. The margin is generous: it only admits more candidates.
    slack = 1024 * precision.eps * float(z.abs().max()) + 8 * precision.eps * (abs(cost) + abs(smallest))
    candidates = (inner <= smallest + 2 * slack + precision.tiny).nonzero().flatten()  # increasing: lexicographic
    best: tuple[float, int, int] | None = None
    for start in range(0, candidates.numel(), 1024):
        chunk = candidates[start : start + 1024]
        costs = quad_block_costs(z, quads[chunk])
        flat = int(costs.argmin())  # the first least entry: quadruple order, then core order
        row, core = divmod(flat, costs.shape[1])
        value = float(costs[row, core])
        if best is None or value < best[0]:
            best = (value, int(chunk[row]), core)
    assert best is not None
    value, q, core = best
    return tuple(int(a) for a in quads[q].tolist()), core, value


def best_quad_block(z: torch.Tensor, quads: torch.Tensor | None = None) -> tuple[tuple[int, ...], int, float]:
    """Eq. (10) for 4x4 blocks by a full scan: ``((i, j, r, p), core_index, cost)`` minimising ``C_q(H)`` over all
    quadruples (lexicographic; pass ``quadruples(n)`` to reuse it) and the 768 cores; ties go to the first quadruple,
    then the first core. The best block is returned even when its cost is positive (no "keep the identity").

    Raises:
        ValueError: ``z`` is not ``(n, n)`` with ``n >= 4``.
    """
    if z.dim() != 2 or z.shape[0] != z.shape[1] or z.shape[0] < 4:
        raise ValueError(f"best_quad_block: z must be (n, n) with n >= 4, got shape {tuple(z.shape)}.")
    quads = quadruples(z.shape[0]).to(z.device) if quads is None else quads
    return _resolve(z, quads, fast_inner_minimum(z, quads))


class QuadCostTable:
    """``A_fast`` of every quadruple of ``z`` (module docstring), refreshed where ``z`` changed.

    Args:
        z: ``(n, n)`` float ``Z`` with ``n >= 4``; the table reads it, the caller changes it in place and then calls
            :meth:`touch` with the coordinates whose rows or columns changed.
        quads: ``quadruples(n)`` (built when ``None``).
    """

    def __init__(self, z: torch.Tensor, quads: torch.Tensor | None = None) -> None:
        if z.dim() != 2 or z.shape[0] != z.shape[1] or z.shape[0] < 4:
            raise ValueError(f"QuadCostTable: z must be (n, n) with n >= 4, got shape {tuple(z.shape)}.")
        self.z = z
        self.quads = quadruples(z.shape[0]).to(z.device) if quads is None else quads
        self.inner = fast_inner_minimum(z, self.quads)
        self._dirty: set[int] = set()
        # up to 64 coordinates: one bit per coordinate of each quadruple, so finding the stale ones is one AND
        self._bits = None
        if z.shape[0] <= 64:
            bits = torch.bitwise_left_shift(torch.ones_like(self.quads), self.quads)
            self._bits = bits[:, 0] | bits[:, 1] | bits[:, 2] | bits[:, 3]

    def touch(self, *coordinates: int) -> None:
        """Rows or columns of ``z`` at these coordinates changed: their quadruples are recomputed before the next
        :meth:`choose`."""
        self._dirty.update(coordinates)

    def _refresh(self) -> None:
        if not self._dirty:
            return
        touched = sorted(self._dirty)
        self._dirty.clear()
        if self._bits is not None:
            mask = sum(1 << a for a in touched)
            mask = mask - (1 << 64) if mask >= 1 << 63 else mask  # the int64 with those bits
            stale = (self._bits & mask).nonzero().flatten()
        else:
            stale = torch.isin(self.quads, torch.tensor(touched, device=self.z.device)).any(dim=1).nonzero().flatten()
        self.inner[stale] = fast_inner_minimum(self.z, self.quads[stale])

    def choose(self) -> tuple[tuple[int, ...], int, float]:
        """Eq. (10) on the current ``z``: exactly what :func:`best_quad_block` returns."""
        self._refresh()
        return _resolve(self.z, self.quads, self.inner)
