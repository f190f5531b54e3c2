"""Sparse codes for an orthonormal dictionary: ``T_s`` of the paper (keep the ``s`` largest entries per sample)."""

from __future__ import annotations

import torch


def keep_largest(codes: torch.Tensor, s: int) -> torch.Tensor:
    """``T_s``: the ``s`` entries of largest magnitude of every row of ``codes`` ``(N, n)``, the others zero.

    With an orthonormal dictionary ``D`` the best ``s``-sparse codes of ``Y`` (batch-first ``(N, n)``, the
    paper's ``Y`` transposed) are ``T_s(Y D)``: the projection ``Y D`` keeps its ``s`` largest coordinates.

    Raises:
        ValueError: ``codes`` is not 2-d or ``s`` is not an int in ``[1, n]``.
    """
    if codes.dim() != 2:
        raise ValueError(f"keep_largest: codes must be (N, n), got shape {tuple(codes.shape)}.")
    n = codes.shape[1]
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:
        raise ValueError(f"keep_largest: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
    if s == n:
        return codes.clone()
    index = codes.abs().topk(s, dim=1).indices
    return torch.zeros_like(codes).scatter_(1, index, codes.gather(1, index))


def representation_error(data: torch.Tensor, codes: torch.Tensor, dictionary: torch.Tensor) -> torch.Tensor:
    """``100 ||Y - X D^T||_F^2 / ||Y||_F^2`` in percent, ``Y`` = ``data`` ``(N, n)``, ``X`` = ``codes`` ``(N, n)``,
    ``D`` = ``dictionary`` ``(n, n)`` (the paper's error with batch-first data)."""
    residual = data - codes @ dictionary.T
    return 100 * residual.square().sum() / data.square().sum()
