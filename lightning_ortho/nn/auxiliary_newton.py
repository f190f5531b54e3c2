"""Newton steps for inverting an unconstrained auxiliary reflection ``y = H(n(x)) x`` (section 2.2).

:func:`~lightning_ortho.nn.newton.homogeneous_newton` solves ``f(x) = y`` on the unit sphere (Lemma 2); it asks
for a step ``J(x)^{-1} r``. For ``n(x) = W x``, Theorem 3's Jacobian is a rank-one update of an easily inverted
matrix, ``J = H(u) A + u b^T`` with ``u = W x``, ``A = I - 2 s W``, ``b = -2 W^T x / ||u||^2``, so
Sherman-Morrison with ``A^{-1}`` from one eigendecomposition of ``W`` costs O(d^2) per row
(:func:`rank_one_step`). For a custom network, or a ``W`` whose eigenvectors are ill-conditioned, each row
solves with the dense ``J`` (:func:`dense_step`, O(d^3)).

A Theorem-2 layer's inverse is a scalar equation per vector instead,
:func:`~lightning_ortho.nn.symmetric_eigenbasis.symmetric_newton_inverse`. :class:`AuxiliaryNewtonInverse` gives
:class:`~lightning_ortho.nn.AuxiliaryReflection` its inverse methods, choosing between the two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from lightning_ortho.nn._checks import check_features, check_finite, check_module_finite, full_precision, prepare_input
from lightning_ortho.nn._undefined import reflection_scalars
from lightning_ortho.nn.auxiliary_dense import dense_jacobian
from lightning_ortho.nn.general_eigenbasis import GeneralEigenbasis
from lightning_ortho.nn.newton import DEFAULT_TOLERANCE, NewtonResult, NotInvertibleError, homogeneous_newton
from lightning_ortho.nn.reflection import reflect_unchecked
from lightning_ortho.nn.symmetric_eigenbasis import symmetric_newton_inverse

NAME = "AuxiliaryReflection"

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


class AuxiliaryNewtonInverse:
    """The inverse methods of :class:`~lightning_ortho.nn.AuxiliaryReflection` (a mixin: it uses the layer's
    ``d``, ``invertible``, ``network``, ``weight_and_eigenbasis``, ``auxiliary_weight``, ``_network`` and
    ``_degree_zero_inputs``)."""

    def newton_inverse(self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50) -> NewtonResult:
        """Solve ``H(n(x)) x = y`` for ``x`` by Newton's method, batched over rows (section 2.2, A.2.1).

        ``invertible=True``: ``f(x) = (I - 2 s W) x`` is diagonal in ``W``'s eigenbasis and the problem is one
        scalar equation in ``s`` per row, solved by bracketed Newton with O(d) work per step
        (:func:`~lightning_ortho.nn.symmetric_eigenbasis.symmetric_newton_inverse`); ``iterations`` counts those
        scalar steps. Otherwise each row is solved on the unit sphere and rescaled (Lemma 2), from
        ``x_0 = y / ||y||``, with damped Newton steps (:mod:`~lightning_ortho.nn.auxiliary_newton`: O(d^2) per row
        for ``n(x) = W x``, a dense solve for a custom network).

        Args:
            y: ``(..., d)``.
            tol: relative residual ``||f(x) - y|| / ||y||`` to reach (default 1e-5 in float32, 1e-11 in float64).
            max_iter: Newton iterations at most.

        Returns:
            :class:`~lightning_ortho.nn.newton.NewtonResult` with ``x``, ``iterations``, ``residual``, the
            per-row ``converged`` flag (``x`` is *a* preimage) and ``provably_unique`` (True only for
            ``invertible=True``: otherwise another input may map to the same ``y``). It does not raise on
            non-convergence: check ``converged``, or use :meth:`inverse`, which raises.
        """
        check_features(y, self.d, name="y", layer=NAME)
        if max_iter < 0:
            raise ValueError(f"{NAME}.newton_inverse: max_iter must be >= 0, got {max_iter}.")
        check_module_finite(self, layer=NAME)
        if self.invertible:
            result = self.newton_inverse_columns(y.reshape(-1, self.d).mT, tol=tol, max_iter=max_iter)
            return result.with_solution(result.x.mT.reshape(y.shape), y.shape[:-1])
        with full_precision(y), torch.no_grad():
            yc = prepare_input(y, self.d, self, name="y", layer=NAME)
            check_finite(yc, name="y", layer=f"{NAME}.inverse")
            tol = DEFAULT_TOLERANCE.get(yc.dtype, 1e-5) if tol is None else float(tol)
            if self.network is None:
                weight = self.auxiliary_weight(yc.dtype)
                auxiliary = lambda x: x @ weight.mT  # noqa: E731  (W built once for every Newton evaluation)
            else:
                auxiliary = self._network
            result = homogeneous_newton(
                lambda x: reflect_unchecked(x, auxiliary(x)),
                self._newton_step(yc.dtype),
                yc,
                tol=tol,
                max_iter=max_iter,
            )
        return dataclasses.replace(result, x=result.x.to(y.dtype), provably_unique=False)

    def newton_inverse_columns(
        self,
        y: torch.Tensor,
        *,
        rotation: torch.Tensor | None = None,
        tol: float | None = None,
        max_iter: int = 50,
    ) -> NewtonResult:
        """:meth:`newton_inverse` for columns: solve ``f(R x) = y`` with ``y: (..., d, L)`` (``R`` orthogonal).

        The inverse of :meth:`forward_and_log_abs_det_columns`; ``x``, ``iterations``, ``residual`` and
        ``converged`` have shapes ``(..., d, L)`` and ``(..., L)``.
        """
        if max_iter < 0:
            raise ValueError(f"{NAME}.newton_inverse: max_iter must be >= 0, got {max_iter}.")
        yc = prepare_input(y, self.d, self, name="y", layer=NAME, columns=True)
        check_module_finite(self, layer=NAME)
        if not self.invertible:
            result = self.newton_inverse(y.mT, tol=tol, max_iter=max_iter)
            return result.with_solution(result.x.mT if rotation is None else rotation.to(y.dtype).mT @ result.x.mT)
        with full_precision(y), torch.no_grad():
            check_finite(yc, name="y", layer=f"{NAME}.inverse")
            tol = DEFAULT_TOLERANCE.get(yc.dtype, 1e-5) if tol is None else float(tol)
            _, basis = self.weight_and_eigenbasis(yc.dtype)
            rotation = None if rotation is None else rotation.to(yc.dtype)
            result = symmetric_newton_inverse(yc, basis, rotation, tol=tol, max_iter=max_iter)
        return result.with_solution(result.x.to(y.dtype))

    def _newton_step(self, dtype: torch.dtype) -> NewtonStep:
        """Sherman-Morrison on Theorem 3's rank-one structure when ``n(x) = W x`` has a reliable eigenbasis."""
        if self.network is None:
            weight, basis = self.weight_and_eigenbasis(dtype)
            if basis.reliable:
                return rank_one_step(weight, basis)
        return dense_step(lambda x: dense_jacobian(*self._degree_zero_inputs(x)))

    def inverse(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50, allow_non_unique: bool = False
    ) -> torch.Tensor:
        """``(..., d) -> (..., d)``: ``f^{-1}(y)`` by Newton's method (see :meth:`newton_inverse`).

        Only a Theorem-2 layer (``invertible=True``) is provably one-to-one. An unconstrained ``W`` (or a custom
        network) can map two inputs to the same output, and Newton's method then converges to *a* preimage that
        need not be the input (at d = 4, for about a third of random rows of a random ``W``). So this method
        refuses such a layer unless ``allow_non_unique=True`` says that any ``x`` with ``f(x) = y`` will do.

        Raises:
            NotInvertibleError: the layer is not provably invertible and ``allow_non_unique`` is false.
            NewtonInverseError: some row did not converge; the exception's ``result`` holds the details.
        """
        if not self.invertible and not allow_non_unique:
            raise NotInvertibleError(
                f"{NAME}.inverse: this layer is not provably invertible (Theorem 2 needs invertible=True), so "
                "Newton's method may return a different x with f(x) = y instead of the input. Build it with "
                "invertible=True for a unique inverse, or pass allow_non_unique=True (or call newton_inverse, "
                "whose result says provably_unique=False) to accept any preimage."
            )
        return self.newton_inverse(y, tol=tol, max_iter=max_iter).raise_if_failed(NAME)
