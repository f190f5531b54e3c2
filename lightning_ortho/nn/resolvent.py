"""One eigendecomposition of ``W``, then ``(I - 2 s W)^{-1} b`` in O(d^2) per sample for many scalars ``s``.

Newton's method for an unconstrained auxiliary reflection (Sherman-Morrison on the rank-one structure of
Theorem 3's Jacobian) needs ``A^{-1} b`` with ``A = I - 2 s W`` and a different ``s`` for every sample. With
``W = P diag(lambda) P^{-1}`` computed once, ``A^{-1} b = P diag(1 / (1 - 2 s lambda)) P^{-1} b``: two
matrix-vector products per sample instead of a ``d x d`` solve. (The forward pass and log-determinant use the
same idea in :mod:`~lightning_ortho.nn.general_eigenbasis`, with gradients.)
"""

from __future__ import annotations

import torch


class EigenResolvent:
    """Eigendecomposition of a fixed ``(d, d)`` matrix ``W`` for many resolvent evaluations.

    Args:
        weight: ``(d, d)`` real matrix (detached inside; no gradients).
        symmetric: use ``eigh`` (real, orthogonal eigenvectors). Otherwise ``eig`` with complex eigenpairs.

    Attributes:
        reliable: ``False`` when ``W`` is (numerically) not diagonalisable, i.e. the eigenvector matrix has a
            condition number above ``eps ** -0.5``; callers should then fall back to dense solves.
    """

    def __init__(self, weight: torch.Tensor, *, symmetric: bool) -> None:
        weight = weight.detach()
        if symmetric:
            self.eigenvalues, self.vectors = torch.linalg.eigh(weight)
            self.vectors_inverse = self.vectors.mT
            self.reliable = True
        else:
            self.eigenvalues, self.vectors = torch.linalg.eig(weight)
            condition = torch.linalg.cond(self.vectors)
            self.reliable = bool(torch.isfinite(condition)) and float(condition) < torch.finfo(weight.dtype).eps ** -0.5
            self.vectors_inverse = torch.linalg.inv(self.vectors) if self.reliable else self.vectors.mH
            # Real forms of the two products, so that real rows times complex matrices (and the real part of
            # complex rows times complex matrices) are single real GEMMs: half the flops of complex GEMMs.
            self._right = _interleaved_columns(self.vectors_inverse.mT)  # b -> P^{-1} b
            self._back = _interleaved_rows(self.vectors.mT)  # z -> Re(z P^T)

    @property
    def is_complex(self) -> bool:
        return self.eigenvalues.is_complex()

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.eigenvalues.dtype) if self.is_complex else t

    def diagonal(self, s: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: the eigenvalues ``1 - 2 s lambda_i`` of ``A = I - 2 s W`` for ``s`` of shape ``(...)``."""
        return 1.0 - 2.0 * self._cast(s).unsqueeze(-1) * self.eigenvalues

    def project_right(self, b: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``P^{-1} b`` for real rows ``b``."""
        return _real_rows_times(b, self._right) if self.is_complex else b @ self.vectors_inverse.mT

    def back_project(self, z: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``Re(P z)`` for rows ``z`` in the eigenbasis (real in exact arithmetic)."""
        return _real_part_of_rows_times(z, self._back) if self.is_complex else z @ self.vectors.mT

    def solve(self, s: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``(I - 2 s W)^{-1} b`` row by row, O(d^2) per row."""
        return self.back_project(self.project_right(b) / self.diagonal(s))


def _interleaved_columns(matrix: torch.Tensor) -> torch.Tensor:
    """``(d, 2d)`` real matrix with columns ``Re M[:, 0], Im M[:, 0], Re M[:, 1], ...``: ``a @ it`` is ``a @ M``
    laid out as ``view_as_real``."""
    return torch.stack([matrix.real, matrix.imag], dim=-1).reshape(matrix.shape[0], 2 * matrix.shape[1])


def _interleaved_rows(matrix: torch.Tensor) -> torch.Tensor:
    """``(2d, d)`` real matrix with rows ``Re M[0], -Im M[0], Re M[1], ...``: ``view_as_real(z) @ it`` is ``Re(z @ M)``."""
    return torch.stack([matrix.real, -matrix.imag], dim=1).reshape(2 * matrix.shape[0], matrix.shape[1])


def _real_rows_times(a: torch.Tensor, interleaved: torch.Tensor) -> torch.Tensor:
    out = a @ interleaved.to(a.dtype)
    return torch.view_as_complex(out.reshape(*out.shape[:-1], out.shape[-1] // 2, 2))


def _real_part_of_rows_times(z: torch.Tensor, interleaved: torch.Tensor) -> torch.Tensor:
    flat = torch.view_as_real(z.contiguous())
    return flat.reshape(*flat.shape[:-2], 2 * flat.shape[-2]) @ interleaved
