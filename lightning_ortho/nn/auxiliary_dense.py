"""Theorem 3's Jacobian and Lemma 1's log-determinant with dense per-vector matrices: the reference route.

For ``f(x) = H(n(x)) x`` with ``N = dn/dx`` (``N = W`` for ``n(x) = W x``), ``s = n.x / ||n||^2`` and
``A = I - 2 s N``, Theorem 3 (with the chain rule for a general ``n``) gives

    J(x) = H(n) A - 2 n (N^T x)^T / ||n||^2,
    det J(x) = -det(A) (1 + 2 (N^T x)^T A^{-1} n / ||n||^2)        (Lemma 1).

Each vector costs a ``d x d`` determinant and solve, O(d^3): this is the only route for a custom auxiliary
network and the fallback for a ``W`` whose eigenvectors are ill-conditioned; the fast routes diagonalise ``W``
once (:mod:`~lightning_ortho.nn.symmetric_eigenbasis`, :mod:`~lightning_ortho.nn.general_eigenbasis`).
Where ``n(x) = 0`` the reflection is undefined and ``f`` is the identity there (:mod:`~lightning_ortho.nn._undefined`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_ortho.nn._undefined import reflection_scalars


def network_and_jacobian(
    network: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n(x), dn/dx)`` with shapes ``(..., d)`` and ``(..., d, d)``; the Jacobian by ``torch.func``, so the
    network must be a pure function of its input (no batch statistics)."""
    d = x.shape[-1]
    jacobian = torch.func.vmap(torch.func.jacrev(network))(x.reshape(-1, d))
    return network(x), jacobian.reshape(*x.shape, d)


def linear_and_jacobian(weight: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W x, W)`` for rows ``x`` of shape ``(..., d)``, with ``W`` broadcast to ``(..., d, d)`` (a view)."""
    d = x.shape[-1]
    return x @ weight.mT, weight.expand(*x.shape[:-1], d, d)


def dense_jacobian(x: torch.Tensor, n: torch.Tensor, jac_n: torch.Tensor) -> torch.Tensor:
    """``(..., d, d)``: Theorem 3's ``J(x)`` for rows ``x``, ``n = n(x)`` ``(..., d)`` and ``N`` ``(..., d, d)``;
    ``I`` where ``n = 0``."""
    q, s, defined = reflection_scalars(x, n)
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    a = eye - 2.0 * s[..., None, None] * jac_n
    w = (x.unsqueeze(-2) @ jac_n).squeeze(-2)  # (N^T x)^T = x^T N
    nq = n / q.unsqueeze(-1)
    householder = eye - 2.0 * nq.unsqueeze(-1) * n.unsqueeze(-2)
    jac = householder @ a - 2.0 * nq.unsqueeze(-1) * w.unsqueeze(-2)
    return torch.where(defined[..., None, None], jac, eye)


def dense_log_abs_det_jacobian(x: torch.Tensor, n: torch.Tensor, jac_n: torch.Tensor) -> torch.Tensor:
    """``(...)``: Lemma 1's ``log|det J(x)|`` with ``slogdet(A)`` and one solve per row; 0 where ``n = 0``."""
    q, s, defined = reflection_scalars(x, n)
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    a = eye - 2.0 * s[..., None, None] * jac_n
    w = (x.unsqueeze(-2) @ jac_n).squeeze(-2)
    _, log_det_a = torch.linalg.slogdet(a)
    quadratic = torch.linalg.vecdot(w, torch.linalg.solve(a, n.unsqueeze(-1)).squeeze(-1))
    value = log_det_a + torch.log(torch.abs(1.0 + 2.0 * quadratic / q))
    return torch.where(defined, value, torch.zeros_like(value))
