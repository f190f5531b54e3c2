"""The auxiliary reflection with a symmetric ``W`` (Theorem 2's layer), computed in ``W``'s eigenbasis.

``H(u) x = x - 2 (u.x / ||u||^2) u``, so with ``n(x) = W x`` the layer is ``f(x) = A(s) x`` where
``A(s) = I - 2 s W`` and ``s = x^T W x / ||W x||^2`` is one scalar per vector. For a symmetric
``W = P diag(lambda) P^T`` (``P`` orthogonal) and ``z = P^T x`` everything is diagonal:

    s = sum_i lambda_i z_i^2 / sum_i lambda_i^2 z_i^2,         f(x) = P ((1 - 2 s lambda) * z),
    log|det J(x)| = sum_i log|1 - 2 s lambda_i|
                    + log|1 + 2 sum_i lambda_i^2 z_i^2 / (1 - 2 s lambda_i) / ||W x||^2|     (Lemma 1, u = v = W x)

so a batch costs two GEMMs (``P^T x`` and ``P (.)``) and O(d) elementwise work per vector after one ``eigh``
per step: the same GEMM count as a dense layer's forward and backward, and no per-vector ``d x d`` solve.
Gradients are written in closed form in the eigenbasis (:class:`_SymmetricReflectLogDet`); they never
differentiate the eigenvectors, so they stay finite when eigenvalues repeat (``V = I`` at initialisation).

The inverse is a scalar problem: ``f(x) = y`` iff ``x = P (z_y / (1 - 2 s lambda))`` with ``z_y = P^T y`` and
``s`` a root of ``phi(s) = sum_i lambda_i (s lambda_i - 1) z_{y,i}^2 / (1 - 2 s lambda_i)^2``. For a positive
definite ``W``, ``s`` is a weighted mean of the ``1 / lambda_i``, so the root lies in
``[1 / lambda_max, 1 / lambda_min]`` where ``phi`` changes sign: a bracketed scalar Newton iteration with
O(d) work per vector and step (:func:`symmetric_newton_inverse`).

Vectors are stored as columns, ``x: (..., d, L)``: an NCHW image viewed as ``(N, C, H*W)`` needs no copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from lightning_ortho.nn._checks import refuse_double_backward
from lightning_ortho.nn._undefined import reflection_scale, row_scale
from lightning_ortho.nn.newton import NewtonResult


@dataclass(frozen=True)
class SymmetricEigenbasis:
    """``W = P diag(eigenvalues) P^T`` for a symmetric ``W`` (constants: no gradient flows through them).

    Attributes:
        eigenvalues: ``(d,)`` ascending.
        vectors: ``(d, d)`` orthogonal ``P``.
    """

    eigenvalues: torch.Tensor
    vectors: torch.Tensor

    #: An orthogonal eigenbasis is always well conditioned (same attribute as the general eigenbasis).
    reliable: ClassVar[bool] = True

    @classmethod
    def of(cls, weight: torch.Tensor) -> SymmetricEigenbasis:
        """Eigendecomposition of a symmetric ``(d, d)`` ``weight`` (detached)."""
        eigenvalues, vectors = torch.linalg.eigh(weight.detach())
        return cls(eigenvalues, vectors)

    def reflect_and_log_abs_det(
        self, x: torch.Tensor, weight: torch.Tensor, rotation: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`symmetric_reflect_and_log_abs_det` with this basis."""
        return symmetric_reflect_and_log_abs_det(x, weight, self, rotation)


def symmetric_reflect_and_log_abs_det(
    x: torch.Tensor, weight: torch.Tensor, basis: SymmetricEigenbasis, rotation: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f(R x), log|det J_f(R x)|)`` for every column of ``x``, ``f(x) = H(W x) x``, ``W`` symmetric.

    Args:
        x: ``(..., d, L)``: ``L`` vectors per batch entry, stored as columns.
        weight: ``(d, d)`` symmetric ``W`` (gradients flow to it and to ``x``).
        basis: :class:`SymmetricEigenbasis` of ``weight``, computed once per step.
        rotation: optional fixed ``(d, d)`` matrix ``R`` applied before ``f`` (no gradient); the returned
            log-determinant is that of ``f`` alone (add ``log|det R|`` for the composition).

    Returns:
        ``y`` of shape ``(..., d, L)`` and the log-determinants ``(..., L)``; where ``W R x = 0`` the
        reflection is undefined, ``f`` is the identity and the log-determinant is 0.

    Every column is computed at unit scale (``f(R x) = s f(R x / s)``, ``J`` of degree 0, with the power-of-two
    scale of :func:`~lightning_ortho.nn._undefined.row_scale`, which divides exactly): a 1e-20 or 1e19 column keeps
    ``||W R x||^2`` in range and its gradients finite.

    Double backward is not supported (the backward pass is hand-written and raises if differentiated).
    """
    scale = row_scale(x, dim=-2)
    projection = basis.vectors.mT if rotation is None else basis.vectors.mT @ rotation
    y, log_det = _SymmetricReflectLogDet.apply(x / scale, weight, basis.eigenvalues, basis.vectors, projection)
    return y * scale, log_det


#: Factors multiplied before one logarithm in ``sum_i log|D_i|``. Under Theorem 2 every ``|D_i|`` lies in
#: ``[1/3, 2]`` (``s`` in ``[2/3, 1]``, ``lambda`` in ``[1, 3/2)``), so 32 of them stay far inside float32's range;
#: a logarithm costs ten multiplications, and this makes the determinant term four times cheaper.
_PRODUCT_CHUNK = 32


def _sum_log_abs(diagonal: torch.Tensor) -> torch.Tensor:
    """``sum_i log|D_i|`` over dim -2 as logarithms of products of up to ``_PRODUCT_CHUNK`` factors."""
    chunks = diagonal.split(_PRODUCT_CHUNK, dim=-2)
    total = torch.log(chunks[0].prod(-2).abs())
    for chunk in chunks[1:]:
        total = total + torch.log(chunk.prod(-2).abs())
    return total


def _moments(eigenvalues: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(t, q, lambda z^2)`` with ``t = sum lambda z^2 = x^T W x`` and ``q = sum lambda^2 z^2 = ||W x||^2``."""
    lam = eigenvalues.unsqueeze(-1)
    weighted = lam * z.square()
    return weighted.sum(-2), (lam * weighted).sum(-2), weighted


class _SymmetricReflectLogDet(torch.autograd.Function):
    """``(f(x'), log|det J_f(x')|)`` with ``x' = R x``, in the eigenbasis (see the module docstring).

    Backward, per vector, with ``z = P^T x'``, ``u = W x'`` (``u_hat = lambda z``), ``D = 1 - 2 s lambda``,
    ``rho = lambda z / D`` (``= P^T A^{-1} W x'``), ``F = sum lambda^2 z^2 / D``, ``q = ||u||^2``, ``t = u.x'``:
    the chain ``y = x' - 2 s u``, ``s = t / q``, ``log|det J| = sum log|D| + log|1 + 2 F / q|`` with
      dF/dW = x' r^T + 2 s r r^T + r x'^T  (r = A^{-1} W x' = P rho),   dF/dx' = 2 W r,   dF/ds = 2 sum lambda rho^2,
      d(sum log|D|)/dW = -2 s A^{-1},      d(sum log|D|)/ds = -2 sum lambda / D,
    all of which are diagonal or rank one in the eigenbasis; the weight gradient is ``P C P^T`` with the
    ``d x d`` core ``C`` summed over vectors by two batched GEMMs.
    """

    @staticmethod
    def forward(ctx, x, weight, eigenvalues, vectors, projection):  # noqa: D102
        lam = eigenvalues.unsqueeze(-1)
        z = projection @ x
        t, q, weighted = _moments(eigenvalues, z)
        s, q, defined = reflection_scale(t, q)
        diagonal = (s.unsqueeze(-2) * (-2.0 * lam)).add_(1.0)
        inverse = diagonal.reciprocal()
        quadratic = (lam * weighted * inverse).sum(-2)
        ratio = 1.0 + 2.0 * quadratic / q
        log_det = torch.where(defined, _sum_log_abs(diagonal) + torch.log(ratio.abs()), torch.zeros_like(q))
        y = vectors @ (diagonal * z)
        ctx.save_for_backward(eigenvalues, vectors, projection, z, inverse, s, q, quadratic, ratio, defined)
        return y, log_det

    @staticmethod
    def backward(ctx, grad_y, grad_log_det):  # noqa: D102
        refuse_double_backward()
        eigenvalues, vectors, projection, z, inverse, s, q, quadratic, ratio, defined = ctx.saved_tensors
        lam = eigenvalues.unsqueeze(-1)
        row = lambda t: t.unsqueeze(-2)  # noqa: E731  (..., L) -> (..., 1, L), broadcast over the d features
        grad_log_det = torch.where(defined, grad_log_det, torch.zeros_like(grad_log_det))
        grad_y_hat = vectors.mT @ grad_y
        u_hat = lam * z
        rho = u_hat * inverse
        grad_ratio = grad_log_det / ratio
        grad_quadratic = 2.0 * grad_ratio / q
        grad_q = -2.0 * (quadratic / q) * grad_ratio / q  # not / q^2, which underflows first
        grad_s = (
            -2.0 * (grad_y_hat * u_hat).sum(-2)
            - 2.0 * grad_log_det * (lam * inverse).sum(-2)
            + 2.0 * grad_quadratic * (lam * rho.square()).sum(-2)
        )
        grad_s = torch.where(defined, grad_s, torch.zeros_like(grad_s))
        grad_t = grad_s / q
        grad_q = grad_q - grad_s * s / q
        grad_u_hat = row(-2.0 * s) * grad_y_hat + row(grad_t) * z + row(2.0 * grad_q) * u_hat
        grad_x_hat = grad_y_hat + row(grad_t) * u_hat + lam * (grad_u_hat + row(2.0 * grad_quadratic) * rho)
        grad_x = projection.mT @ grad_x_hat

        d, n = z.shape[-2], z.shape[-1]
        flat = lambda t: t.reshape(-1, d, n)  # noqa: E731
        left_z = grad_u_hat + row(grad_quadratic) * rho
        left_rho = row(grad_quadratic) * (z + row(2.0 * s) * rho)
        core = torch.baddbmm(flat(left_z) @ flat(z).mT, flat(left_rho), flat(rho).mT).sum(0)
        core = core + torch.diag((flat(inverse) @ (-2.0 * grad_log_det * s).reshape(-1, n, 1)).sum((0, 2)))
        grad_weight = vectors @ core @ vectors.mT
        return grad_x, grad_weight, None, None, None


@torch.no_grad()
def symmetric_newton_inverse(
    y: torch.Tensor,
    basis: SymmetricEigenbasis,
    rotation: torch.Tensor | None = None,
    *,
    tol: float,
    max_iter: int = 50,
) -> NewtonResult:
    """Solve ``f(R x) = y`` for every column of ``y`` (``f(x) = H(W x) x``, ``W`` symmetric positive definite).

    Newton's method on the scalar equation ``phi(s) = 0`` of the module docstring, safeguarded by the bracket
    ``[1 / lambda_max, 1 / lambda_min]`` (a step that leaves the bracket is replaced by bisection, and the
    bracket shrinks with the sign of ``phi``), O(d) per vector and iteration, two GEMMs in all.

    Args:
        y: ``(..., d, L)`` columns.
        basis: eigenbasis of a positive definite ``W`` (raises ``ValueError`` otherwise).
        rotation: optional orthogonal ``R`` applied before ``f`` in the forward pass; the inverse applies ``R^T``.
        tol: relative residual ``||f(R x) - y|| / ||y||`` a column must reach to count as converged.
        max_iter: scalar Newton iterations at most.

    Returns:
        :class:`NewtonResult` with ``x`` of shape ``(..., d, L)`` and per-column ``iterations``, ``residual``
        (evaluated exactly from the returned ``x``, not from the scalar equation) and ``converged``.
    """
    lam = basis.eigenvalues.unsqueeze(-1)
    if not bool(basis.eigenvalues[0] > 0):
        raise ValueError(
            "symmetric_newton_inverse: W must be positive definite (lambda_min = "
            f"{float(basis.eigenvalues[0]):.3e}); use the general Newton inverse instead."
        )
    z_y = basis.vectors.mT @ y
    weight2 = lam * z_y.square()  # lambda_i z_i^2 > 0: phi(s) = sum weight2 (s lambda - 1) / D^2
    eps = torch.finfo(y.dtype).eps
    low = torch.full_like(z_y[..., 0, :], float(1.0 / basis.eigenvalues[-1]))
    high = torch.full_like(low, float(1.0 / basis.eigenvalues[0]))
    t, q, _ = _moments(basis.eigenvalues, z_y)
    s = torch.where(q > 0, t / q.clamp_min(torch.finfo(y.dtype).tiny), low).clamp(low, high)  # s(y): a good start
    iterations = torch.zeros_like(s, dtype=torch.long)
    active = q > 0
    for _ in range(max_iter):
        if not bool(active.any()):
            break
        diagonal = 1.0 - 2.0 * s.unsqueeze(-2) * lam
        inverse = diagonal.reciprocal()
        phi = (weight2 * (s.unsqueeze(-2) * lam - 1.0) * inverse.square()).sum(-2)
        slope = (weight2 * lam * (2.0 * s.unsqueeze(-2) * lam - 3.0) * inverse.pow(3)).sum(-2)
        low = torch.where(phi < 0, s, low)
        high = torch.where(phi > 0, s, high)
        newton = s - phi / slope
        inside = (newton >= low) & (newton <= high) & torch.isfinite(newton)
        candidate = torch.where(inside, newton, 0.5 * (low + high))
        step = (candidate - s).abs()
        s = torch.where(active, candidate, s)
        iterations = iterations + active.long()
        active = active & (step > 4.0 * eps * s.abs()) & (phi != 0)
    x_hat = z_y / (1.0 - 2.0 * s.unsqueeze(-2) * lam)
    # The residual of the returned x, computed exactly: s(x) from x itself, then f(x) in the eigenbasis.
    t_x, q_x, _ = _moments(basis.eigenvalues, x_hat)
    s_x, _, _ = reflection_scale(t_x, q_x)
    y_hat = (1.0 - 2.0 * s_x.unsqueeze(-2) * lam) * x_hat
    norm_y = torch.linalg.vector_norm(z_y, dim=-2)
    residual = torch.linalg.vector_norm(y_hat - z_y, dim=-2) / torch.where(norm_y > 0, norm_y, torch.ones_like(norm_y))
    projection = basis.vectors if rotation is None else rotation.mT @ basis.vectors
    x = projection @ x_hat
    return NewtonResult(x, iterations, residual, residual <= tol, tol)
