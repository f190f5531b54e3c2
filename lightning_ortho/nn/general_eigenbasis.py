"""The auxiliary reflection with an unconstrained ``W``, its log-determinant computed in ``W``'s eigenbasis.

As for a symmetric ``W`` (:mod:`~lightning_ortho.nn.symmetric_eigenbasis`), ``f(x) = H(W x) x = A(s) x`` with
``A(s) = I - 2 s W`` and ``s = x^T W x / ||W x||^2``. Lemma 1 with ``W = P diag(lambda) P^{-1}`` and, per vector,
``a = P^T x``, ``b = P^{-1} x``:

    log|det J(x)| = sum_i log|1 - 2 s lambda_i| + log|1 + 2 F / ||W x||^2|,
    F = x^T W A^{-1} W x = sum_i lambda_i^2 a_i b_i / (1 - 2 s lambda_i).

``W`` is real, so its eigenpairs come in conjugate pairs whose terms are conjugate: each pair is computed once
and counted twice (weight 2; real eigenvalues weight 1). The ``m <= d`` kept eigenvectors in real/imaginary
parts make ``a`` and ``b`` two real ``d x d`` GEMMs; together with ``u = W x`` the forward pass is one GEMM
with a ``(d + 4 m, d)`` matrix, then O(d) elementwise work per vector. Complex numbers are carried as pairs of
real planes (``_re``, ``_im``), which keeps the column layout (``x: (..., d, L)``) copy-free.

Gradients are closed-form (:class:`_GeneralReflectLogDet`); they never differentiate eigenvectors.
When ``W``'s eigenvectors are ill-conditioned (``W`` near a defective matrix) the basis reports
``reliable = False`` and callers fall back to dense per-vector determinants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightning_ortho.nn._checks import has_values, refuse_double_backward
from lightning_ortho.nn._undefined import reflection_scale, row_scale


@dataclass(frozen=True)
class GeneralEigenbasis:
    """One eigenvalue of each conjugate pair of ``W`` (and every real one), with the matrices the hot paths use.

    Attributes:
        reliable: ``False`` when the eigenvector matrix is numerically singular (condition number estimate
            ``||P||_F ||P^{-1}||_F`` above ``eps ** -0.5``) or the eigenvalues are not in conjugate pairs.
        eigenvalues: ``(m,)`` complex representatives; ``weights``: ``(m,)`` 2 for a pair, 1 for a real one.
        stacked: ``(d + 4 m, d)`` ``[W; Re P_h^T; Im P_h^T; Re P^{-1}_h; Im P^{-1}_h]``.
        vectors, inverse_rows: ``(d, m)`` columns of ``P`` and ``(m, d)`` rows of ``P^{-1}`` kept.
        back, back_inverse: ``(d, 2 m)`` ``[Re P_h, -Im P_h]`` and ``[Re P^{-T}_h, -Im P^{-T}_h]``:
            ``Re(P_h c)`` for ``c`` stored as ``[Re c; Im c]`` is one real GEMM.
    """

    reliable: bool
    eigenvalues: torch.Tensor
    weights: torch.Tensor
    stacked: torch.Tensor
    vectors: torch.Tensor
    inverse_rows: torch.Tensor
    back: torch.Tensor
    back_inverse: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> GeneralEigenbasis:
        """Eigendecomposition of a real ``(d, d)`` ``weight`` (detached): one ``eig`` and one inverse."""
        weight = weight.detach()
        eigenvalues, vectors = torch.linalg.eig(weight)
        inverse, info = torch.linalg.inv_ex(vectors)  # a singular P (defective W) is flagged below, not raised
        imag = eigenvalues.imag
        # LAPACK returns real eigenvalues with an exactly zero imaginary part and pairs as (lambda, conj lambda).
        # (A meta W has no values to pair: keeping all d gives the shapes of the results, which do not depend on m.)
        keep = imag >= 0 if has_values(weight) else slice(None)
        if has_values(weight):
            # Eigenvectors come with unit norm, so ||P||_F = sqrt(d); one host sync for both checks.
            unpaired, inverse_norm2 = torch.stack(
                ((imag > 0).sum().to(weight.dtype) - (imag < 0).sum(), torch.view_as_real(inverse).square().sum())
            ).tolist()
            condition = (weight.shape[0] * inverse_norm2) ** 0.5
            reliable = (
                int(info) == 0
                and unpaired == 0
                and math.isfinite(condition)
                and condition < torch.finfo(weight.dtype).eps ** -0.5
            )
        else:  # a meta W (shape propagation): nothing to decide on; the eigenbasis route has the right shapes
            reliable = True
        kept_vectors, kept_rows = vectors[:, keep], inverse[keep, :]
        stacked = torch.cat((weight, kept_vectors.mT.real, kept_vectors.mT.imag, kept_rows.real, kept_rows.imag))
        return cls(
            reliable=reliable,
            eigenvalues=eigenvalues[keep],
            weights=torch.where(imag[keep] > 0, 2.0, 1.0).to(weight.dtype),
            stacked=stacked,
            vectors=kept_vectors,
            inverse_rows=kept_rows,
            back=torch.cat((kept_vectors.real, -kept_vectors.imag), dim=1),
            back_inverse=torch.cat((kept_rows.mT.real, -kept_rows.mT.imag), dim=1),
        )

    def reflect_and_log_abs_det(
        self, x: torch.Tensor, weight: torch.Tensor, rotation: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`general_reflect_and_log_abs_det` of ``R x`` (``R`` an optional fixed ``(d, d)`` matrix)."""
        return general_reflect_and_log_abs_det(x if rotation is None else rotation @ x, weight, self)

    def solve_shifted(self, s: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``(N, d)``: ``(I - 2 s_i W)^{-1} b_i`` for rows ``b: (N, d)`` and scalars ``s: (N,)``, O(d^2) per row.

        ``A^{-1} b = P diag(1 / (1 - 2 s lambda)) P^{-1} b``, with each conjugate pair computed once and counted
        twice (its two terms are conjugate): two real GEMMs per call, no complex arithmetic on ``d x d`` data.
        """
        d, m = b.shape[-1], self.eigenvalues.shape[0]
        c_re, c_im = (b @ self.stacked[d + 2 * m :].mT).split([m, m], dim=-1)  # P^{-1} b, kept rows
        scale = -2.0 * s.unsqueeze(-1)
        d_re, d_im = 1.0 + scale * self.eigenvalues.real, scale * self.eigenvalues.imag
        modulus2 = d_re.square() + d_im.square()
        z_re = self.weights * (c_re * d_re + c_im * d_im) / modulus2
        z_im = self.weights * (c_im * d_re - c_re * d_im) / modulus2
        return torch.cat((z_re, z_im), dim=-1) @ self.back.mT  # Re(P_h z)


def general_reflect_and_log_abs_det(
    x: torch.Tensor, weight: torch.Tensor, basis: GeneralEigenbasis
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f(x), log|det J_f(x)|)`` for every column of ``x``, ``f(x) = H(W x) x``.

    Args:
        x: ``(..., d, L)``: ``L`` vectors per batch entry, stored as columns.
        weight: ``(d, d)`` ``W`` (gradients flow to it and to ``x``).
        basis: :class:`GeneralEigenbasis` of ``weight``, computed once per step (use it only if ``reliable``).

    Returns:
        ``y`` of shape ``(..., d, L)`` and the log-determinants ``(..., L)``; where ``W x = 0`` the reflection
        is undefined, ``f`` is the identity and the log-determinant is 0. Double backward is not supported.

    Every column is computed at unit scale (``f(x) = s f(x / s)``, ``J`` of degree 0, with the power-of-two
    scale of :func:`~lightning_ortho.nn._undefined.row_scale`): a 1e-20 or 1e19 column keeps ``||W x||^2`` in
    range and its gradients finite.
    """
    scale = row_scale(x, dim=-2)
    y, log_det = _GeneralReflectLogDet.apply(x / scale, weight, basis)
    return y * scale, log_det


def _times(a_re, a_im, b_re, b_im):
    """Complex product of real/imaginary planes."""
    return a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re


def _powers(basis: GeneralEigenbasis) -> tuple[torch.Tensor, ...]:
    """``(m, 1)`` columns: ``Re, Im`` of ``w lambda``, ``w lambda^2`` and ``w lambda^3`` (``w`` the pair weights)."""
    weighted = basis.weights * basis.eigenvalues
    columns = []
    for power in (weighted, weighted * basis.eigenvalues, weighted * basis.eigenvalues.square()):
        columns += [power.real.unsqueeze(-1), power.imag.unsqueeze(-1)]
    return tuple(columns)


class _GeneralReflectLogDet(torch.autograd.Function):
    """``(f(x), log|det J_f(x)|)`` in the eigenbasis of an unconstrained ``W`` (see the module docstring).

    Backward, per vector, with ``u = W x``, ``q = ||u||^2``, ``t = u.x``, ``s = t / q``, ``A = I - 2 s W``,
    ``r = A^{-1} W x``, ``p = A^{-T} W^T x`` (both one real GEMM from the eigenbasis):
      dF/dW = x r^T + 2 s p r^T + p x^T,   dF/dx = W r + W^T p,   dF/ds = 2 sum lambda^3 a b / D^2,
      d(sum log|D|)/dW = -2 s A^{-T},      d(sum log|D|)/ds = -2 sum lambda / D,
    chained through ``y = x - 2 s u``, ``s = t / q`` and ``u = W x``. The weight gradient is two GEMMs summed
    over vectors plus ``P^{-T} diag(.) P^T`` for the determinant term.
    """

    @staticmethod
    def forward(ctx, x, weight, basis: GeneralEigenbasis):  # noqa: D102
        d, m = x.shape[-2], basis.eigenvalues.shape[0]
        lam_re, lam_im = basis.eigenvalues.real.unsqueeze(-1), basis.eigenvalues.imag.unsqueeze(-1)
        _, _, w_lam2_re, w_lam2_im, _, _ = _powers(basis)
        u, a_re, a_im, b_re, b_im = (basis.stacked @ x).split([d, m, m, m, m], dim=-2)
        t, q = (u * x).sum(-2), u.square().sum(-2)
        s, q, defined = reflection_scale(t, q)
        scale = s.unsqueeze(-2)
        d_re, d_im = 1.0 - 2.0 * scale * lam_re, -2.0 * scale * lam_im  # D = 1 - 2 s lambda
        modulus2 = d_re.square() + d_im.square()
        inv_re, inv_im = d_re / modulus2, -d_im / modulus2  # 1 / D
        log_det_a = (0.5 * basis.weights.unsqueeze(-1) * torch.log(modulus2)).sum(-2)
        g_re, g_im = _times(a_re, a_im, b_re, b_im)
        x_re, x_im = _times(w_lam2_re, w_lam2_im, g_re, g_im)
        quadratic = (x_re * inv_re - x_im * inv_im).sum(-2)
        ratio = 1.0 + 2.0 * quadratic / q
        log_det = torch.where(defined, log_det_a + torch.log(ratio.abs()), torch.zeros_like(q))
        y = x - 2.0 * scale * u
        ctx.basis = basis
        ctx.save_for_backward(x, weight, u, a_re, a_im, b_re, b_im, inv_re, inv_im, s, q, quadratic, ratio, defined)
        return y, log_det

    @staticmethod
    def backward(ctx, grad_y, grad_log_det):  # noqa: D102
        refuse_double_backward()
        basis: GeneralEigenbasis = ctx.basis
        x, weight, u, a_re, a_im, b_re, b_im, inv_re, inv_im, s, q, quadratic, ratio, defined = ctx.saved_tensors
        w_lam_re, w_lam_im, _, _, w_lam3_re, w_lam3_im = _powers(basis)
        row = lambda t: t.unsqueeze(-2)  # noqa: E731  (..., L) -> (..., 1, L), broadcast over features
        grad_log_det = torch.where(defined, grad_log_det, torch.zeros_like(grad_log_det))
        grad_ratio = grad_log_det / ratio
        grad_quadratic = 2.0 * grad_ratio / q
        grad_q = -2.0 * (quadratic / q) * grad_ratio / q  # not / q^2, which underflows first

        # w lambda / D, the building block of d(log|det A|)/ds, r and p.
        wl_re, wl_im = _times(w_lam_re, w_lam_im, inv_re, inv_im)
        g_re, g_im = _times(a_re, a_im, b_re, b_im)
        c_re, c_im = _times(w_lam3_re, w_lam3_im, g_re, g_im)  # w lambda^3 a b
        inv2_re, inv2_im = _times(inv_re, inv_im, inv_re, inv_im)
        grad_s = (
            -2.0 * (grad_y * u).sum(-2)
            - 2.0 * grad_log_det * wl_re.sum(-2)
            + 2.0 * grad_quadratic * (c_re * inv2_re - c_im * inv2_im).sum(-2)
        )
        grad_s = torch.where(defined, grad_s, torch.zeros_like(grad_s))
        grad_t = grad_s / q
        grad_q = grad_q - grad_s * s / q
        grad_u = -2.0 * row(s) * grad_y + row(grad_t) * x + 2.0 * row(grad_q) * u

        beta = torch.cat(_times(wl_re, wl_im, b_re, b_im), dim=-2)  # w lambda b / D
        alpha = torch.cat(_times(wl_re, wl_im, a_re, a_im), dim=-2)  # w lambda a / D
        r = basis.back @ beta  # A^{-1} W x
        p = basis.back_inverse @ alpha  # A^{-T} W^T x
        weight = weight.detach()
        left_x = grad_u + row(grad_quadratic) * p
        left_r = row(grad_quadratic) * (x + 2.0 * row(s) * p)
        grad_x = grad_y + row(grad_t) * u + weight.mT @ left_x + weight @ (row(grad_quadratic) * r)

        d, n = x.shape[-2], x.shape[-1]
        flat = lambda t: t.reshape(-1, d, n)  # noqa: E731
        grad_weight = torch.baddbmm(flat(left_x) @ flat(x).mT, flat(left_r), flat(r).mT).sum(0)
        scale = (-2.0 * grad_log_det * s).reshape(-1, n, 1)
        det_re = (inv_re.reshape(-1, inv_re.shape[-2], n) @ scale).sum(0).squeeze(-1)
        det_im = (inv_im.reshape(-1, inv_im.shape[-2], n) @ scale).sum(0).squeeze(-1)
        diagonal = basis.weights * torch.complex(det_re, det_im)
        grad_weight = grad_weight + (basis.inverse_rows.mT @ (diagonal.unsqueeze(-1) * basis.vectors.mT)).real
        return grad_x, grad_weight, None
