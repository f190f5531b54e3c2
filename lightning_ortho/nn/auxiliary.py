"""Auxiliary reflections ``f(x) = H(n(x)) x`` ("One Reflection Suffice", Mathiasen & Hvilshoej)."""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

from lightning_ortho._native.guard import real_cpu
from lightning_ortho.nn._checks import (
    LOW_PRECISION,
    check_features,
    check_finite,
    check_orthogonal,
    check_parameters_finite,
    compute_dtype,
    full_precision,
    prepare_input,
)
from lightning_ortho.nn._fast_reflection import well_scaled_linear_reflection
from lightning_ortho.nn._undefined import row_scale
from lightning_ortho.nn.auxiliary_dense import (
    dense_jacobian,
    dense_log_abs_det_jacobian,
    linear_and_jacobian,
    network_and_jacobian,
)
from lightning_ortho.nn.auxiliary_newton import AuxiliaryNewtonInverse
from lightning_ortho.nn.base import OrthogonalMap
from lightning_ortho.nn.general_eigenbasis import GeneralEigenbasis
from lightning_ortho.nn.invertible_weight import (
    InvertibleAuxiliaryWeight,
    SpectralMethod,
    check_spectral_options,
    rename_legacy_theorem2_keys,
    theorem2_margin,
)
from lightning_ortho.nn.reflection import reflect_linear_with_summary, reflect_with_summary
from lightning_ortho.nn.symmetric_eigenbasis import SymmetricEigenbasis

LogDetMethod = Literal["auto", "eig", "dense"]
NAME = "AuxiliaryReflection"
_FULL_PRECISION = (torch.float32, torch.float64)


class AuxiliaryReflection(AuxiliaryNewtonInverse, OrthogonalMap):
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
        spectral_method: how ``sigma_max`` is found, for ``invertible=True`` (``"auto"``, ``"eigh"`` or
            ``"upper_bound"``; see :class:`~lightning_ortho.nn.InvertibleAuxiliaryWeight`).
        spectral_margin: the relative safety factor on ``sigma_max``, for ``invertible=True``.

    Conventions:
        ``f(0) = 0`` (the paper's definition), and wherever ``n(x) = 0`` the reflection is undefined and we
        take ``H(0) = I`` (:mod:`~lightning_ortho.nn._undefined`), so ``f(x) = x`` there; there :meth:`jacobian`
        is ``I`` and :meth:`log_abs_det_jacobian` is ``0``. Gradients stay finite. A NaN parameter raises.

    Mixed precision: float16/bfloat16 inputs are promoted to float32 and autocast is disabled inside, so the
    reflection math (and ``n(x)``) run in full precision; the output has the input's dtype.

    Speed: for ``n(x) = W x`` on the CPU a batch whose rows are all finite and well scaled runs as one fused
    Function with hand-written derivatives and a single host read (:mod:`~lightning_ortho.nn._fast_reflection`);
    any other batch (a zero, 1e-20 or 1e19 row, NaN/inf), and every batch where that read is not free (an
    accelerator, whose queue it would stall; ``torch.func`` transforms, ``torch.compile``, dispatch modes, meta
    tensors: :func:`~lightning_ortho._native.guard.real_cpu`) takes the careful path, which reflects every row at unit scale (exact power-of-two scales, so gradients are those of the
    unit row: finite and exact) and names a NaN. Both compute the same expression (equal to float rounding).
    ``layer.fused_forward = False`` turns the fused path off.

    Raises:
        TypeError: from every method taking a tensor: integer input, or an input dtype that does not match the
            parameters.
        ValueError: from every method taking a tensor: trailing dimension is not ``d``, or NaN/inf in the input or
            the parameters (see ``finite_checks``).
    """

    #: Take the fused path for well-scaled batches (see "Speed" above).
    fused_forward: bool = True

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

    #: Theorem 2 (``invertible=True``): ``det J`` vanishes for no input and no ``V``, so its sign never changes.
    jacobian_sign_is_fixed = property(lambda self: self.invertible is True)

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

    def _degree_zero_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x, n(x), dn/dx)`` for the Jacobian and log-determinant, which for ``n(x) = W x`` do not change when
        ``x`` is scaled: rows are brought to unit scale first, so a 1e-20 or 1e19 row is not lost to underflow or
        overflow. (A custom network is not homogeneous; its rows are used as they are.)"""
        if self.network is None:
            x = x / row_scale(x)
        return (x, *self._auxiliary_and_jacobian(x))

    def _dense_log_abs_det(self, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = rows / row_scale(rows)
        return dense_log_abs_det_jacobian(rows, *linear_and_jacobian(weight, rows))

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
        """``(..., d) -> (..., d)``: ``H(n(x)) x``. (The inverse methods come from
        :class:`~lightning_ortho.nn.auxiliary_newton.AuxiliaryNewtonInverse`.)

        Well-scaled batches take the fused path (see the class docstring)."""
        if self.network is None and self.fused_forward:
            y = self._well_scaled_forward(x)
            if y is not None:
                return y
        with full_precision(x):
            xc = prepare_input(x, self.d, self, name="x", layer=NAME)
            if self.network is None:
                y, summary = reflect_linear_with_summary(xc, self.auxiliary_weight(xc.dtype))
            else:
                y, summary = reflect_with_summary(xc, self._network(xc))
            self._check_result(summary, x)
        return y.to(x.dtype)

    def _well_scaled_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """``H(W x) x`` from :func:`~lightning_ortho.nn._fast_reflection.well_scaled_linear_reflection`, or ``None``
        where it does not apply (the caller then takes the careful path, which also raises for bad input)."""
        # Under finite_checks(False) too: the one host read here is what makes the path exact (it finds zero and
        # badly scaled rows), not a NaN check, and the careful path without checks is slower at small sizes. Only
        # where that read is free (real CPU memory, nothing tracing): elsewhere the careful path, exact for every
        # row, runs without it.
        if not isinstance(x, torch.Tensor) or not real_cpu(x):
            return None
        weight = self.constraint() if self.invertible else self.weight
        if not real_cpu(weight):  # torch.func over the parameters
            return None
        dtype, shape = x.dtype, x.shape
        if (
            dtype is weight.dtype
            and len(shape) == 2
            and shape[1] == self.d
            and shape[0] > 0
            and dtype in _FULL_PRECISION
            and not torch._C._is_any_autocast_enabled()
        ):  # the common call (a (B, d) batch, parameters in its dtype): nothing to convert
            return well_scaled_linear_reflection(x, weight)
        if not x.is_floating_point() or x.dim() == 0 or x.shape[-1] != self.d or x.numel() == 0:
            return None
        dtype = compute_dtype(x, weight.dtype, layer=NAME)
        with full_precision(x):
            y = well_scaled_linear_reflection(x.reshape(-1, self.d).to(dtype), weight.to(dtype))
        return None if y is None else y.view(x.shape).to(x.dtype)

    # ------------------------------------------------------------------ Jacobian and determinant

    def jacobian(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d, d)``: the Jacobian of ``f`` at each row (Theorem 3; ``I`` where ``n(x) = 0``).

        ``J = H(u) A - 2 u (x^T W) / ||u||^2`` with ``u = W x``, ``A = I - 2 (x^T W^T x / ||u||^2) W``; for a
        custom network ``W`` is replaced by its Jacobian (:mod:`~lightning_ortho.nn.auxiliary_dense`).
        """
        with full_precision(x):
            xc = prepare_input(x, self.d, self, name="x", layer=NAME)
            check_finite(xc, name="x", layer=f"{NAME}.jacobian")
            jac = dense_jacobian(*self._degree_zero_inputs(xc))
            self._check_result(jac.sum((-2, -1)), x, ".jacobian")
        return jac.to(x.dtype)

    def log_abs_det_jacobian(self, x: torch.Tensor, *, method: LogDetMethod = "auto") -> torch.Tensor:
        """``(..., d) -> (...)``: ``log|det J(x)|`` per row (Lemma 1); ``0`` where ``n(x) = 0``.

        ``det J = -det(A) (1 + 2 v^T A^{-1} u / ||u||^2)`` with ``u = W x``, ``v = W^T x``, ``A = I - 2 s W``.

        Args:
            x: ``(..., d)`` inputs.
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
                log_det = dense_log_abs_det_jacobian(*self._degree_zero_inputs(xc))
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
        if basis.reliable or force_eigenbasis:  # columns at unit scale inside: 1e-20 or 1e19 pixels included
            return basis.reflect_and_log_abs_det(x, weight, rotation)
        rows = (x if rotation is None else rotation @ x).mT
        y, _ = reflect_linear_with_summary(rows, weight)
        return y.mT, self._dense_log_abs_det(rows, weight)

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
