"""The transition ``h -> U(h)`` of an :class:`~lightning_ortho.nn.OrthogonalRNNCell` and its Jacobian products,
per stream, for :class:`~lightning_ortho.online.orthogonal_linearization.OrthogonalStepLinearization`.

Two kinds:

* :class:`ReflectionTransition`: one auxiliary reflection ``U(h) = H(W h) h`` ("One Reflection Suffice",
  Theorem 3), in closed form. With ``v = W h``, ``c = 2 v.h / v.v``, ``k = 2 / v.v`` and ``y = U(h) = h - c v``:
  ``dU[t] = t - c W t - dc v`` with ``dc = k (W t . h + v . t) - c k (v . W t) = k (r . t)``, ``r = W^T y + v``;
  the cotangent ``g`` of ``U(h)`` pulls back to ``dL/dv = -c g - k (g.v) y`` and ``dL/dW = (dL/dv) h^T``.
  ``H(v)`` is undefined where ``v.v`` is (below the smallest normal) zero: there ``c = k = 0``, so ``U = I``
  with Jacobian ``I`` and no gradient for ``W`` (``H(0) := I``, as :mod:`lightning_ortho.nn._undefined`).
  Every row of ``h`` is first divided by its largest entry: ``c`` and ``dU`` do not change (degree 0 in ``h``),
  ``U(h)`` scales back (degree 1) and ``v.v`` stays in range for 1e-20 or 1e19 rows.
* :class:`MatrixTransition`: ``U(h) = U h`` with the matrix ``U(theta)`` built by the map (Householder product,
  Cayley, matrix exponential). The state products use ``U``; a parameter cotangent is ``g h^T`` in ``U``-space
  per stream, mapped to ``theta`` by one ``torch.func.vjp`` of the map, batched over the streams with ``vmap``.

Both work in the math dtype they are given (float32 for half-precision cells) on ``(B, H)`` rows.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.func import jvp as forward_product

from lightning_ortho.nn._undefined import is_defined
from lightning_ortho.online.linearization import _Method


def row_peak(rows: torch.Tensor) -> torch.Tensor:
    """``(B, 1)``: the largest ``|entry|`` of each row, at least the smallest normal number (a zero row stays zero
    when divided by it). ``v.v`` and ``v.h`` of rows divided by it are neither underflowed nor overflowed."""
    return torch.amax(torch.abs(rows), -1, keepdim=True).clamp_min_(torch.finfo(rows.dtype).tiny)


class ReflectionTransition:
    """``U(h) = H(W h) h`` for ``(B, H)`` rows ``h`` and a ``(H, H)`` ``W`` (closed form, see the module docstring).

    Attributes: ``value`` ``(B, H)`` = ``U(h)``; ``c``, ``k`` ``(B, 1)`` and ``v``, ``y`` ``(B, H)`` of the scaled rows.
    """

    factored = True

    def __init__(self, name: str, weight: torch.Tensor, h: torch.Tensor) -> None:
        self.name, self.weight, self.h = name, weight, h
        self.scale = row_peak(h)
        self.h_hat = h / self.scale
        self.v = v = torch.mm(self.h_hat, weight.t())
        vv = torch.linalg.vecdot(v, v)[:, None]
        # k = 2 / v.v, and 0 where H(v) is undefined (U = I there); a NaN v.v stays NaN
        self.k = torch.where(is_defined(vv), torch.reciprocal(vv).mul_(2.0), 0.0)
        self.c = self.k * torch.linalg.vecdot(v, self.h_hat)[:, None]
        self.y = torch.addcmul(self.h_hat, self.c, v, value=-1.0)  # U(h) / s
        self.value = self.y * self.scale
        self._kr: torch.Tensor | None = None

    @property
    def h_norm(self) -> torch.Tensor:
        """``(B,)``: ``||h||``, from the scaled rows (no overflow)."""
        return torch.linalg.vector_norm(self.h_hat, dim=1) * self.scale[:, 0]

    @property
    def kr(self) -> torch.Tensor:
        """``(B, H)``: ``k r`` with ``r = W^T y + v``, so that ``dc = (k r) . t`` for a state tangent ``t``."""
        if self._kr is None:
            self._kr = torch.addmm(self.v, self.y, self.weight).mul_(self.k)
        return self._kr

    def jvp(self, t: torch.Tensor) -> torch.Tensor:
        """``dU[t] = t - c W t - k (r . t) v``: ``(B, H) -> (B, H)``."""
        dc = torch.linalg.vecdot(self.kr, t)[:, None]
        out = torch.addcmul(t, self.c, torch.mm(t, self.weight.t()), value=-1.0)
        return out.addcmul_(dc, self.v, value=-1.0)

    def columns(self, tangents: torch.Tensor) -> torch.Tensor:
        """``dU`` on each column of ``(B, H, K)`` tangents."""
        dc = self.kr[:, None, :] @ tangents  # (B, 1, K)
        out = torch.addcmul(tangents, self.c[:, :, None], torch.matmul(self.weight, tangents), value=-1.0)
        return out.sub_(self.v[:, :, None] * dc)

    def jacobian(self) -> torch.Tensor:
        """``(B, H, H)``: ``I - c W - k v r^T``."""
        eye = torch.eye(self.weight.shape[0], dtype=self.weight.dtype, device=self.weight.device)
        dense = torch.addcmul(eye, self.c[:, :, None], self.weight, value=-1.0)
        return dense.sub_(self.v[:, :, None] * self.kr[:, None, :])

    def outer_factor(self, g: torch.Tensor) -> torch.Tensor:
        """``dL/dv = -c g - k (g.v) y`` ``(B, H)``: the ``W`` block of the pulled-back ``g`` is ``(dL/dv) h^T``."""
        kgv = self.k * torch.linalg.vecdot(g, self.v)[:, None]
        return torch.addcmul(self.c * g, kgv, self.y).neg_()

    def parameter_vjp(self, g: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, H, H)}``: ``g^T dU(h)/dW`` per stream."""
        return {self.name: self.outer_factor(g)[:, :, None] * self.h[:, None, :]}

    def parameter_jvp(self, tangents: dict[str, torch.Tensor]) -> torch.Tensor:
        """``dU`` for a ``(B, H, H)`` tangent ``dW`` per stream: ``dv = dW h``, ``dU = -c dv - k (y . dv) v``."""
        dv = torch.einsum("bij,bj->bi", tangents[self.name], self.h)
        kyd = self.k * torch.linalg.vecdot(self.y, dv)[:, None]
        return torch.addcmul(self.c * dv, kyd, self.v).neg_()

    def parameter_jacobian(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, H, H, H)}``: ``diag(rows) dU(h)/dW`` with ``dU_a/dW_ij = (-c delta_ai - k v_a y_i) h_j``."""
        eye = torch.eye(self.h.shape[1], dtype=self.h.dtype, device=self.h.device)
        local = -self.c[:, :, None] * eye - (self.k * self.v)[:, :, None] * self.y[:, None, :]
        local = local * rows[:, :, None]
        return {self.name: local[:, :, :, None] * self.h[:, None, None, :]}


class MatrixTransition:
    """``U(h) = U h`` with ``U`` ``(H, H)`` built by ``module.matrix()`` from the module's parameters.

    The parameter products pull ``U``-space cotangents back through one ``torch.func.vjp`` of ``matrix()``,
    taken on first use and shared by every later product of the step.
    """

    factored = False

    def __init__(self, prefix: str, module: nn.Module, h: torch.Tensor) -> None:
        self.prefix, self.module, self.h = prefix, module, h
        self.params = {name: p.detach() for name, p in module.named_parameters()}
        self.matrix = module.matrix().detach().to(h.dtype)
        self.value = h @ self.matrix.mT
        self.h_norm = torch.linalg.vector_norm(h, dim=1)
        self._pull = None

    def _build(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(_Method(self.module, "matrix"), {f"cell.{k}": p for k, p in params.items()}, ())

    def _pullback(self, cotangents: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(N, H, H)`` cotangents on ``U`` -> ``{name: (N, *shape)}`` on the parameters (one vmapped VJP)."""
        if self._pull is None:
            matrix, self._pull = vjp(self._build, self.params)
            self._matrix_dtype = matrix.dtype
        grads = vmap(self._pull)(cotangents.to(self._matrix_dtype))[0]
        return {f"{self.prefix}{name}": g.to(self.h.dtype) for name, g in grads.items()}

    def jvp(self, t: torch.Tensor) -> torch.Tensor:
        return t @ self.matrix.mT

    def columns(self, tangents: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.matrix, tangents)

    def jacobian(self) -> torch.Tensor:
        return self.matrix.expand(self.h.shape[0], -1, -1)

    def parameter_vjp(self, g: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, *shape)}``: the ``U``-space cotangent ``g h^T`` of each stream pulled back to ``theta``."""
        return self._pullback(g[:, :, None] * self.h[:, None, :])

    def parameter_jvp(self, tangents: dict[str, torch.Tensor]) -> torch.Tensor:
        """``dU h`` per stream for parameter tangents ``{name: (B, *shape)}`` (vmapped forward-mode products)."""
        local = {name: tangents[f"{self.prefix}{name}"].to(p.dtype) for name, p in self.params.items()}
        d_matrix = vmap(lambda t: forward_product(self._build, (self.params,), (t,))[1])(local)
        return torch.einsum("bij,bj->bi", d_matrix.to(self.h.dtype), self.h)

    def parameter_jacobian(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, H, *shape)}``: row ``a`` of stream ``b`` pulls back ``rows[b, a] e_a h_b^T``."""
        batch, hidden = self.h.shape
        eye = torch.eye(hidden, dtype=self.h.dtype, device=self.h.device)
        cotangents = (rows[:, :, None] * eye)[:, :, :, None] * self.h[:, None, None, :]  # (B, H, H, H)
        grads = self._pullback(cotangents.reshape(batch * hidden, hidden, hidden))
        return {name: g.reshape(batch, hidden, *g.shape[1:]) for name, g in grads.items()}
