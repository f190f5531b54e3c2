"""Newton steps for inverting an unconstrained auxiliary reflection ``y = H(n(x)) x`` (section 2.2).

:func:`~lightning_ortho.nn.newton.homogeneous_newton` solves ``f(x) = y`` on the unit sphere (Lemma 2); it asks
for a step ``J(x)^{-1} r``. For ``n(x) = W x``, Theorem 3's Jacobian is a rank-one update of an easily inverted
matrix, ``J = H(u) A + u b^T`` with ``u = W x``, ``A = I - 2 s W``, ``b = -2 W^T x / ||u||^2``, so
Sherman-Morrison with ``A^{-1}`` from one eigendecomposition of ``W`` costs O(d^2) per row
(:func:`rank_one_step`). For a custom network, or a ``W`` whose eigenvectors are ill-conditioned, each row
solves with the dense ``J`` (:func:`dense_step`, O(d^3)).

(A Theorem-2 layer never comes here: its inverse is a scalar equation per vector,
:func:`~lightning_ortho.nn.symmetric_eigenbasis.symmetric_newton_inverse`.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_ortho.nn._undefined import reflection_scalars
from lightning_ortho.nn.general_eigenbasis import GeneralEigenbasis
from lightning_ortho.nn.reflection import reflect_unchecked

#: ``(x, r) -> (J(x)^{-1} r, ok)`` for ``(N, d)`` rows; ``ok`` is ``(N,)`` bool, False where ``J`` is singular.
NewtonStep = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def dense_step(jacobian: Callable[[torch.Tensor], torch.Tensor]) -> NewtonStep:
    """The step from a batched ``(N, d, d)`` Jacobian and ``torch.linalg.solve_ex``."""

    def step(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        solution, info = torch.linalg.solve_ex(jacobian(x), r)
        return solution, (info == 0) & torch.isfinite(solution).all(-1)

    return step


def rank_one_step(weight: torch.Tensor, basis: GeneralEigenbasis) -> NewtonStep:
    """The O(d^2)-per-row step for ``n(x) = W x``: ``M = H(u) A`` has ``M^{-1} = A^{-1} H(u)`` and ``M^{-1} u =
    -A^{-1} u``; Sherman-Morrison adds the rank-one term, whose denominator is Lemma 1's scalar factor.

    ``basis`` must be ``W``'s reliable eigenbasis (``basis.reliable``)."""

    def step(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, v = x @ weight.mT, x @ weight
        q, s, _ = reflection_scalars(x, u)
        m_inv_r = basis.solve_shifted(s, reflect_unchecked(r, u))
        a_inv_u = basis.solve_shifted(s, u)
        denominator = 1.0 + 2.0 * torch.linalg.vecdot(v, a_inv_u) / q
        correction = (-2.0 * torch.linalg.vecdot(v, m_inv_r) / q) / denominator
        solution = m_inv_r + correction.unsqueeze(-1) * a_inv_u
        ok = torch.isfinite(solution).all(-1) & (denominator.abs() > torch.finfo(x.dtype).eps)
        return solution, ok

    return step
