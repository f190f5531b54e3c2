"""Orthogonal matching pursuit of many samples at once from the Gram matrix (Batch-OMP, Rubinstein, Zibulevsky and
Elad, "Efficient implementation of the K-SVD algorithm using batch orthogonal matching pursuit", 2008).

For unit-norm atoms ``D`` with Gram matrix ``G = D^T D`` and a sample ``y`` with correlations ``c = D^T y``, each
step picks the atom of largest ``|alpha|``, ``alpha = c - G_I gamma`` the correlations of the residual, extends the
Cholesky factor ``L L^T = G_II`` of the selected atoms ``I`` by one row and solves ``G_II gamma = c_I``. This is
scikit-learn's ``orthogonal_mp_gram`` step for step, including its order of candidates on exact ties (it keeps the
atoms in an array and swaps each selected one to the front, so an argmax over that array breaks ties by position)
and its early stops; only the loop over samples is gone: all samples take their steps together as batched tensor
operations. The arithmetic is regrouped (batched triangular solves, ``sum w^2`` instead of ``nrm2(w)^2``), so the
coefficients agree with scikit-learn's to rounding and the selected atoms are the same unless two ``|alpha|`` are
within rounding of each other.
"""

from __future__ import annotations

import torch

#: Rows of one batch: the selected Gram rows ``(rows, s, n)`` are kept for the products ``G_I gamma``, bounded to
#: about 32 MiB of float64.
_BATCH_BYTES = 32 << 20


def batch_omp(gram: torch.Tensor, correlations: torch.Tensor, s: int) -> tuple[torch.Tensor, int]:
    """``s``-sparse OMP coefficients of every sample from ``gram`` ``(n, n)`` (of unit-norm atoms) and
    ``correlations`` ``(N, n)`` (``D^T y`` per sample), float64.

    Returns:
        ``(coefficients, ended_early)``: ``(N, n)`` with at most ``s`` nonzeros per row, and the number of samples
        that stopped before ``s`` atoms (as scikit-learn does, with its thresholds ``eps`` of float64: the largest
        residual correlation squared below ``eps``, an atom selected twice, or a new atom dependent on the selected
        ones, ``1 - ||w||^2 <= eps``).
    """
    count, n = correlations.shape
    rows = max(1, _BATCH_BYTES // (8 * s * n))
    coefficients = torch.zeros_like(correlations)
    ended_early = 0
    for start in range(0, count, rows):
        part, early = _batch(gram, correlations[start : start + rows], s)
        coefficients[start : start + rows] = part
        ended_early += early
    return coefficients, ended_early


def _batch(gram: torch.Tensor, correlations: torch.Tensor, s: int) -> tuple[torch.Tensor, int]:
    count, n = correlations.shape
    eps = torch.finfo(torch.float64).eps
    batch = torch.arange(count, device=gram.device)
    order = torch.arange(n, device=gram.device).repeat(count, 1)  # scikit-learn's swapped atom order
    chosen = torch.zeros(count, s, dtype=torch.int64, device=gram.device)
    factor = torch.zeros(count, s, s, dtype=torch.float64, device=gram.device)
    columns = gram.T.contiguous()  # G_I gamma reads columns of G, as scikit-learn does
    selected_rows = torch.empty(count, s, n, dtype=torch.float64, device=gram.device)
    gamma = torch.zeros(count, 0, dtype=torch.float64, device=gram.device)
    kept = torch.zeros(count, s, dtype=torch.float64, device=gram.device)  # the coefficients of stopped samples
    atoms = torch.zeros(count, dtype=torch.int64, device=gram.device)  # their number of atoms
    running = torch.ones(count, dtype=torch.bool, device=gram.device)
    alpha = correlations
    for k in range(s):
        position = alpha.gather(1, order).abs().argmax(dim=1)
        atom = order[batch, position]
        peak = alpha[batch, atom]
        stop = (position < k) | (peak.square() < eps)
        diagonal = gram[atom, atom]
        if k > 0:
            cross = gram[atom[:, None], chosen[:, :k]]
            w = torch.linalg.solve_triangular(factor[:, :k, :k], cross[..., None], upper=False).squeeze(-1)
            remainder = diagonal - w.square().sum(dim=1)
            stop |= remainder <= eps
            factor[:, k, :k] = w
            factor[:, k, k] = remainder.clamp_min(0).sqrt()
        else:
            factor[:, 0, 0] = diagonal.sqrt()
        stopped = running & stop
        if bool(stopped.any()):  # rare: keep those samples' last coefficients
            kept[stopped, :k] = gamma[stopped]
            atoms[stopped] = k
            running &= ~stop
            if not bool(running.any()):
                break
        swapped = order[batch, k].clone()
        order[batch, k] = atom
        order[batch, position] = torch.where(position == k, atom, swapped)
        chosen[:, k] = atom
        selected_rows[:, k] = columns[atom]
        targets = correlations.gather(1, chosen[:, : k + 1])
        gamma = torch.cholesky_solve(targets[..., None], factor[:, : k + 1, : k + 1]).squeeze(-1)
        alpha = correlations - torch.bmm(gamma[:, None, :], selected_rows[:, : k + 1]).squeeze(1)
    kept[running, : gamma.shape[1]] = gamma[running]
    atoms[running] = gamma.shape[1]
    slots = torch.arange(s, device=gram.device) < atoms[:, None]
    coefficients = torch.zeros_like(correlations)
    coefficients.scatter_add_(1, torch.where(slots, chosen, 0), torch.where(slots, kept, 0.0))
    return coefficients, int((atoms < s).sum())
