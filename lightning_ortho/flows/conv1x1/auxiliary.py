"""1x1 convolutions made of one auxiliary reflection ("One Reflection Suffice", section 3.3 and Appendix B.3)."""

from __future__ import annotations

import warnings

import torch

from lightning_ortho._deprecation import renamed_attributes
from lightning_ortho.flows.conv1x1.base import Invertible1x1Conv, random_orthogonal
from lightning_ortho.nn import AuxiliaryReflection
from lightning_ortho.nn._checks import LOW_PRECISION, full_precision
from lightning_ortho.nn.newton import NewtonResult


class AuxiliaryReflectionConv1x1(Invertible1x1Conv):
    """``g(x) = f(R x)`` at every pixel, with ``f(u) = H(W u) u`` an auxiliary reflection and ``R`` a fixed
    orthogonal matrix (:meth:`rotation`; ``None`` means ``R = I``).

    ``log|det J_g| = log|det J_f(R x)|`` by Lemma 1 (one eigendecomposition of ``W`` per call, then O(C^2) per
    pixel), summed over pixels. The inverse is batched Newton (one solve per pixel): :meth:`inverse` raises
    :class:`~lightning_ortho.nn.NewtonInverseError` where it does not converge, :meth:`inverse_with_result`
    reports iterations, residual and convergence per pixel. ``sign det J_g = sign det J_f(R x) * sign det R``
    with ``J_f`` from Theorem 3.

    Submodule: ``reflection`` (:class:`~lightning_ortho.nn.AuxiliaryReflection`).
    """

    reflection: AuxiliaryReflection

    def rotation(self, dtype: torch.dtype) -> torch.Tensor | None:
        """``(C, C)`` in ``dtype``: the fixed ``R`` applied before the reflection, or ``None`` for ``R = I``."""
        return None

    def forward_columns(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g(x), sum_p log|det J_f(R x_p)|)`` for pixel columns: ``(N, C, P) -> ((N, C, P), (N,))``.

        One call of the reflection's ``forward_and_log_abs_det_columns`` with ``R`` folded in (``R`` orthogonal,
        so ``log|det R| = 0``).
        """
        y, log_abs_det = self.reflection.forward_and_log_abs_det_columns(x, rotation=self.rotation(x.dtype))
        return y, log_abs_det.sum(-1)

    def inverse_columns(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50
    ) -> tuple[torch.Tensor, NewtonResult | None]:
        """``(x, result)``: batched Newton, one solve of ``f(R x_p) = y_p`` per pixel column.

        ``x`` is ``(N, C, P)``; ``result`` the per-pixel :class:`~lightning_ortho.nn.NewtonResult`
        (``iterations``, ``residual``, ``converged`` ``(N, P)``). Does not raise on non-convergence.

        Args:
            y: ``(N, C, P)`` pixel columns.
            tol: relative residual to reach (default: per dtype, 1e-5 in float32, 1e-11 in float64).
            max_iter: Newton iterations at most.
        """
        result = self.reflection.newton_inverse_columns(y, rotation=self.rotation(y.dtype), tol=tol, max_iter=max_iter)
        return result.x, result

    def pixel_jacobian_signs(self, x: torch.Tensor) -> torch.Tensor:
        """``(P, C) -> (P,)``: ``sign det J_f(R x_p) * sign det R`` per pixel row, from Theorem 3's dense
        Jacobian (one ``(C, C)`` determinant per pixel, in full precision)."""
        x = x.float() if x.dtype in LOW_PRECISION else x  # determinants in full precision (and det has no bf16)
        rotation = self.rotation(x.dtype)
        if rotation is None:
            return torch.sign(torch.linalg.det(self.reflection.jacobian(x)))
        return torch.sign(torch.linalg.det(self.reflection.jacobian(x @ rotation.mT))) * torch.sign(
            torch.linalg.det(rotation)
        )


class AuxConv1x1(AuxiliaryReflectionConv1x1, kind="aux"):
    """``g(x) = H(W x) x`` with an unconstrained learnable ``W`` (``R = I``).

    ``W = I - Q`` at init for a random orthogonal ``Q`` (Lemma 5), so ``g(x) = Q x`` there; once ``W`` trains,
    nothing guarantees invertibility (watch :meth:`jacobian_sign_flips` and the Newton results).
    """

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.reflection = AuxiliaryReflection.from_orthogonal(random_orthogonal(channels))
        self._warned_not_unique = False

    def inverse_columns(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50
    ) -> tuple[torch.Tensor, NewtonResult | None]:
        """As :meth:`AuxiliaryReflectionConv1x1.inverse_columns`, after a ``UserWarning``, once per layer, that
        the answer is *a* preimage that Newton converged to, not necessarily the input (``W`` is unconstrained).

        Args:
            y: ``(N, C, P)`` pixel columns.
            tol: relative residual to reach (default: per dtype).
            max_iter: Newton iterations at most.
        """
        if not self._warned_not_unique:  # once per layer: sampling calls this every step
            self._warned_not_unique = True
            warnings.warn(
                "AuxConv1x1 (kind='aux') is not provably invertible: its inverse is a pixel vector that maps to the "
                "target (Newton converged), not necessarily the input that produced it. Watch "
                "jacobian_sign_flips / the GlowInvertibilityCheck callback, or use kind='aux_invertible' (Theorem 2).",
                stacklevel=3,
            )
        return super().inverse_columns(y, tol=tol, max_iter=max_iter)


class InvertibleAuxConv1x1(AuxiliaryReflectionConv1x1, kind="aux_invertible"):
    """``g(x) = H(W Q x) Q x`` with ``W = I + V V^T / (2 sigma_max(V V^T))`` (Theorem 2; ``V = I`` at init) and
    a fixed symmetric orthogonal ``Q = I - 2 P P^T`` (Appendix B.3): provably invertible on all of ``R^C``.

    ``P`` is an orthonormal basis of a random ``C // 2``-dimensional subspace, stored as the raw basis
    (buffer ``fixed_basis``, ``(C, C // 2)``), orthonormalised in float64 and rounded to the working dtype, so ``Q`` is
    orthogonal to machine precision in float32 and float64 alike.
    """

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.register_buffer("fixed_basis", torch.randn(channels, channels // 2))
        self.reflection = AuxiliaryReflection(channels, invertible=True)
        with torch.no_grad():
            self.reflection.factor.copy_(torch.eye(channels))
        self._fixed_orthogonal_cache: tuple[tuple, torch.Tensor] | None = None

    def rotation(self, dtype: torch.dtype) -> torch.Tensor:
        """``(C, C)``: ``R = Q``, the fixed symmetric orthogonal :meth:`fixed_orthogonal` in ``dtype`` (float32 for
        half precision)."""
        return self.fixed_orthogonal(dtype)

    def fixed_orthogonal(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``(C, C)``: the fixed symmetric orthogonal ``Q`` (cached per dtype, device and buffer version), in
        ``dtype``, or float32 for a half-precision ``dtype`` (the reflection math runs in float32 there)."""
        dtype = dtype or self.fixed_basis.dtype
        if dtype in LOW_PRECISION:
            dtype = torch.float32
        key = (dtype, self.fixed_basis.device, self.fixed_basis._version, self.fixed_basis.data_ptr())
        if self._fixed_orthogonal_cache is None or self._fixed_orthogonal_cache[0] != key:
            self._fixed_orthogonal_cache = (key, self._compute_fixed_orthogonal(dtype))
        return self._fixed_orthogonal_cache[1]

    def _compute_fixed_orthogonal(self, dtype: torch.dtype) -> torch.Tensor:
        # Built once in float64 with autocast off, then rounded: under bf16 autocast the matmul would run in
        # bfloat16 and the cached Q would be orthogonal only to ~1e-2, silently breaking every inverse.
        with full_precision(self.fixed_basis):
            basis = self.fixed_basis.to(torch.float64)
            eye = torch.eye(self.channels, dtype=basis.dtype, device=basis.device)
            if basis.shape[1] == 0:
                return eye.to(dtype)
            p = torch.linalg.qr(basis).Q
            return (eye - 2.0 * p @ p.T).to(dtype)

    def invertibility_margin(self) -> float:
        """Theorem 2's ``3/2 lambda_min(W) - lambda_max(W)`` (exact eigensolver): positive means invertible."""
        return self.reflection.invertibility_margin()


#: Deprecated names (one release): the base of the auxiliary kinds was called AuxiliaryConv1x1, too close to AuxConv1x1.
__getattr__ = renamed_attributes(
    "lightning_ortho.flows.conv1x1.auxiliary",
    {"AuxiliaryConv1x1": ("AuxiliaryReflectionConv1x1", AuxiliaryReflectionConv1x1)},
)
