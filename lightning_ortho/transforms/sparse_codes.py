"""Sparse codes: ``T_s`` of the paper for an orthonormal dictionary (keep the ``s`` largest entries per sample) and
OMP for any other (shears, scalings)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.batch_omp import batch_omp


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
    """``100 ||Y - X D^T||_F^2 / ||Y||_F^2`` in percent (the paper's error with batch-first data).

    Args:
        data: ``Y``, ``(N, n)``.
        codes: ``X``, ``(N, n)``.
        dictionary: ``D``, ``(n, n)``.
    """
    residual = data - codes @ dictionary.T
    return 100 * residual.square().sum() / data.square().sum()


def check_training_data(data: object, s: object, where: str, *, even: bool = False) -> int:
    """Validate the learners' common inputs, ``Y`` ``(N, n)`` and the sparsity ``s``; returns ``n``.

    Raises:
        ValueError: ``Y`` is not a 2-d floating tensor with ``N >= 1`` rows and ``n >= 2`` (even with ``even``)
            columns, holds NaN/inf or only zeros (the relative error is undefined), or ``s`` is not in ``[1, n]``.
    """
    if not isinstance(data, torch.Tensor) or not data.is_floating_point():
        raise ValueError(f"{where}: Y must be a floating-point tensor (N, n), got {not_floating(data)}.")
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


def omp_codes(y: torch.Tensor, dictionary: torch.Tensor, s: int) -> torch.Tensor:
    """``s``-sparse codes by OMP (Rusu, arXiv 1812.03412, "sparse coding" of S-DLA): ``Y ~ codes @ D^T``.

    ``D_n = D diag(1 / ||d_col||)``; ``C = OMP(D_n, Y, s)`` from the precomputed Gram ``D_n^T D_n`` and ``D_n^T y``
    per sample (float64), all samples at once (:func:`~lightning_ortho.transforms.batch_omp.batch_omp`: the steps of
    ``sklearn.linear_model.orthogonal_mp_gram``); then ``codes = C diag(1 / ||d_col||)``, the codes of the
    unnormalised ``D`` (the column scaling absorbed into ``X``). Rows of ``Y`` that are zero get zero codes (OMP is
    not run on them); every other row gets at most ``s`` nonzeros (exactly ``s`` unless the row is represented
    exactly by fewer atoms or the atoms are dependent: then a ``RuntimeWarning`` says how many rows stopped early).

    Shapes: ``y`` ``(N, n)``, ``dictionary`` ``(n, n)`` -> ``(N, n)`` in ``y``'s dtype and device.

    Args:
        y: ``Y``, ``(N, n)`` data.
        dictionary: ``D``, ``(n, n)``, without zero columns.
        s: nonzeros per code row (``1 <= s <= n``).

    Raises:
        ValueError: ``y`` not a finite floating ``(N, n)`` tensor, ``dictionary`` not a finite ``(n, n)`` tensor
            without zero columns, or ``s`` not an int in ``[1, n]``.
    """
    where = "omp_codes"
    if not isinstance(y, torch.Tensor) or not y.is_floating_point():
        raise ValueError(f"{where}: y must be a floating-point (N, n) tensor, got {not_floating(y)}.")
    if y.dim() != 2:
        raise ValueError(f"{where}: y must be a floating-point (N, n) tensor, got shape {tuple(y.shape)}.")
    n = y.shape[1]
    if not isinstance(dictionary, torch.Tensor) or dictionary.shape != (n, n):
        raise ValueError(f"{where}: dictionary must be an ({n}, {n}) tensor for y of shape {tuple(y.shape)}.")
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= n:
        raise ValueError(f"{where}: s must be an int in [1, {n}] (nonzeros per sample), got {s!r}.")
    data = y.detach().to(torch.float64).cpu().numpy()
    d = dictionary.detach().to(torch.float64).cpu().numpy()
    if not (np.isfinite(data).all() and np.isfinite(d).all()):
        raise ValueError(f"{where}: y and the dictionary must be finite (no NaN/inf).")
    norms = np.linalg.norm(d, axis=0)
    if not (norms > 0).all():
        raise ValueError(f"{where}: dictionary column {int(np.argmin(norms))} is zero; OMP needs nonzero atoms.")
    atoms = d / norms
    codes = np.zeros_like(data)
    rows = np.flatnonzero(np.any(data != 0, axis=1))
    if rows.size:
        # OMP is homogeneous in each sample, but it stops early on absolute thresholds (a squared
        # coefficient below the smallest float): scale every row by an exact power of two to magnitude ~1 first
        # (without it, rows of magnitude 1e-100 got all-zero codes).
        exponents = np.frexp(np.abs(data[rows]).max(axis=1))[1]
        scaled = np.ldexp(data[rows], -exponents[:, None])
        gram = torch.from_numpy(atoms.T @ atoms)
        coefficients, ended_early = batch_omp(gram, torch.from_numpy(atoms.T @ scaled.T).T, s)
        codes[rows] = np.ldexp(coefficients.numpy(), exponents[:, None]) / norms
        if ended_early:
            warnings.warn(
                f"{where}: orthogonal matching pursuit stopped before s = {s} atoms for {ended_early} of {rows.size} "
                f"samples: they are represented exactly by fewer atoms, or the dictionary's atoms are linearly "
                f"dependent (their codes have fewer nonzeros).",
                RuntimeWarning,
                stacklevel=2,
            )
    return torch.from_numpy(codes).to(dtype=y.dtype, device=y.device)
