"""What the rows of ``reproduce_transforms`` share with its learned-fast-transform rows
(:mod:`benchmarks._fast_transform_rows`): one row of the table, and the error of exact sparse codes under an
orthonormal dictionary."""

from __future__ import annotations

import torch

from lightning_ortho.transforms import OpCount
from lightning_ortho.transforms.sparse_codes import keep_largest, representation_error


def row(family: str, label: str, error: float, ops: OpCount, *, coding: str, seconds: float = 0.0, **extra) -> dict:
    """One row of the table: the family, its label, the error (%), the operations and how the codes were found."""
    return {
        "family": family,
        "label": label,
        "error": error,
        "additions": ops.additions,
        "multiplications": ops.multiplications,
        "shifts": ops.shifts,
        "total_ops": ops.additions + ops.multiplications + ops.shifts,
        "coding": coding,
        "seconds": round(seconds, 3),
        **extra,
    }


def orthonormal_error(y: torch.Tensor, dictionary: torch.Tensor, s: int) -> float:
    """Error (%) of the exact ``s``-sparse codes ``T_s(Y D)`` of an orthonormal ``D``."""
    return float(representation_error(y, keep_largest(y @ dictionary, s), dictionary))
