"""The linear 1x1 convolutions ``z = M x`` per pixel: dense, LU and Householder."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.flows.conv1x1.base import Invertible1x1Conv, random_orthogonal
from lightning_ortho.nn import HouseholderProduct
from lightning_ortho.nn._checks import LOW_PRECISION
from lightning_ortho.nn.newton import NewtonResult


def full_precision_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if it is float16/bfloat16 (a differentiable copy), else ``t`` itself."""
    return t.float() if t.dtype in LOW_PRECISION else t


class LinearConv1x1(Invertible1x1Conv):
    """``z = M x`` at every pixel for a ``(C, C)`` matrix ``M``: ``log|det dz/dx| = H W log|det M|``.

    A kind implements :meth:`matrix` and :meth:`log_abs_det_matrix`; the inverse is ``M^{-1} z`` (exact, no
    Newton result), and ``sign det J`` is the same at every pixel, so :meth:`jacobian_sign_flips` is ``0``.
    """

    def matrix(self) -> torch.Tensor:  # pragma: no cover - interface
        """``(C, C)``: ``M``, differentiable in the parameters, in full precision (float32 for half-precision
        parameters: ``slogdet``, ``inv`` and triangular solves have no half kernels)."""
        raise NotImplementedError

    def log_abs_det_matrix(self) -> torch.Tensor:  # pragma: no cover - interface
        """``()``: ``log|det M|``."""
        raise NotImplementedError

    def inverse_matrix(self) -> torch.Tensor:
        """``(C, C)``: ``M^{-1}`` (``torch.linalg.inv``)."""
        return torch.linalg.inv(self.matrix())

    def forward_columns(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M x, P log|det M|)`` for ``P = H W`` pixel columns: ``(N, C, P) -> ((N, C, P), (N,))``.

        The product runs in the promoted dtype of ``M`` and ``x`` (float32 for half-precision inputs) and is
        returned in ``x``'s dtype.
        """
        # A batched (C, C) x (C, H W) product: faster on CPU than einsum or conv2d here.
        matrix = self.matrix()
        dtype = torch.promote_types(matrix.dtype, x.dtype)
        y = (matrix.to(dtype) @ x.to(dtype)).to(x.dtype)
        return y, (x.shape[-1] * self.log_abs_det_matrix().to(x.dtype)).expand(x.shape[0])

    def inverse_columns(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50
    ) -> tuple[torch.Tensor, NewtonResult | None]:
        """``(M^{-1} y, None)`` for pixel columns ``(N, C, P)``: exact, so there is no Newton result and ``tol``
        and ``max_iter`` are ignored."""
        inverse = self.inverse_matrix()
        dtype = torch.promote_types(inverse.dtype, y.dtype)
        return (inverse.to(dtype) @ y.to(dtype)).to(y.dtype), None

    def pixel_jacobian_signs(self, x: torch.Tensor) -> torch.Tensor:
        """``(P, C) -> (P,)``: ``sign det M`` at every pixel (the Jacobian of a linear map is ``M`` everywhere)."""
        return torch.sign(torch.linalg.det(self.matrix().detach())).to(x.dtype).expand(x.shape[0])


class PlainConv1x1(LinearConv1x1, kind="plain"):
    """``M = W``, a dense learnable matrix (Kingma & Dhariwal 2018); ``log|det W|`` by ``slogdet`` (O(C^3)).

    Its learnable parameter is ``weight`` ``(C, C)``, a random orthogonal matrix at init.
    """

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.weight = nn.Parameter(random_orthogonal(channels))

    def matrix(self) -> torch.Tensor:
        """``(C, C)``: ``M = W``, the parameter itself (a float32 copy for half-precision ``weight``)."""
        return full_precision_copy(self.weight)

    def log_abs_det_matrix(self) -> torch.Tensor:
        """``()``: ``log|det W|`` by ``torch.linalg.slogdet`` (O(C^3))."""
        return torch.linalg.slogdet(self.matrix())[1]


class LUConv1x1(LinearConv1x1, kind="lu"):
    """``M = P L (U + diag(sign_s * exp(log_s)))`` (Kingma & Dhariwal 2018): ``log|det M| = sum log|s|`` in O(C).

    ``P`` (permutation) and ``sign_s`` are fixed buffers from the LU factorisation of a random orthogonal
    matrix; ``lower`` (strictly lower, unit diagonal added), ``upper`` (strictly upper) and ``log_s`` learn.
    """

    jacobian_sign_is_fixed = True  # sign det M = det P * prod(sign_s), both fixed buffers

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        p, lower, upper = torch.linalg.lu(random_orthogonal(channels))
        s = torch.diagonal(upper)
        self.register_buffer("permutation", p)
        self.register_buffer("sign_s", torch.sign(s))
        self.register_buffer("lower_mask", torch.tril(torch.ones(channels, channels), -1))
        self.lower = nn.Parameter(lower * self.lower_mask)
        self.upper = nn.Parameter(torch.triu(upper, 1))
        self.log_s = nn.Parameter(torch.log(torch.abs(s)))

    def matrix(self) -> torch.Tensor:
        """``(C, C)``: ``M = P (L + I) (U + diag(sign_s * exp(log_s)))`` with ``L`` the strictly lower part of
        ``lower`` and ``U`` the strictly upper part of ``upper`` (float32 for half-precision parameters)."""
        lower_, upper_, log_s = (full_precision_copy(t) for t in (self.lower, self.upper, self.log_s))
        eye = torch.eye(self.channels, device=log_s.device, dtype=log_s.dtype)
        lower = lower_ * self.lower_mask.to(log_s.dtype) + eye
        upper = torch.triu(upper_, 1) + torch.diag(self.sign_s.to(log_s.dtype) * torch.exp(log_s))
        return self.permutation.to(log_s.dtype) @ lower @ upper

    def log_abs_det_matrix(self) -> torch.Tensor:
        """``()``: ``log|det M| = sum log_s`` in O(C) (``|det P| = det(L + I) = 1``)."""
        return full_precision_copy(self.log_s).sum()


class HouseholderConv1x1(LinearConv1x1, kind="householder"):
    """``M = Q = H(v_1) ... H(v_C)``, a product of ``C`` reflections (Hoogeboom et al. 2019, without the
    triangular factor, as the paper's experiment): orthogonal, so ``log|det M| = 0`` and ``M^{-1} = M^T``.

    Submodule: ``householder`` (:class:`~lightning_ortho.nn.HouseholderProduct`), a random orthogonal ``Q`` at init.
    """

    jacobian_sign_is_fixed = log_abs_det_is_zero = True  # det Q = (-1)^C: a product of C reflections

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.householder = HouseholderProduct.from_orthogonal(random_orthogonal(channels))

    def matrix(self) -> torch.Tensor:
        """``(C, C)``: ``Q = H(v_1) ... H(v_C)``, the dense product of the ``householder`` submodule."""
        return self.householder.matrix()

    def log_abs_det_matrix(self) -> torch.Tensor:
        """``()``: ``0`` (``Q`` is orthogonal), in the dtype of the reflection vectors."""
        return self.householder.vectors.new_zeros(())

    def inverse_matrix(self) -> torch.Tensor:
        """``(C, C)``: ``Q^{-1} = Q^T``, without a solve."""
        return self.matrix().mT
