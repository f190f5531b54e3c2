"""Invertible 1x1 convolutions: dense, LU, Householder (Hoogeboom et al. 2019) and auxiliary reflections."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from lightning_ortho.flows.base import FlowLayer, check_images
from lightning_ortho.nn import AuxiliaryReflection, HouseholderProduct
from lightning_ortho.nn.newton import NewtonResult

Conv1x1Kind = Literal["plain", "lu", "householder", "aux", "aux_invertible"]
CONV1X1_KINDS: tuple[str, ...] = ("plain", "lu", "householder", "aux", "aux_invertible")


def _random_orthogonal(channels: int) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(channels, channels, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def to_columns(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W) -> (N, C, H W)``: one column per pixel, a view (no copy) of a contiguous image."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def to_rows(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W) -> (N H W, C)``: one row per pixel."""
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


class Invertible1x1Conv(FlowLayer):
    """``z_{:, i, j} = g(x_{:, i, j})`` for every pixel, with ``g`` one of:

    * ``"plain"``: ``W x`` with a dense ``W`` (Kingma & Dhariwal 2018); ``log|det| = H W log|det W|`` by ``slogdet``.
    * ``"lu"``: ``W = P L (U + diag(s))`` with fixed ``P`` (Kingma & Dhariwal 2018); ``log|det| = H W sum log|s|``.
    * ``"householder"``: ``Q x`` with ``Q`` a product of ``C`` reflections (Hoogeboom et al. 2019, without the
      triangular factor, as the paper's experiment); ``log|det| = 0``.
    * ``"aux"``: ``H(W x) x`` with an unconstrained ``W = I - Q`` at init (Lemma 5), so it starts as ``Q x``;
      ``log|det|`` from Lemma 1 summed over pixels (one eigendecomposition of ``W``, O(C^2) per pixel); the
      inverse by batched Newton (raises :class:`~lightning_ortho.nn.NewtonInverseError` on failure).
    * ``"aux_invertible"``: ``H(W Q x) Q x`` with ``W = I + V V^T / (2 sigma_max)`` (Theorem 2; ``V = I`` at init)
      and a fixed symmetric orthogonal ``Q`` (Appendix B.3): provably invertible.

    All start from a random orthogonal map (``torch.linalg.qr`` of a Gaussian), like Glow.
    Shapes: ``(N, C, H, W) -> (N, C, H, W)``, log-det ``(N,)``.
    """

    def __init__(self, channels: int, kind: Conv1x1Kind = "lu") -> None:
        super().__init__()
        if kind not in CONV1X1_KINDS:
            raise ValueError(f"Invertible1x1Conv: kind must be one of {', '.join(CONV1X1_KINDS)}, got {kind!r}.")
        self.channels, self.kind = channels, kind
        self._fixed_orthogonal_cache: tuple[tuple, torch.Tensor] | None = None
        q = _random_orthogonal(channels)
        if kind == "plain":
            self.weight = nn.Parameter(q)
        elif kind == "lu":
            p, lower, upper = torch.linalg.lu(q)
            s = torch.diagonal(upper)
            self.register_buffer("permutation", p)
            self.register_buffer("sign_s", torch.sign(s))
            self.register_buffer("lower_mask", torch.tril(torch.ones(channels, channels), -1))
            self.lower = nn.Parameter(lower * self.lower_mask)
            self.upper = nn.Parameter(torch.triu(upper, 1))
            self.log_s = nn.Parameter(torch.log(torch.abs(s)))
        elif kind == "householder":
            self.householder = HouseholderProduct.from_orthogonal(q)
        elif kind == "aux":
            self.reflection = AuxiliaryReflection.from_orthogonal(q)
        else:
            # A fixed symmetric orthogonal Q = I - 2 P P^T (Appendix B.3 uses Q = Q^T), P an orthonormal basis of a
            # random C//2-dimensional subspace. Stored as the raw basis and orthonormalised in the working dtype,
            # so Q is orthogonal to machine precision in float32 and float64 alike. And V = I.
            self.register_buffer("fixed_basis", torch.randn(channels, channels // 2))
            self.reflection = AuxiliaryReflection(channels, invertible=True)
            with torch.no_grad():
                self.reflection.factor.copy_(torch.eye(channels))

    # ----------------------------------------------------------------- dense kinds

    def fixed_orthogonal(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``(C, C)``: the fixed symmetric orthogonal ``Q`` of ``aux_invertible`` (cached per dtype and device)."""
        dtype = dtype or self.fixed_basis.dtype
        key = (dtype, self.fixed_basis.device, self.fixed_basis._version, self.fixed_basis.data_ptr())
        if self._fixed_orthogonal_cache is None or self._fixed_orthogonal_cache[0] != key:
            self._fixed_orthogonal_cache = (key, self._compute_fixed_orthogonal(dtype))
        return self._fixed_orthogonal_cache[1]

    def _compute_fixed_orthogonal(self, dtype: torch.dtype) -> torch.Tensor:
        basis = self.fixed_basis.to(dtype)
        eye = torch.eye(self.channels, dtype=basis.dtype, device=basis.device)
        if basis.shape[1] == 0:
            return eye
        p = torch.linalg.qr(basis).Q
        return eye - 2.0 * p @ p.T

    def matrix(self) -> torch.Tensor:
        """``(C, C)``: the matrix of the linear kinds (``plain``, ``lu``, ``householder``)."""
        if self.kind == "plain":
            return self.weight
        if self.kind == "lu":
            eye = torch.eye(self.channels, device=self.log_s.device, dtype=self.log_s.dtype)
            lower = self.lower * self.lower_mask + eye
            upper = torch.triu(self.upper, 1) + torch.diag(self.sign_s * torch.exp(self.log_s))
            return self.permutation @ lower @ upper
        if self.kind == "householder":
            return self.householder.matrix()
        raise ValueError(f"Invertible1x1Conv: kind {self.kind!r} is not linear; it has no matrix.")

    def _log_abs_det_matrix(self, like: torch.Tensor) -> torch.Tensor:
        if self.kind == "plain":
            return torch.linalg.slogdet(self.weight)[1]
        if self.kind == "lu":
            return self.log_s.sum()
        return like.new_zeros(())  # householder: orthogonal

    # ----------------------------------------------------------------- FlowLayer

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_images(x, self.channels, "Invertible1x1Conv")
        pixels = x.shape[2] * x.shape[3]
        columns = to_columns(x)
        if self.kind in ("plain", "lu", "householder"):
            # A batched (C, C) x (C, H W) product: about twice as fast on CPU as einsum or conv2d here.
            y = self.matrix().to(x.dtype) @ columns
            return y.reshape(x.shape), (pixels * self._log_abs_det_matrix(x).to(x.dtype)).expand(x.shape[0])
        rotation = self.fixed_orthogonal(x.dtype) if self.kind == "aux_invertible" else None
        y, log_abs_det = self.reflection.forward_and_log_abs_det_columns(columns, rotation=rotation)
        return y.reshape(x.shape), log_abs_det.sum(-1)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return self.inverse_with_result(y)[0]

    def inverse_with_result(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50, raise_on_failure: bool = True
    ) -> tuple[torch.Tensor, NewtonResult | None]:
        """``(x, result)``: the inverse and, for the auxiliary kinds, the per-pixel :class:`NewtonResult`
        (iterations, residual, converged). With ``raise_on_failure=False`` a failed pixel is flagged in
        ``result.converged`` instead of raising."""
        check_images(y, self.channels, "Invertible1x1Conv.inverse")
        columns = to_columns(y)
        if self.kind in ("plain", "lu"):
            return (torch.linalg.inv(self.matrix().to(y.dtype)) @ columns).reshape(y.shape), None
        if self.kind == "householder":
            return (self.matrix().to(y.dtype).mT @ columns).reshape(y.shape), None
        rotation = self.fixed_orthogonal(y.dtype) if self.kind == "aux_invertible" else None
        result = self.reflection.newton_inverse_columns(columns, rotation=rotation, tol=tol, max_iter=max_iter)
        if raise_on_failure:
            result.raise_if_failed(f"Invertible1x1Conv({self.kind!r})")
        return result.x.reshape(y.shape), result

    @torch.no_grad()
    def jacobian_sign_flips(self, x: torch.Tensor) -> float:
        """Fraction of the pixels of ``x`` where ``sign det J`` differs from the majority sign (aux kinds).

        ``det J`` is continuous on the unit sphere (where ``W x != 0``), so a nonzero fraction means it
        vanishes somewhere: Theorem 4's sufficient condition for invertibility fails, and Newton may return a
        different preimage. ``0.0`` is necessary, not sufficient, for invertibility. Linear kinds return 0.
        """
        if self.kind not in ("aux", "aux_invertible"):
            return 0.0
        rows = to_rows(x)
        if self.kind == "aux_invertible":
            rows = rows @ self.fixed_orthogonal(x.dtype)
        signs = torch.sign(torch.linalg.det(self.reflection.jacobian(rows)))
        positive = float((signs > 0).float().mean())
        return min(positive, 1.0 - positive)

    def invertibility_margin(self) -> float:
        """Theorem 2's ``3/2 lambda_min(W) - lambda_max(W)`` for ``aux_invertible`` (positive: invertible)."""
        if self.kind != "aux_invertible":
            raise ValueError(
                "Invertible1x1Conv.invertibility_margin: only kind='aux_invertible' is covered by Theorem 2."
            )
        return self.reflection.invertibility_margin()

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kind={self.kind!r}"
