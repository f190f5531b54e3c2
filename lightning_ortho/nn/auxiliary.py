"""Auxiliary reflections ``f(x) = H(n(x)) x`` ("One Reflection Suffice", Mathiasen & Hvilshoej)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

import torch
from torch import nn

from lightning_ortho.nn._checks import (
    LOW_PRECISION,
    check_features,
    check_finite,
    check_module_finite,
    check_orthogonal,
    check_parameters_finite,
    full_precision,
    prepare_input,
)
from lightning_ortho.nn.auxiliary_dense import (
    dense_jacobian,
    dense_log_abs_det_jacobian,
    linear_and_jacobian,
    network_and_jacobian,
)
from lightning_ortho.nn.auxiliary_newton import NewtonStep, dense_step, rank_one_step
from lightning_ortho.nn.base import OrthogonalMap
from lightning_ortho.nn.general_eigenbasis import GeneralEigenbasis
from lightning_ortho.nn.invertible_weight import (
    InvertibleAuxiliaryWeight,
    SpectralMethod,
    check_spectral_options,
    rename_legacy_theorem2_keys,
    theorem2_margin,
)
from lightning_ortho.nn.newton import DEFAULT_TOLERANCE, NewtonResult, NotInvertibleError, homogeneous_newton
from lightning_ortho.nn.reflection import reflect_linear_with_summary, reflect_unchecked, reflect_with_summary
from lightning_ortho.nn.symmetric_eigenbasis import SymmetricEigenbasis, symmetric_newton_inverse

LogDetMethod = Literal["auto", "eig", "dense"]
NAME = "AuxiliaryReflection"


class AuxiliaryReflection(OrthogonalMap):
    """One auxiliary reflection ``f(x) = H(n(x)) x`` with ``H(v) = I - 2 v v^T / ||v||^2``.

    By default the auxiliary network is one linear map, ``n(x) = W x`` (:meth:`auxiliary_weight`). Theorem 1: for every
    orthogonal ``U`` (any product of reflections) ``W = I - U`` gives ``f(x) = U x`` for all ``x != 0``
    (:meth:`from_orthogonal`). ``f`` preserves norms, ``||f(x)|| = ||x||``, and is homogeneous,
    ``f(c x) = c f(x)``, but it is not linear.

    Args:
        d: feature dimension; inputs are ``(..., d)``, batch-first like ``torch.nn.Linear``.
        network: optional module ``(..., d) -> (..., d)`` used as ``n(x)`` instead of ``W x`` (the paper's
            "auxiliary neural network"). Its Jacobian is taken with ``torch.func`` where needed, so it must be
            a pure function of its input (no batch statistics).
        invertible: constrain ``W`` as in Theorem 2 so that ``f`` is invertible on all of ``R^d``:
            ``W = I + V V^T / (2 (1 + spectral_margin) sigma_max(V V^T))`` from a free ``V`` (``self.factor``),
            computed by the submodule ``self.constraint``
            (:class:`~lightning_ortho.nn.invertible_weight.InvertibleAuxiliaryWeight`). Otherwise ``W`` is the
            parameter ``self.weight``.
        spectral_method, spectral_margin: how ``sigma_max`` is found and the safety factor, for ``invertible=True``.

    Conventions:
        ``f(0) = 0`` (the paper's definition), and wherever ``n(x) = 0`` the reflection is undefined and we
        take ``H(0) = I`` (:mod:`~lightning_ortho.nn._undefined`), so ``f(x) = x`` there; there :meth:`jacobian`
        is ``I`` and :meth:`log_abs_det_jacobian` is ``0``. Gradients stay finite. A NaN parameter raises.

    Mixed precision: float16/bfloat16 inputs are promoted to float32 and autocast is disabled inside, so the
    reflection math (and ``n(x)``) run in full precision; the output has the input's dtype.

    Raises (from every method taking a tensor):
        TypeError: integer input, or an input dtype that does not match the parameters.
        ValueError: trailing dimension is not ``d``, or NaN/inf in the input or the parameters
            (see ``finite_checks``).
    """

    def __init__(
        self,
        d: int,
        *,
        network: nn.Module | None = None,
        invertible: bool = False,
        spectral_method: SpectralMethod = "auto",
        spectral_margin: float = 1e-3,
    ) -> None:
        super().__init__()
        if not isinstance(d, int) or d < 1:
            raise ValueError(f"{NAME}: d must be a positive integer, got {d!r}.")
        if network is not None and invertible:
            raise ValueError(
                f"{NAME}: invertible=True constrains the linear auxiliary map W (Theorem 2); "
                "it cannot be combined with a custom network. Pass one or the other."
            )
        check_spectral_options(spectral_method, spectral_margin, NAME)
        self.d, self.invertible, self.network = d, invertible, network
        if invertible:
            self.constraint = InvertibleAuxiliaryWeight(d, spectral_method, spectral_margin)
        elif network is None:
            bound = 1.0 / math.sqrt(d)  # Appendix B.1: W_ij ~ U(-1/sqrt(d), 1/sqrt(d)).
            self.weight = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))
        self._register_load_state_dict_pre_hook(rename_legacy_theorem2_keys)

    @classmethod
    def from_orthogonal(cls, orthogonal: torch.Tensor) -> AuxiliaryReflection:
        """The layer with ``W = I - U``, so that ``f(x) = U x`` for every ``x != 0`` (Theorem 1, Lemma 5).

        Args:
            orthogonal: ``(d, d)`` orthogonal matrix ``U``; the layer takes its dtype and device.

        Raises:
            ValueError: ``U`` is not square or not orthogonal (``U^T U != I`` within ``1e-4``, relative to d).
        """
        orthogonal = torch.as_tensor(orthogonal)
        if orthogonal.dim() != 2 or orthogonal.shape[0] != orthogonal.shape[1]:
            raise ValueError(
                f"{NAME}.from_orthogonal: U must be a square (d, d) matrix, got {tuple(orthogonal.shape)}."
            )
        layer = cls(orthogonal.shape[0]).to(device=orthogonal.device, dtype=orthogonal.dtype)
        return layer.reset_orthogonal_(orthogonal)

    @property
    def represents_every_orthogonal(self) -> bool:
        """True for the unconstrained ``n(x) = W x``: ``W = I - U`` represents any orthogonal ``U`` (Theorem 1)."""
        return self.network is None and not self.invertible

    @torch.no_grad()
    def reset_orthogonal_(self, orthogonal: torch.Tensor) -> AuxiliaryReflection:
        """Set ``W = I - U`` in place so the layer computes ``U x`` (Theorem 1). Returns ``self``."""
        if not self.represents_every_orthogonal:
            raise ValueError(f"{NAME}.reset_orthogonal_ needs the plain linear auxiliary map (W = I - U).")
        check_orthogonal(orthogonal, self.d, f"{NAME}.reset_orthogonal_")
        self.weight.copy_(torch.eye(self.d, dtype=orthogonal.dtype, device=orthogonal.device) - orthogonal)
        return self

    @property
    def factor(self) -> nn.Parameter:
        """``(d, d)``: the free ``V`` of a Theorem-2 layer; raises ``AttributeError`` unless ``invertible=True``."""
        if not self.invertible:
            raise AttributeError(f"{NAME}.factor exists only for invertible=True (Theorem 2); use .weight.")
        return self.constraint.factor

    # ------------------------------------------------------------------ the auxiliary map n(x)

    def auxiliary_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``(d, d)``: the matrix ``W`` of ``n(x) = W x`` (built from ``V`` when ``invertible=True``), in ``dtype``
        (default: the parameters' dtype, float32 for float16/bfloat16 parameters, in which the math runs).

        Raises:
            ValueError: the layer uses a custom network, which has no single ``W``.
        """
        if self.network is not None:
            raise ValueError(f"{NAME}.auxiliary_weight: this layer uses a custom auxiliary network, not W x.")
        weight = self.constraint() if self.invertible else self.weight
        if dtype is None:
            dtype = torch.float32 if weight.dtype in LOW_PRECISION else weight.dtype
        return weight.to(dtype)

    def weight_and_eigenbasis(
        self, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, SymmetricEigenbasis | GeneralEigenbasis]:
        """``W`` and its eigendecomposition: the one O(d^3) step behind the O(d^2)-per-vector log-determinant.

        One ``eigh`` of ``V V^T`` for ``invertible=True`` (gives ``sigma_max`` too), otherwise one ``eig`` of ``W``.

        Raises:
            ValueError: the layer uses a custom network.
        """
        if self.invertible:
            weight, basis = self.constraint.weight_and_eigenbasis()
            if dtype is None or weight.dtype == dtype:
                return weight, basis
            return weight.to(dtype), SymmetricEigenbasis(basis.eigenvalues.to(dtype), basis.vectors.to(dtype))
        weight = self.auxiliary_weight(dtype)
        check_finite(weight, name="weight", layer=NAME)  # before eig, whose own error names nothing
        return weight, GeneralEigenbasis.of(weight)

    def auxiliary(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: the reflection vectors ``n(x)``."""
        return x @ self.auxiliary_weight(x.dtype).mT if self.network is None else self._network(x)

    def _auxiliary_and_jacobian(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(n(x), dn/dx)``: ``(..., d)`` and ``(..., d, d)``."""
        if self.network is None:
            return linear_and_jacobian(self.auxiliary_weight(x.dtype), x)
        return network_and_jacobian(self._network, x)

    def _network(self, x: torch.Tensor) -> torch.Tensor:
        """``n(x)`` of the custom network, run in its parameters' dtype and returned in ``x``'s."""
        parameter = next(self.network.parameters(), None)
        if parameter is None or parameter.dtype == x.dtype:
            n = self.network(x)
        else:
            n = self.network(x.to(parameter.dtype)).to(x.dtype)
        if n.shape != x.shape:  # a (..., 1) output would broadcast into a wrong but finite answer
            raise ValueError(
                f"{NAME}: the auxiliary network must map (..., {self.d}) to (..., {self.d}); it returned shape "
                f"{tuple(n.shape)} for an input of shape {tuple(x.shape)}."
            )
        return n

    def _check_result(self, summary: torch.Tensor, x: torch.Tensor, where: str = "") -> None:
        """Raise naming the NaN/inf input or parameter if the (small) ``summary`` of a result is not finite."""
        check_parameters_finite(summary.detach(), lambda: {"x": x, **dict(self.named_parameters())}, layer=NAME + where)

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d)``: ``H(n(x)) x``."""
        with full_precision(x):
            xc = prepare_input(x, self.d, self, name="x", layer=NAME)
            if self.network is None:
                y, summary = reflect_linear_with_summary(xc, self.auxiliary_weight(xc.dtype))
            else:
                y, summary = reflect_with_summary(xc, self._network(xc))
            self._check_result(summary, x)
        return y.to(x.dtype)

    # ------------------------------------------------------------------ Jacobian and determinant

    def jacobian(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d, d)``: the Jacobian of ``f`` at each row (Theorem 3; ``I`` where ``n(x) = 0``).

        ``J = H(u) A - 2 u (x^T W) / ||u||^2`` with ``u = W x``, ``A = I - 2 (x^T W^T x / ||u||^2) W``; for a
        custom network ``W`` is replaced by its Jacobian (:mod:`~lightning_ortho.nn.auxiliary_dense`).
        """
        with full_precision(x):
            xc = prepare_input(x, self.d, self, name="x", layer=NAME)
            check_finite(xc, name="x", layer=f"{NAME}.jacobian")
            jac = dense_jacobian(xc, *self._auxiliary_and_jacobian(xc))
            self._check_result(jac.sum((-2, -1)), x, ".jacobian")
        return jac.to(x.dtype)

    def log_abs_det_jacobian(self, x: torch.Tensor, *, method: LogDetMethod = "auto") -> torch.Tensor:
        """``(..., d) -> (...)``: ``log|det J(x)|`` per row (Lemma 1); ``0`` where ``n(x) = 0``.

        ``det J = -det(A) (1 + 2 v^T A^{-1} u / ||u||^2)`` with ``u = W x``, ``v = W^T x``, ``A = I - 2 s W``.

        Args:
            method: ``"eig"`` diagonalises ``W`` once so each row costs O(d^2), gradients in closed form
                (:mod:`~lightning_ortho.nn.symmetric_eigenbasis`, :mod:`~lightning_ortho.nn.general_eigenbasis`).
                ``"dense"`` builds ``A`` per row (O(d^3) per row; the only option for a custom network).
                ``"auto"`` takes ``"eig"`` unless ``W``'s eigenvectors are ill-conditioned.
        """
        if method not in get_args(LogDetMethod):
            raise ValueError(f"{NAME}.log_abs_det_jacobian: method must be 'auto', 'eig' or 'dense', got {method!r}.")
        with full_precision(x):
            xc = prepare_input(x, self.d, self, name="x", layer=NAME)
            check_finite(xc, name="x", layer=f"{NAME}.log_abs_det_jacobian")
            if self.network is None and method != "dense":
                columns = xc.reshape(-1, self.d).mT
                log_det = self._columns_and_log_det(columns, force_eigenbasis=method == "eig")[1]
                log_det = log_det.reshape(x.shape[:-1])
            else:
                log_det = dense_log_abs_det_jacobian(xc, *self._auxiliary_and_jacobian(xc))
            self._check_result(log_det.sum(), x, ".log_abs_det_jacobian")
        return log_det.to(x.dtype)

    def forward_and_log_abs_det(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f(x), log|det J(x)|)`` with ``W`` and its eigenbasis built once for both (what a flow layer needs
        on every step; cheaper than calling :meth:`forward` and :meth:`log_abs_det_jacobian`).

        Shapes: ``(..., d) -> ((..., d), (...))``. Raises as :meth:`forward`. Rows are processed as the columns
        of a transposed view (no copy).
        """
        if self.network is not None:
            return self(x), self.log_abs_det_jacobian(x)
        check_features(x, self.d, name="x", layer=NAME)
        y, log_det = self.forward_and_log_abs_det_columns(x.reshape(-1, self.d).mT)
        return y.mT.reshape(x.shape), log_det.reshape(x.shape[:-1])

    def forward_and_log_abs_det_columns(
        self, x: torch.Tensor, *, rotation: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f(R x), log|det J_f(R x)|)`` for vectors stored as columns: ``(..., d, L) -> ((..., d, L), (..., L))``.

        The layout of an image batch: ``(N, C, H, W).reshape(N, C, H * W)`` is a view, so a 1x1 convolution
        needs no transposes. Cost: one eigendecomposition of ``W``, then two (``invertible=True``) or three
        (unconstrained ``W``) GEMMs of ``d x d`` by ``d x L`` and O(d) elementwise work per vector.

        Args:
            x: ``(..., d, L)``.
            rotation: optional fixed ``(d, d)`` matrix ``R`` applied first, folded into the eigenbasis
                projection (free for ``invertible=True``). The log-determinant is that of ``f``; add
                ``log|det R|`` for the composition (0 for an orthogonal ``R``).

        Raises:
            ValueError: a custom network (use :meth:`forward_and_log_abs_det`), ``x`` not of shape ``(..., d, L)``,
                or NaN/inf in ``x`` or the parameters.
            TypeError: as :meth:`forward`.
        """
        if self.network is not None:
            raise ValueError(f"{NAME}.forward_and_log_abs_det_columns needs n(x) = W x; use forward_and_log_abs_det.")
        xc = prepare_input(x, self.d, self, name="x", layer=NAME, columns=True)
        with full_precision(x):
            y, log_det = self._columns_and_log_det(xc, None if rotation is None else rotation.to(xc.dtype))
            self._check_result(log_det.sum(), x)
        return y.to(x.dtype), log_det.to(x.dtype)

    def _columns_and_log_det(
        self, x: torch.Tensor, rotation: torch.Tensor | None = None, *, force_eigenbasis: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f(R x), log|det J|)`` for columns ``x`` in ``W``'s eigenbasis, or with dense per-vector determinants
        when ``W``'s eigenvectors are ill-conditioned (unless ``force_eigenbasis``)."""
        weight, basis = self.weight_and_eigenbasis(x.dtype)
        if basis.reliable or force_eigenbasis:
            return basis.reflect_and_log_abs_det(x, weight, rotation)
        rows = (x if rotation is None else rotation @ x).mT
        y, _ = reflect_linear_with_summary(rows, weight)
        return y.mT, dense_log_abs_det_jacobian(rows, *linear_and_jacobian(weight, rows))

    # ------------------------------------------------------------------ inverse

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
        return dense_step(lambda x: dense_jacobian(x, *self._auxiliary_and_jacobian(x)))

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

    # ------------------------------------------------------------------ Theorem 2

    def invertibility_margin(self) -> float:
        """``3/2 lambda_min(W) - lambda_max(W)`` from an exact eigensolver (Theorem 2).

        Positive means ``f`` is provably invertible on ``R^d``. Always positive for ``invertible=True`` with
        any spectral method (``"upper_bound"`` only narrows the spectrum).

        Raises:
            ValueError: ``W`` is not symmetric (Theorem 2 does not apply) or the layer has a custom network.
        """
        return theorem2_margin(self.auxiliary_weight())

    def extra_repr(self) -> str:
        kind = "network" if self.network is not None else ("W = I + VV^T/(2 sigma_max)" if self.invertible else "W x")
        return f"d={self.d}, auxiliary={kind}"
