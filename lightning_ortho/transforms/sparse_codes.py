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


def check_training_data(data: object, s: object, where: str, *, even: bool = False) -> int:
    """Validate the learners' common inputs, ``Y`` ``(N, n)`` and the sparsity ``s``; returns ``n``.

    Raises:
        ValueError: ``Y`` is not a 2-d floating tensor with ``N >= 1`` rows and ``n >= 2`` (even with ``even``)
            columns, holds NaN/inf or only zeros (the relative error is undefined), or ``s`` is not in ``[1, n]``.
    """
    if not isinstance(data, torch.Tensor) or not data.is_floating_point():
        raise ValueError(f"{where}: Y must be a floating-point tensor (N, n), got {type(data).__name__}.")
    if data.dim() != 2:
        raise ValueError(f"{where}: Y must be 2-d (N, n) batch-first, got shape {tuple(data.shape)}.")
    n = data.shape[1]
    if n < 2 or (even and n % 2):
        kind = "an even n >= 2 (its stages are perfect matchings of the coordinates)" if even else "n >= 2"
        raise ValueError(f"{where}: Y needs {kind} features (blocks act on pairs), got n = {n}.")
    if data.shape[0] < 1:
        raise ValueError(f"{where}: Y needs at least one sample (row), got shape {tuple(data.shape)}.")
    if not bool(torch.isfinite(data).all()):
        raise ValueError(f"{where}: Y holds NaN or inf.")
    if not bool((data != 0).any()):
        raise ValueError(f"{where}: Y is all zeros; the relative error 100 ||Y - X D^T||^2 / ||Y||^2 is undefined.")
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:
        raise ValueError(f"{where}: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
    return n
