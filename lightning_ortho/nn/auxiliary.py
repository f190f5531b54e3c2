"""Auxiliary reflections ``f(x) = H(n(x)) x`` ("One Reflection Suffice", Mathiasen & Hvilshoej)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import nn

from lightning_ortho.nn._checks import (
    check_features,
    check_finite,
    check_orthogonal,
    check_parameters_finite,
    compute_dtype,
)
from lightning_ortho.nn.general_eigenbasis import GeneralEigenbasis, general_reflect_and_log_abs_det
from lightning_ortho.nn.newton import DEFAULT_TOLERANCE, NewtonResult, homogeneous_newton
from lightning_ortho.nn.reflection import reflect_linear_with_summary, reflect_unchecked, reflect_with_summary
from lightning_ortho.nn.resolvent import EigenResolvent
from lightning_ortho.nn.symmetric_eigenbasis import (
    SymmetricEigenbasis,
    symmetric_newton_inverse,
    symmetric_reflect_and_log_abs_det,
)

LogDetMethod = Literal["auto", "eig", "dense"]
SpectralMethod = Literal["auto", "eigh", "power"]

#: Largest ``d`` for which ``sigma_max(V V^T)`` is computed exactly (``eigvalsh``) under ``spectral_method="auto"``.
EXACT_SPECTRAL_MAX_DIM = 512


@contextlib.contextmanager
def _full_precision(x: torch.Tensor) -> Iterator[None]:
    """Reflection math runs in float32/float64 even inside an autocast region."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(device_type=x.device.type, enabled=False):
            yield
    else:
        yield


class AuxiliaryReflection(nn.Module):
    """One auxiliary reflection ``f(x) = H(n(x)) x`` with ``H(v) = I - 2 v v^T / ||v||^2``.

    By default the auxiliary network is one linear map, ``n(x) = W x``. Theorem 1: for every orthogonal
    ``U`` (any product of reflections) ``W = I - U`` gives ``f(x) = U x`` for all ``x != 0``
    (:meth:`from_orthogonal`). ``f`` preserves norms, ``||f(x)|| = ||x||``, and is homogeneous,
    ``f(c x) = c f(x)``, but it is not linear.

    Args:
        d: feature dimension; inputs are ``(..., d)``, batch-first like ``torch.nn.Linear``.
        network: optional module ``(..., d) -> (..., d)`` used as ``n(x)`` instead of ``W x`` (the paper's
            "auxiliary neural network"). Its Jacobian is taken with ``torch.func`` where needed, so it must be
            a pure function of its input (no batch statistics).
        invertible: parametrise ``W = I + V V^T / (2 (1 + spectral_margin) sigma_max(V V^T))``
            (Theorem 2, Appendix A.2.1). ``W`` is symmetric with eigenvalues in ``[1, 3/2)``, so
            ``3/2 lambda_min(W) > lambda_max(W)`` and ``f`` is invertible on all of ``R^d``. The margin keeps
            the inequality strict when ``V`` is rank deficient (the paper's ``1/2`` makes it an equality there).
        spectral_method: how ``sigma_max(V V^T)`` is found: ``"eigh"`` (exact), ``"power"`` (power iteration
            with a persistent vector, one step per training forward, as in spectral normalisation) or
            ``"auto"`` (exact for ``d <= 512``). Power iteration can underestimate ``sigma_max``;
            :meth:`invertibility_margin` always reports the exact margin.
        spectral_margin: relative safety factor on ``sigma_max`` for ``invertible=True``.

    Conventions:
        ``f(0) = 0`` (the paper's definition), and wherever ``n(x) = 0`` the reflection is undefined and we
        take ``H(0) = I``, so ``f(x) = x`` there; there :meth:`jacobian` is ``I`` and
        :meth:`log_abs_det_jacobian` is ``0``. No NaN is ever returned and gradients stay finite.

    Mixed precision: float16/bfloat16 inputs are promoted to float32 and autocast is disabled inside, so the
    reflection math (and ``n(x)``) run in full precision; the output has the input's dtype.

    Raises (from every method taking a tensor):
        TypeError: integer input, or an input dtype that does not match the parameters.
        ValueError: trailing dimension is not ``d``, or NaN/inf in the input (see ``finite_checks``).
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
            raise ValueError(f"AuxiliaryReflection: d must be a positive integer, got {d!r}.")
        if network is not None and invertible:
            raise ValueError(
                "AuxiliaryReflection: invertible=True constrains the linear auxiliary map W (Theorem 2); "
                "it cannot be combined with a custom network. Pass one or the other."
            )
        if spectral_method not in ("auto", "eigh", "power"):
            raise ValueError(
                f"AuxiliaryReflection: spectral_method must be 'auto', 'eigh' or 'power', got {spectral_method!r}."
            )
        if not spectral_margin >= 0:
            raise ValueError(f"AuxiliaryReflection: spectral_margin must be >= 0, got {spectral_margin!r}.")
        self.d = d
        self.invertible = invertible
        self.network = network
        self.spectral_margin = float(spectral_margin)
        self.spectral_method = (
            ("eigh" if d <= EXACT_SPECTRAL_MAX_DIM else "power") if spectral_method == "auto" else spectral_method
        )
        bound = 1.0 / math.sqrt(d)  # Appendix B.1/B.3: W_ij (or V_ij) ~ U(-1/sqrt(d), 1/sqrt(d)).
        if network is None and not invertible:
            self.weight = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))
        elif invertible:
            self.factor = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))
            self.register_buffer("power_vector", nn.functional.normalize(torch.randn(d), dim=0))

    # ------------------------------------------------------------------ construction

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
                f"AuxiliaryReflection.from_orthogonal: U must be a square (d, d) matrix, got {tuple(orthogonal.shape)}."
            )
        layer = cls(orthogonal.shape[0]).to(device=orthogonal.device, dtype=orthogonal.dtype)
        layer.reset_orthogonal_(orthogonal)
        return layer

    @torch.no_grad()
    def reset_orthogonal_(self, orthogonal: torch.Tensor) -> AuxiliaryReflection:
        """Set ``W = I - U`` in place so the layer computes ``U x`` (Theorem 1). Returns ``self``."""
        if self.network is not None or self.invertible:
            raise ValueError("AuxiliaryReflection.reset_orthogonal_ needs the plain linear auxiliary map (W = I - U).")
        check_orthogonal(orthogonal, self.d, "AuxiliaryReflection.reset_orthogonal_")
        self.weight.copy_(torch.eye(self.d, dtype=orthogonal.dtype, device=orthogonal.device) - orthogonal)
        return self

    # ------------------------------------------------------------------ the auxiliary map n(x)

    def _parameter_dtype(self) -> torch.dtype | None:
        parameter = next(self.parameters(), None)
        return None if parameter is None else parameter.dtype

    def auxiliary_weight(self) -> torch.Tensor:
        """``(d, d)``: the matrix ``W`` of ``n(x) = W x`` (constructed from ``V`` when ``invertible=True``).

        Raises:
            ValueError: the layer uses a custom network, which has no single ``W``.
        """
        if self.network is not None:
            raise ValueError(
                "AuxiliaryReflection.auxiliary_weight: this layer uses a custom auxiliary network, not W x."
            )
        if not self.invertible:
            return self.weight
        gram = self.factor @ self.factor.mT
        sigma = self._sigma_max(gram)
        eye = torch.eye(self.d, dtype=gram.dtype, device=gram.device)
        return eye + gram / (2.0 * (1.0 + self.spectral_margin) * sigma)

    def _sigma_max(self, gram: torch.Tensor) -> torch.Tensor:
        """Largest eigenvalue of the positive semi-definite ``V V^T`` (= its largest singular value)."""
        if self.spectral_method == "eigh":
            sigma = torch.linalg.eigvalsh(gram)[-1]
        else:
            with torch.no_grad():
                vector = self.power_vector.to(gram.dtype)
                for _ in range(1 if self.training else 0):
                    vector = nn.functional.normalize(gram @ vector, dim=0)
                if self.training:
                    self.power_vector.copy_(vector)
            sigma = vector @ gram @ vector  # gradient through the Rayleigh quotient, vector held fixed
        # V = 0 gives W = I (a plain reflection through x itself: f(x) = -x), never a division by zero.
        return torch.clamp(sigma, min=torch.finfo(gram.dtype).tiny)

    def weight_and_eigenbasis(self) -> tuple[torch.Tensor, SymmetricEigenbasis | GeneralEigenbasis]:
        """``W`` and its eigendecomposition: the one O(d^3) step behind the O(d^2)-per-vector log-determinant.

        With ``invertible=True`` one ``eigh`` of ``V V^T`` gives both ``sigma_max`` and the eigenbasis of
        ``W = I + V V^T / (2 (1 + margin) sigma_max)`` (same eigenvectors, eigenvalues ``1 + mu / (2 (1 + margin)
        sigma_max)``); ``sigma_max`` keeps its gradient through the Rayleigh quotient of the top eigenvector,
        which is the gradient of the top eigenvalue. Otherwise one ``eig`` of ``W``.

        Raises:
            ValueError: the layer uses a custom network.
        """
        if not self.invertible:
            weight = self.auxiliary_weight()
            return weight, GeneralEigenbasis.of(weight)
        gram = self.factor @ self.factor.mT
        mu, vectors = torch.linalg.eigh(gram.detach())
        if self.spectral_method == "eigh":
            top = vectors[:, -1]
            sigma = torch.clamp(top @ gram @ top, min=torch.finfo(gram.dtype).tiny)
        else:
            sigma = self._sigma_max(gram)
        scale = 2.0 * (1.0 + self.spectral_margin) * sigma
        eye = torch.eye(self.d, dtype=gram.dtype, device=gram.device)
        return eye + gram / scale, SymmetricEigenbasis(1.0 + mu / scale.detach(), vectors)

    def _auxiliary_function(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``n`` with ``W`` built once, for code that evaluates it many times (Newton)."""
        if self.network is not None:
            return self.network
        weight = self.auxiliary_weight()
        return lambda x: x @ weight.mT

    def auxiliary(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d)``: the reflection vectors ``n(x)``."""
        return self._auxiliary_function()(x)

    # ------------------------------------------------------------------ forward

    def _prepare(self, x: torch.Tensor, name: str) -> torch.Tensor:
        check_features(x, self.d, name=name, layer=type(self).__name__)
        return x.to(compute_dtype(x, self._parameter_dtype(), layer=type(self).__name__))

    def _prepare_columns(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Check a ``(..., d, L)`` columns input and convert it to the compute dtype."""
        layer = type(self).__name__
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-2] != self.d:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{layer}: columns input {name} must have shape (..., {self.d}, L), got {shape}.")
        return self._prepare(x.mT, name).mT  # dtype checks and conversion of the transposed (rows) view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d)``: ``H(n(x)) x``."""
        with _full_precision(x):
            xc = self._prepare(x, "x")
            if self.network is None:
                y, summary = reflect_linear_with_summary(xc, self.auxiliary_weight())
            else:
                y, summary = reflect_with_summary(xc, self.network(xc))
            check_parameters_finite(
                summary.detach(), lambda: {"x": x, **dict(self.named_parameters())}, layer="AuxiliaryReflection"
            )
        return y.to(x.dtype)

    # ------------------------------------------------------------------ Jacobian and determinant

    def _auxiliary_jacobian(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(n(x), dn/dx)`` with shapes ``(..., d)`` and ``(..., d, d)`` (``W`` broadcast when linear)."""
        if self.network is None:
            weight = self.auxiliary_weight()
            return x @ weight.mT, weight.expand(*x.shape[:-1], self.d, self.d)
        flat = x.reshape(-1, self.d)
        jac = torch.func.vmap(torch.func.jacrev(self.network))(flat)
        return self.network(x), jac.reshape(*x.shape, self.d)

    def jacobian(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d, d)``: the Jacobian of ``f`` at each row (Theorem 3).

        ``J = H(u) A - 2 u (x^T W) / ||u||^2`` with ``u = W x``, ``A = I - 2 (x^T W^T x / ||u||^2) W``. For a
        custom network ``W`` is replaced by its Jacobian ``N = dn/dx`` (the same derivation with the chain
        rule gives ``J = H(n) (I - 2 s N) - 2 n (N^T x)^T / ||n||^2``, ``s = n.x / ||n||^2``). ``I`` where
        ``n(x) = 0``.
        """
        with _full_precision(x):
            xc = self._prepare(x, "x")
            check_finite(xc, name="x", layer="AuxiliaryReflection.jacobian")
            return self._jacobian_unchecked(xc).to(x.dtype)

    def _jacobian_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        n, jac_n = self._auxiliary_jacobian(x)
        q, s, defined = _reflection_scalars(x, n)
        eye = torch.eye(self.d, dtype=x.dtype, device=x.device)
        a = eye - 2.0 * s[..., None, None] * jac_n
        w = (x.unsqueeze(-2) @ jac_n).squeeze(-2)  # (N^T x)^T = x^T N
        nq = n / q.unsqueeze(-1)
        householder = eye - 2.0 * nq.unsqueeze(-1) * n.unsqueeze(-2)
        jac = householder @ a - 2.0 * nq.unsqueeze(-1) * w.unsqueeze(-2)
        return torch.where(defined[..., None, None], jac, eye)

    def log_abs_det_jacobian(self, x: torch.Tensor, *, method: LogDetMethod = "auto") -> torch.Tensor:
        """``(..., d) -> (...)``: ``log|det J(x)|`` per row (Lemma 1).

        ``det J = -det(A) (1 + 2 v^T A^{-1} u / ||u||^2)`` with ``u = W x``, ``v = W^T x``, ``A = I - 2 s W``.

        Args:
            method: ``"eig"`` diagonalises ``W`` once (``eigh`` when ``invertible=True``) so each row costs
                O(d^2): ``det A = prod_i (1 - 2 s lambda_i)``, gradients in closed form (see
                :mod:`~lightning_ortho.nn.symmetric_eigenbasis`, :mod:`~lightning_ortho.nn.general_eigenbasis`).
                ``"dense"`` builds ``A`` per row and uses ``slogdet``/``solve`` (O(d^3) per row; the only option
                for a custom network). ``"auto"`` takes ``"eig"`` unless ``W``'s eigenvectors are ill-conditioned.

        Returns:
            ``(...)`` log-determinants; ``0`` where ``n(x) = 0`` (there ``f`` is the identity by convention).
        """
        if method not in ("auto", "eig", "dense"):
            raise ValueError(
                f"AuxiliaryReflection.log_abs_det_jacobian: method must be 'auto', 'eig' or 'dense', got {method!r}."
            )
        with _full_precision(x):
            xc = self._prepare(x, "x")
            check_finite(xc, name="x", layer="AuxiliaryReflection.log_abs_det_jacobian")
            if self.network is None and method != "dense":
                weight, basis = self.weight_and_eigenbasis()
                columns = xc.reshape(-1, self.d).mT
                if isinstance(basis, GeneralEigenbasis) and method == "eig":  # even if ill-conditioned
                    log_det = general_reflect_and_log_abs_det(columns, weight, basis)[1]
                    return log_det.reshape(x.shape[:-1]).to(x.dtype)
                if isinstance(basis, SymmetricEigenbasis) or basis.reliable:
                    return self._eigen_columns(columns, weight, basis)[1].reshape(x.shape[:-1]).to(x.dtype)
            return self._log_abs_det_dense(xc).to(x.dtype)

    def forward_and_log_abs_det(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f(x), log|det J(x)|)`` with ``W`` and its eigenbasis built once for both (what a flow layer needs
        on every step; cheaper than calling :meth:`forward` and :meth:`log_abs_det_jacobian`).

        Shapes: ``(..., d) -> ((..., d), (...))``. Raises as :meth:`forward`. Rows are processed as the columns
        of a transposed view (no copy); see :meth:`forward_and_log_abs_det_columns`.
        """
        if self.network is not None:
            return self(x), self.log_abs_det_jacobian(x)
        check_features(x, self.d, name="x", layer=type(self).__name__)
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
        layer = type(self).__name__
        if self.network is not None:
            raise ValueError(f"{layer}.forward_and_log_abs_det_columns needs n(x) = W x; use forward_and_log_abs_det.")
        xc = self._prepare_columns(x, "x")
        with _full_precision(x):
            rotation = None if rotation is None else rotation.to(xc.dtype)
            weight, basis = self.weight_and_eigenbasis()
            y, log_det = self._eigen_columns(xc, weight, basis, rotation)
            check_parameters_finite(
                log_det.detach().sum(), lambda: {"x": x, **dict(self.named_parameters())}, layer=layer
            )
        return y.to(x.dtype), log_det.to(x.dtype)

    def _eigen_columns(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        basis: SymmetricEigenbasis | GeneralEigenbasis,
        rotation: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f(R x), log|det J|)`` for columns ``x``; dense per-vector fallback for an unreliable eigenbasis."""
        if isinstance(basis, SymmetricEigenbasis):
            return symmetric_reflect_and_log_abs_det(x, weight, basis, rotation)
        x = x if rotation is None else rotation @ x
        if basis.reliable:
            return general_reflect_and_log_abs_det(x, weight, basis)
        rows = x.mT
        y, _ = reflect_linear_with_summary(rows, weight)
        return y.mT, self._log_abs_det_dense(rows)

    def _log_abs_det_dense(self, x: torch.Tensor) -> torch.Tensor:
        n, jac_n = self._auxiliary_jacobian(x)
        q, s, defined = _reflection_scalars(x, n)
        eye = torch.eye(self.d, dtype=x.dtype, device=x.device)
        a = eye - 2.0 * s[..., None, None] * jac_n
        w = (x.unsqueeze(-2) @ jac_n).squeeze(-2)
        _, log_det_a = torch.linalg.slogdet(a)
        quadratic = torch.linalg.vecdot(w, torch.linalg.solve(a, n.unsqueeze(-1)).squeeze(-1))
        value = log_det_a + torch.log(torch.abs(1.0 + 2.0 * quadratic / q))
        return torch.where(defined, value, torch.zeros_like(value))

    # ------------------------------------------------------------------ inverse

    def newton_inverse(self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50) -> NewtonResult:
        """Solve ``H(n(x)) x = y`` for ``x`` by Newton's method, batched over rows (section 2.2, A.2.1).

        ``invertible=True`` (symmetric positive definite ``W``): ``f(x) = (I - 2 s W) x`` is diagonal in ``W``'s
        eigenbasis, so the problem reduces to one scalar equation in ``s`` per row, solved by bracketed Newton
        with O(d) work per step (:func:`~lightning_ortho.nn.symmetric_eigenbasis.symmetric_newton_inverse`);
        ``iterations`` counts those scalar steps. Otherwise each row is solved on the unit sphere and rescaled
        (Lemma 2), starting from ``x_0 = y / ||y||``, with Jacobians from Theorem 3. For ``n(x) = W x`` each
        step costs O(d^2) per row: ``J`` is the rank-one update ``H(u) A - 2 u v^T / ||u||^2`` and is inverted
        by Sherman-Morrison with ``A^{-1}`` from one eigendecomposition of ``W``. Steps are halved until the
        residual decreases.

        Args:
            y: ``(..., d)``.
            tol: relative residual ``||f(x) - y|| / ||y||`` to reach (default 1e-5 in float32, 1e-11 in float64).
            max_iter: Newton iterations at most.

        Returns:
            :class:`~lightning_ortho.nn.newton.NewtonResult` with ``x``, ``iterations``, ``residual`` and the
            per-row ``converged`` flag. It does not raise on non-convergence: check ``converged``, or use
            :meth:`inverse`, which raises.
        """
        check_features(y, self.d, name="y", layer=type(self).__name__)
        if self.invertible:
            result = self.newton_inverse_columns(y.reshape(-1, self.d).mT, tol=tol, max_iter=max_iter)
            shape = y.shape[:-1]
            return NewtonResult(
                result.x.mT.reshape(y.shape),
                result.iterations.reshape(shape),
                result.residual.reshape(shape),
                result.converged.reshape(shape),
                result.tolerance,
            )
        if max_iter < 0:
            raise ValueError(f"AuxiliaryReflection.newton_inverse: max_iter must be >= 0, got {max_iter}.")
        with _full_precision(y), torch.no_grad():
            yc = self._prepare(y, "y")
            check_finite(yc, name="y", layer="AuxiliaryReflection.inverse")
            tol = DEFAULT_TOLERANCE.get(yc.dtype, 1e-5) if tol is None else float(tol)
            auxiliary = self._auxiliary_function()

            def function(x: torch.Tensor) -> torch.Tensor:
                return reflect_unchecked(x, auxiliary(x))

            step = self._newton_step()
            result = homogeneous_newton(function, step, yc, tol=tol, max_iter=max_iter)
        if result.x.dtype != y.dtype:
            result = NewtonResult(
                result.x.to(y.dtype), result.iterations, result.residual, result.converged, result.tolerance
            )
        return result

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
        layer = type(self).__name__
        if max_iter < 0:
            raise ValueError(f"{layer}.newton_inverse: max_iter must be >= 0, got {max_iter}.")
        yc = self._prepare_columns(y, "y")
        if not self.invertible:
            result = self.newton_inverse(y.mT, tol=tol, max_iter=max_iter)
            x = result.x.mT if rotation is None else rotation.to(y.dtype).mT @ result.x.mT
            return NewtonResult(x, result.iterations, result.residual, result.converged, result.tolerance)
        with _full_precision(y), torch.no_grad():
            check_finite(yc, name="y", layer=f"{layer}.inverse")
            tol = DEFAULT_TOLERANCE.get(yc.dtype, 1e-5) if tol is None else float(tol)
            _, basis = self.weight_and_eigenbasis()
            rotation = None if rotation is None else rotation.to(yc.dtype)
            result = symmetric_newton_inverse(yc, basis, rotation, tol=tol, max_iter=max_iter)
        if result.x.dtype != y.dtype:
            result = NewtonResult(
                result.x.to(y.dtype), result.iterations, result.residual, result.converged, result.tolerance
            )
        return result

    def _newton_step(self) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        def dense_step(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            solution, info = torch.linalg.solve_ex(self._jacobian_unchecked(x), r)
            return solution, (info == 0) & torch.isfinite(solution).all(-1)

        if self.network is not None:
            return dense_step
        weight = self.auxiliary_weight()
        resolvent = EigenResolvent(weight, symmetric=self.invertible)
        if not resolvent.reliable:
            return dense_step

        def rank_one_step(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # J = M + u b^T with M = H(u) A, b = -2 v / q; M^{-1} = A^{-1} H(u) and M^{-1} u = -A^{-1} u.
            u, v = x @ weight.mT, x @ weight
            q, s, _ = _reflection_scalars(x, u)
            m_inv_r = resolvent.solve(s, reflect_unchecked(r, u))
            a_inv_u = resolvent.solve(s, u)
            denominator = 1.0 + 2.0 * torch.linalg.vecdot(v, a_inv_u) / q  # Lemma 1's scalar factor
            correction = (-2.0 * torch.linalg.vecdot(v, m_inv_r) / q) / denominator
            solution = m_inv_r + correction.unsqueeze(-1) * a_inv_u
            ok = torch.isfinite(solution).all(-1) & (denominator.abs() > torch.finfo(x.dtype).eps)
            return solution, ok

        return rank_one_step

    def inverse(self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50) -> torch.Tensor:
        """``(..., d) -> (..., d)``: ``f^{-1}(y)`` by Newton's method (see :meth:`newton_inverse`).

        Raises:
            NewtonInverseError: some row did not converge; the exception's ``result`` holds the details.
        """
        return self.newton_inverse(y, tol=tol, max_iter=max_iter).raise_if_failed("AuxiliaryReflection")

    # ------------------------------------------------------------------ Theorem 2

    @torch.no_grad()
    def invertibility_margin(self) -> float:
        """``3/2 lambda_min(W) - lambda_max(W)`` from an exact eigensolver (Theorem 2).

        Positive means ``f`` is provably invertible on ``R^d``. Always positive for ``invertible=True`` with
        the exact spectral method; worth logging with ``spectral_method="power"``.

        Raises:
            ValueError: ``W`` is not symmetric (Theorem 2 does not apply) or the layer has a custom network.
        """
        weight = self.auxiliary_weight().detach()
        if not torch.allclose(weight, weight.mT, rtol=1e-5, atol=1e-6):
            raise ValueError(
                "AuxiliaryReflection.invertibility_margin: Theorem 2 needs a symmetric W; this W is not. "
                "Use invertible=True for a provably invertible layer."
            )
        eigenvalues = torch.linalg.eigvalsh(0.5 * (weight + weight.mT))
        return float(1.5 * eigenvalues[0] - eigenvalues[-1])

    def extra_repr(self) -> str:
        kind = "network" if self.network is not None else ("W = I + VV^T/(2 sigma_max)" if self.invertible else "W x")
        return f"d={self.d}, auxiliary={kind}"


def _reflection_scalars(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, s, defined)``: ``q = ||n||^2`` (1 where undefined), ``s = n.x / q`` (0 where undefined)."""
    q = torch.linalg.vecdot(n, n)
    defined = q > torch.finfo(q.dtype).tiny
    q = torch.where(defined, q, torch.ones_like(q))
    s = torch.where(defined, torch.linalg.vecdot(n, x) / q, torch.zeros_like(q))
    return q, s, defined
