"""One eigendecomposition of ``W`` per step, O(d^2) per sample after it: the resolvent ``(I - 2 s W)^{-1}``.

Lemma 1 of "One Reflection Suffice" needs, for every sample, ``det(A)`` and ``v^T A^{-1} u`` with
``A = I - 2 s W`` and a per-sample scalar ``s``. With ``W = P diag(lambda) P^{-1}`` computed once,

    log|det A|      = sum_i log|1 - 2 s lambda_i|
    a^T A^{-1} b    = (P^T a)^T diag(1 / (1 - 2 s lambda)) (P^{-1} b),

so the per-sample cost drops from O(d^3) to two matrix-vector products. Gradients are written in closed
form in the same eigenbasis (:class:`_ResolventTerms`), so they never differentiate the eigenvectors and
stay finite when eigenvalues repeat (e.g. ``W = I + V V^T`` at ``V = I``).
"""

from __future__ import annotations

import torch


class EigenResolvent:
    """Eigendecomposition of a fixed ``(d, d)`` matrix ``W`` for many resolvent evaluations.

    Args:
        weight: ``(d, d)`` real matrix (detached inside; gradients go through :func:`resolvent_terms`).
        symmetric: use ``eigh`` (real, orthogonal eigenvectors). Otherwise ``eig`` with complex eigenpairs.

    Attributes:
        reliable: ``False`` when ``W`` is (numerically) not diagonalisable, i.e. the eigenvector matrix has a
            condition number above ``eps ** -0.5``; callers should then fall back to dense solves.
    """

    def __init__(self, weight: torch.Tensor, *, symmetric: bool) -> None:
        weight = weight.detach()
        self.real_dtype = weight.dtype
        if symmetric:
            self.eigenvalues, self.vectors = torch.linalg.eigh(weight)
            self.vectors_inverse = self.vectors.mT
            self.reliable = True
        else:
            self.eigenvalues, self.vectors = torch.linalg.eig(weight)
            condition = torch.linalg.cond(self.vectors)
            self.reliable = bool(torch.isfinite(condition)) and float(condition) < torch.finfo(weight.dtype).eps ** -0.5
            self.vectors_inverse = torch.linalg.inv(self.vectors) if self.reliable else self.vectors.mH
            # Real forms of the four products the hot paths need, so that real rows times complex matrices
            # (and the real part of complex rows times complex matrices) are single real GEMMs: half the
            # flops of complex GEMMs, and no complex copy of the real input.
            self._left = _interleaved_columns(self.vectors)  # a -> P^T a
            self._right = _interleaved_columns(self.vectors_inverse.mT)  # b -> P^{-1} b
            self._back = _interleaved_rows(self.vectors.mT)  # z -> Re(z P^T)
            self._back_inverse = _interleaved_rows(self.vectors_inverse)  # z -> Re(z P^{-1})

    @property
    def is_complex(self) -> bool:
        return self.eigenvalues.is_complex()

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.eigenvalues.dtype) if self.is_complex else t

    def _real(self, t: torch.Tensor) -> torch.Tensor:
        return t.real if t.is_complex() else t

    def diagonal(self, s: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: the eigenvalues ``1 - 2 s lambda_i`` of ``A = I - 2 s W`` for ``s`` of shape ``(...)``."""
        return 1.0 - 2.0 * self._cast(s).unsqueeze(-1) * self.eigenvalues

    def project_left(self, a: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``P^T a`` for real rows ``a`` (complex when ``W`` has complex eigenvalues)."""
        return _real_rows_times(a, self._left) if self.is_complex else a @ self.vectors

    def project_right(self, b: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``P^{-1} b`` for real rows ``b``."""
        return _real_rows_times(b, self._right) if self.is_complex else b @ self.vectors_inverse.mT

    def back_project(self, z: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``Re(P z)`` for rows ``z`` in the eigenbasis (real in exact arithmetic)."""
        return _real_part_of_rows_times(z, self._back) if self.is_complex else z @ self.vectors.mT

    def back_project_transpose(self, z: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: ``Re(P^{-T} z)`` for rows ``z``."""
        return _real_part_of_rows_times(z, self._back_inverse) if self.is_complex else z @ self.vectors_inverse

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


class _ResolventTerms(torch.autograd.Function):
    """``(log|det A|, a^T A^{-1} b)`` for ``A = I - 2 s W``, batched over rows, with closed-form gradients.

    With ``y = A^{-1} b`` and ``z = A^{-T} a``:
      d log|det A| / dW = -2 s A^{-T},          d log|det A| / ds = -2 tr(A^{-1} W)
      d (a^T A^{-1} b) / dW = 2 s z y^T,         d (a^T A^{-1} b) / ds = 2 z^T W y,
      d / da = y,                                 d / db = z.
    All are evaluated in the eigenbasis of ``W``; the batch sums over rows become one ``(d, B) x (B, d)``
    product, so the backward pass is O(B d^2 + d^3) like the forward pass.
    """

    @staticmethod
    def forward(ctx, weight, s, a, b, resolvent: EigenResolvent):  # noqa: D102
        diagonal = resolvent.diagonal(s)
        inverse = diagonal.reciprocal()  # one complex division, then only multiplications (much cheaper)
        left, right = resolvent.project_left(a), resolvent.project_right(b)
        logabsdet = torch.log(diagonal.abs()).sum(-1)
        quadratic = resolvent._real((left * right * inverse).sum(-1))
        ctx.resolvent = resolvent
        ctx.save_for_backward(s, inverse, left, right)
        return logabsdet.to(weight.dtype), quadratic.to(weight.dtype)

    @staticmethod
    def backward(ctx, grad_logabsdet, grad_quadratic):  # noqa: D102
        resolvent: EigenResolvent = ctx.resolvent
        s, inverse, left, right = ctx.saved_tensors
        eigenvalues, vectors, vectors_inverse = resolvent.eigenvalues, resolvent.vectors, resolvent.vectors_inverse
        cast, real = resolvent._cast, resolvent._real
        g1 = cast(grad_logabsdet) if grad_logabsdet is not None else torch.zeros_like(inverse[..., 0])
        g2 = cast(grad_quadratic) if grad_quadratic is not None else torch.zeros_like(inverse[..., 0])
        cs = cast(s)
        left_scaled = left * inverse  # rows of P^T z expressed before P^{-T}:  z = P^{-T} left_scaled
        right_scaled = right * inverse  # y = P right_scaled

        grad_s = g1 * (-2.0 * (eigenvalues * inverse).sum(-1)) + g2 * 2.0 * (
            left_scaled * eigenvalues * right_scaled
        ).sum(-1)
        grad_a = resolvent.back_project(g2.unsqueeze(-1) * right_scaled)
        grad_b = resolvent.back_project_transpose(g2.unsqueeze(-1) * left_scaled)

        # -2 s A^{-T} summed over rows = P^{-T} diag(sum_b -2 g1 s / D) P^T ;
        # 2 s z y^T summed over rows = P^{-T} (sum_b 2 g2 s left_scaled^T right_scaled) P^T.
        flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
        weights_det = flat((-2.0 * g1 * cs).unsqueeze(-1) * inverse).sum(0)
        core = torch.diag_embed(weights_det) + flat((2.0 * g2 * cs).unsqueeze(-1) * left_scaled).mT @ flat(right_scaled)
        grad_weight = real(vectors_inverse.mT @ core @ vectors.mT)
        dtype = resolvent.real_dtype
        return grad_weight.to(dtype), grad_s.real.to(dtype) if grad_s.is_complex() else grad_s, grad_a, grad_b, None


def resolvent_terms(
    weight: torch.Tensor, s: torch.Tensor, a: torch.Tensor, b: torch.Tensor, resolvent: EigenResolvent
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log|det(I - 2 s W)|, a^T (I - 2 s W)^{-1} b)`` for every row.

    Args:
        weight: ``(d, d)``, the matrix ``resolvent`` was built from (gradients flow to it).
        s: ``(...)`` scalars; ``a``, ``b``: ``(..., d)``.
        resolvent: ``EigenResolvent(weight)``, built once per step and shared between calls.

    Returns:
        Two ``(...)`` tensors.
    """
    return _ResolventTerms.apply(weight, s, a, b, resolvent)
