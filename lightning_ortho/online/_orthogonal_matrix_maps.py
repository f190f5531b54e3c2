"""Transitions ``U(h) = U h`` whose orthogonal ``(H, H)`` matrix ``U(theta)`` is built from parameters, with the
Jacobian products that :class:`~lightning_ortho.online.orthogonal_linearization.OrthogonalStepLinearization` needs.

The state products use ``U``. A cotangent ``g`` of ``U h`` is the rank-one ``g h^T`` on ``U`` in each stream; it is
pulled back to ``theta`` at this step's parameters (online training changes them between steps):

* :class:`MatrixTransition` (any other map with ``matrix()``): one ``torch.func.vjp`` of ``matrix()``, batched
  over the streams with ``vmap``;
* :class:`CayleyTransition`: ``U = B Q``, ``Q = (I - A/2)^{-1} (I + A/2)``, ``A = L - L^T`` with ``L = tril(X)``
  (PyTorch's ``orthogonal(..., "cayley")``, ``B`` its fixed base). ``dQ = 1/2 M^{-1} dA (I + Q)`` with
  ``M = I - A/2``, so ``g h^T`` pulls back to ``dL/dX = 1/2 tril(p q^T - q p^T)`` with ``p = M^{-T} B^T g`` and
  ``q = (I + Q) h``: one solve for all streams, no per-stream matrix function; :class:`ExponentialTransition`:
  ``Q = exp(A)``, through one eigendecomposition of the skew-symmetric ``A`` (see the class);
* :class:`HouseholderTransition`: the compact WY form ``U = I - V^T S^{-1} V`` of ``k`` reflections (rows of ``V``
  the normalised vectors, ``S = 1/2 I + striu(V V^T)``; Joffrain et al. 2006). With ``a = V h``, ``b = V g``,
  ``q = S^{-1} a``, ``p = S^{-T} b`` and ``R = striu(p q^T)``: ``dL/dV = (R + R^T) V - q g^T - p h^T``, then through
  the normalisation ``dL/dv = (dL/dV - V (V . dL/dV)) / ||v||`` (zero for a zero vector, ``H(0) := I``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.func import jvp as forward_product

from lightning_ortho.nn import HouseholderProduct
from lightning_ortho.nn._undefined import safe_squared_norm
from lightning_ortho.nn.parametrized import ParametrizedOrthogonal
from lightning_ortho.online.linearization import _Method


def matrix_transition(prefix: str, module: nn.Module, h: torch.Tensor) -> MatrixTransition:
    """The transition for ``module`` (a map with ``matrix()``) at rows ``h`` ``(B, H)``: closed forms for Cayley
    and Householder products, the vmapped VJP otherwise."""
    if isinstance(module, HouseholderProduct):
        return HouseholderTransition(prefix, module, h)
    if isinstance(module, ParametrizedOrthogonal) and module.orthogonal_map in _SKEW_MAPS:
        parametrization = module.linear.parametrizations.weight
        if len(parametrization) == 1 and getattr(parametrization[0], "base", None) is not None:
            return _SKEW_MAPS[module.orthogonal_map](prefix, module, h)
    return MatrixTransition(prefix, module, h)


class MatrixTransition:
    """``U(h) = U h`` with ``U`` from ``module.matrix()``; parameter cotangents pulled back through one
    ``torch.func.vjp`` of ``matrix()`` (taken on first use), batched over the streams.

    Attributes: ``value`` ``(B, H)`` = ``U h``; ``matrix`` ``(H, H)``.
    """

    factored = False

    def __init__(self, prefix: str, module: nn.Module, h: torch.Tensor) -> None:
        self.prefix, self.module, self.h = prefix, module, h
        self.params = {name: p.detach() for name, p in module.named_parameters()}
        self.matrix = self._matrix()
        self.value = h @ self.matrix.mT
        self._pull = None

    def _matrix(self) -> torch.Tensor:
        return self.module.matrix().detach().to(self.h.dtype)

    def _build(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(_Method(self.module, "matrix"), {f"cell.{k}": p for k, p in params.items()}, ())

    def _pull_rank_one(self, g: torch.Tensor, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (N, *shape)}``: the cotangents ``g_n h_n^T`` on ``U`` (rows ``(N, H)``) pulled back to ``theta``."""
        if self._pull is None:
            matrix, self._pull = vjp(self._build, self.params)
            self._matrix_dtype = matrix.dtype
        cotangents = (g[:, :, None] * h[:, None, :]).to(self._matrix_dtype)
        grads = vmap(self._pull)(cotangents)[0]
        return {f"{self.prefix}{name}": grad.to(self.h.dtype) for name, grad in grads.items()}

    def jvp(self, t: torch.Tensor) -> torch.Tensor:
        return t @ self.matrix.mT

    def columns(self, tangents: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.matrix, tangents)

    def jacobian(self) -> torch.Tensor:
        return self.matrix.expand(self.h.shape[0], -1, -1)

    def parameter_vjp(self, g: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, *shape)}``: the ``U``-space cotangent ``g h^T`` of each stream pulled back to ``theta``."""
        return self._pull_rank_one(g, self.h)

    def parameter_jvp(self, tangents: dict[str, torch.Tensor]) -> torch.Tensor:
        """``dU h`` per stream for parameter tangents ``{name: (B, *shape)}`` (vmapped forward-mode products)."""
        local = {name: tangents[f"{self.prefix}{name}"].to(p.dtype) for name, p in self.params.items()}
        d_matrix = vmap(lambda t: forward_product(self._build, (self.params,), (t,))[1])(local)
        return torch.einsum("bij,bj->bi", d_matrix.to(self.h.dtype), self.h)

    def parameter_jacobian(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, H, *shape)}``: row ``a`` of stream ``b`` pulls back ``rows[b, a] e_a h_b^T``."""
        batch, hidden = self.h.shape
        g = (rows[:, :, None] * torch.eye(hidden, dtype=rows.dtype, device=rows.device)).reshape(-1, hidden)
        grads = self._pull_rank_one(g, self.h.repeat_interleave(hidden, dim=0))
        return {name: grad.reshape(batch, hidden, *grad.shape[1:]) for name, grad in grads.items()}


class _SkewTransition(MatrixTransition):
    """PyTorch's Cayley or matrix-exponential map of ``A = L - L^T``, ``L = tril(X)``, with its base ``B``:
    ``U = B Q(A)``, built here from the same operations."""

    def _matrix(self) -> torch.Tensor:
        parametrization = self.module.linear.parametrizations.weight
        self.name = f"{self.prefix}linear.parametrizations.weight.original"
        lower = parametrization.original.detach().to(self.h.dtype).tril()
        self.skew = lower - lower.mT
        self.base = parametrization[0].base.to(self.h.dtype)
        return self.base @ self._q()

    def _q(self) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def _to_parameter(grad_skew: torch.Tensor) -> torch.Tensor:
        """``dL/dX = tril(G - G^T)`` from ``G = dL/dA`` ``(N, H, H)`` (``dA = dL - dL^T``, ``L = tril(X)``)."""
        return torch.tril(grad_skew - grad_skew.mT)


class CayleyTransition(_SkewTransition):
    """``Q = (I - A/2)^{-1} (I + A/2)`` (module docstring)."""

    def _q(self) -> torch.Tensor:
        eye = torch.eye(self.skew.shape[0], dtype=self.skew.dtype, device=self.skew.device)
        self.lu = torch.linalg.lu_factor(torch.add(eye, self.skew, alpha=-0.5))  # M = I - A/2
        self.q = torch.linalg.lu_solve(*self.lu, torch.add(eye, self.skew, alpha=0.5))
        return self.q

    def _pull_rank_one(self, g: torch.Tensor, h: torch.Tensor) -> dict[str, torch.Tensor]:
        p = torch.linalg.lu_solve(*self.lu, (g @ self.base).mT, adjoint=True).mT  # rows M^{-T} B^T g
        q = torch.addmm(h, h, self.q.mT)  # rows (I + Q) h
        return {self.name: self._to_parameter(p[:, :, None] * q[:, None, :]).mul_(0.5)}


class ExponentialTransition(_SkewTransition):
    """``Q = exp(A)``. ``A`` is skew-symmetric, so ``i A = V diag(theta) V^H`` (one ``eigh``, on first use) and the
    pull-back of ``E = B^T g h^T`` through ``exp`` is the Frechet derivative at ``A^T = V diag(i theta) V^H``:
    ``dL/dA = V ((V^H E V) o Phi) V^H`` with the divided differences of ``exp``,
    ``Phi_jk = exp(i (theta_j + theta_k) / 2) sinc((theta_j - theta_k) / 2)`` (``sin(x) / x``: no cancellation for
    close eigenvalues). ``V^H E V = (V^H B^T g)(V^T h)^T`` is rank one; two complex products per stream."""

    def _q(self) -> torch.Tensor:
        self._eigen: tuple[torch.Tensor, torch.Tensor] | None = None
        return torch.matrix_exp(self.skew)

    def _pull_rank_one(self, g: torch.Tensor, h: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._eigen is None:
            complex_dtype = torch.complex128 if self.skew.dtype == torch.float64 else torch.complex64
            theta, vectors = torch.linalg.eigh(self.skew.to(complex_dtype) * 1j)
            half_gap = (theta[:, None] - theta[None, :]) / (2 * math.pi)  # torch.sinc(x) = sin(pi x) / (pi x)
            phi = torch.polar(torch.sinc(half_gap), (theta[:, None] + theta[None, :]) / 2)
            self._eigen = (vectors, phi)
        vectors, phi = self._eigen
        alpha = (g @ self.base).to(vectors.dtype) @ vectors.conj()  # rows V^H B^T g
        beta = h.to(vectors.dtype) @ vectors  # rows V^T h
        inner = alpha[:, :, None] * beta[:, None, :] * phi
        grad_skew = (vectors @ inner @ vectors.mH).real
        return {self.name: self._to_parameter(grad_skew)}


_SKEW_MAPS = {"cayley": CayleyTransition, "matrix_exp": ExponentialTransition}


class HouseholderTransition(MatrixTransition):
    """``k`` reflections in the compact WY form (module docstring), for either strategy of
    :class:`~lightning_ortho.nn.HouseholderProduct` (they compute the same product)."""

    def _matrix(self) -> torch.Tensor:
        vectors = self.module.vectors.detach().to(self.h.dtype)
        self.name = f"{self.prefix}vectors"
        squared, defined = safe_squared_norm(torch.linalg.vecdot(vectors, vectors))
        self.inverse_norm = torch.where(defined, squared.rsqrt(), 0.0)[:, None]  # 0 for a zero vector: H(0) = I
        self.unit = vectors * self.inverse_norm
        k = vectors.shape[0]
        eye = torch.eye(k, dtype=vectors.dtype, device=vectors.device)
        self.s = torch.triu(self.unit @ self.unit.mT, diagonal=1) + 0.5 * eye
        solved = torch.linalg.solve_triangular(self.s, self.unit, upper=True)  # S^{-1} V
        return torch.eye(vectors.shape[1], dtype=vectors.dtype, device=vectors.device) - self.unit.mT @ solved

    def _pull_rank_one(self, g: torch.Tensor, h: torch.Tensor) -> dict[str, torch.Tensor]:
        unit = self.unit
        q = torch.linalg.solve_triangular(self.s, (h @ unit.mT).mT, upper=True).mT  # rows S^{-1} V h
        p = torch.linalg.solve_triangular(self.s.mT, (g @ unit.mT).mT, upper=False).mT  # rows S^{-T} V g
        r = torch.triu(p[:, :, None] * q[:, None, :], diagonal=1)
        grad_unit = torch.matmul(r + r.mT, unit)
        grad_unit -= q[:, :, None] * g[:, None, :]
        grad_unit -= p[:, :, None] * h[:, None, :]
        along = torch.linalg.vecdot(grad_unit, unit)  # (N, k)
        grad = (grad_unit - along[:, :, None] * unit) * self.inverse_norm
        return {self.name: grad}
