"""The suffix products of an S-DLA sweep (Rusu, arXiv 1812.03412, eqs. 21-23), in little memory and few operations.

Re-choosing block ``k`` of ``D = S_m ... S_1`` needs ``A_k = S_m ... S_{k+1}`` (the blocks after it, not yet
re-chosen) and ``M = A_k^T (Z_k - A_k W_k)``. Two facts make this cheap:

* ``A_k`` is built from the identity by right products ``A <- A S`` (one column changes per block: column ``b`` of
  a shear on entry ``(a, b)``, column ``a`` of a scaling), so it differs from the identity only in the set ``C_k``
  of those columns, ``|C_k| <= m - k - 1``. Then ``A W = A[:, C] W[C, :] + (the rows of W outside C)`` and
  ``A^T R = R`` outside the rows ``C``, ``A[:, C]^T R`` on them: ``4 n^2 |C_k|`` operations instead of ``4 n^3``,
  and ``O(n nnz)`` when those columns are sparse (a product of few shears and scalings usually is).
* the sweep needs the ``A_k`` in the order ``k = 1..m`` but builds them from ``k = m``: every ``~sqrt(m)``-th one
  is kept and the others are rebuilt from it segment by segment, by the same right products (so each ``A_k`` is
  bit for bit the one built in one go), in ``O(sqrt(m) n^2)`` memory instead of ``O(m n^2)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from lightning_ortho.transforms import shear_updates as su

#: The non-identity columns of ``A_k`` are multiplied entry by entry (gather, scale, scatter-add) when at most
#: ``1 / SPARSE_RATIO`` of their entries are nonzero: each entry costs far more that way than in a dense matrix
#: product, so only a sparse enough column gains.
SPARSE_RATIO = 16


def _column(entry: su.Entry) -> int:
    """The column of ``A`` that ``A <- A S`` changes for the entry ``(a, b, value)``."""
    a, b, _ = entry
    return a if a == b else b


def suffix_products(
    entries: list[su.Entry], n: int, device: torch.device | str | None = None
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(k, A_k, C_k)`` for ``k = 0..m-1`` in order: ``A_k = S_{m-1} ... S_{k+1}`` ``(n, n)`` float64 of the
    ``entries`` (block 0 acting first), and ``C_k`` the sorted int64 columns where ``A_k`` may differ from the
    identity. Each ``A_k`` is built as ``I S_{m-1} ... S_{k+1}`` by :func:`~lightning_ortho.transforms.
    shear_updates.right`; the entries ``> k`` are read when ``A_k`` is first built, so the caller may overwrite
    ``entries[k]`` after receiving ``A_k`` (a sweep does). A yielded ``A_k`` may be reused: copy it to keep it."""
    m = len(entries)
    step = max(1, math.isqrt(m))
    checkpoints: dict[int, tuple[torch.Tensor, set[int]]] = {}
    product = torch.eye(n, dtype=torch.float64, device=device)
    columns: set[int] = set()
    for k in range(m - 1, -1, -1):  # product = A_k before entry k is applied
        if k == m - 1 or (k > 0 and k % step == 0):
            checkpoints[k] = (product.clone(), set(columns))
        su.right(product, *entries[k])
        columns.add(_column(entries[k]))
    for low in range(0, m, step):
        high = min(low + step, m)  # this segment yields A_low .. A_{high-1}, from the checkpoint at or above high-1
        start = high if high in checkpoints else m - 1
        product, columns = checkpoints[start][0].clone(), set(checkpoints[start][1])
        segment = []
        for k in range(start, low - 1, -1):
            if k < high:
                segment.append((k, product.clone(), torch.tensor(sorted(columns), dtype=torch.int64)))
            if k > low:
                su.right(product, *entries[k])
                columns.add(_column(entries[k]))
        yield from reversed(segment)


def suffix_statistics(
    a_k: torch.Tensor, columns: torch.Tensor, z: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A W, A^T (Z - A W))`` ``(n, n)`` for an ``A`` that equals the identity outside ``columns`` (module
    docstring): the same sums as the dense products without their zero terms (the last bits may differ, as between
    two BLAS kernels)."""
    if columns.numel() == 0:
        return w.clone(), z - w
    a_c = a_k[:, columns]
    outside = torch.ones(a_k.shape[0], dtype=torch.bool, device=a_k.device)
    outside[columns] = False
    rows, local = (a_c != 0).nonzero(as_tuple=True)
    sparse = rows.numel() * SPARSE_RATIO <= a_c.numel()
    if sparse:  # few nonzeros (shears fill in slowly): the products over the nonzero entries alone
        values, sources = a_c[rows, local, None], columns[local]
        a_w = torch.zeros_like(w).index_add_(0, rows, values * w[sources])
    else:
        a_w = a_c @ w[columns, :]
    a_w[outside] += w[outside]
    residual = z - a_w
    m = residual.clone()
    if sparse:
        m[columns] = 0
        m.index_add_(0, sources, values * residual[rows])
    else:
        m[columns] = a_c.T @ residual
    return a_w, m
