"""The transition ``h -> U(h)`` of an :class:`~lightning_ortho.nn.OrthogonalRNNCell` and its Jacobian products,
per stream, for :class:`~lightning_ortho.online.orthogonal_linearization.OrthogonalStepLinearization`.

Two kinds:

* :class:`ReflectionTransition`: one auxiliary reflection ``U(h) = H(W h) h`` ("One Reflection Suffice",
  Theorem 3), in closed form. With ``v = W h``, ``c = 2 v.h / v.v``, ``k = 2 / v.v`` and ``y = U(h) = h - c v``:
  ``dU[t] = t - c W t - dc v`` with ``dc = k (W t . h + v . t) - c k (v . W t) = k (r . t)``, ``r = W^T y + v``;
  the cotangent ``g`` of ``U(h)`` pulls back to ``dL/dv = -c g - k (g.v) y`` and ``dL/dW = (dL/dv) h^T``.
  ``H(v)`` is undefined where ``v.v`` is (below the smallest normal) zero: there ``c = k = 0``, so ``U = I``
  with Jacobian ``I`` and no gradient for ``W`` (``H(0) := I`` where
  :func:`lightning_ortho.nn._undefined.is_defined` is false).
  Every row of ``h`` is first divided by its largest entry: ``c`` and ``dU`` do not change (degree 0 in ``h``),
  ``U(h)`` scales back (degree 1) and ``v.v`` stays in range for 1e-20 or 1e19 rows.
* the maps that build a matrix ``U(theta)`` (Householder product, Cayley, matrix exponential):
  :mod:`~lightning_ortho.online._orthogonal_matrix_maps`.

Both work in the math dtype they are given (float32 for half-precision cells) on ``(B, H)`` rows.
"""

from __future__ import annotations

import torch


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
        # k = 2 / v.v, and 0 where H(v) is undefined (U = I there): vv <= tiny is ~is_defined(vv), NaN stays NaN
        self.k = torch.where(vv <= torch.finfo(vv.dtype).tiny, 0.0, torch.reciprocal(vv).mul_(2.0))
        self.c = self.k * torch.linalg.vecdot(v, self.h_hat)[:, None]
        self.y = torch.addcmul(self.h_hat, self.c, v, value=-1.0)  # U(h) / s
        self.value = self.y * self.scale
        self._kr: torch.Tensor | None = None

    @property
    def h_norm(self) -> torch.Tensor:
        """``(B,)``: ``||h||``."""
        return torch.linalg.vector_norm(self.h, dim=1)

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
        """``f = c g + k (g.v) y`` ``(B, H)``: ``dL/dv = -f``, so the ``W`` block of the pulled-back ``g`` is
        ``-f h^T`` (the sign is applied where the block is written)."""
        kgv = self.k * torch.linalg.vecdot(g, self.v)[:, None]
        return torch.addcmul(self.c * g, kgv, self.y)

    def parameter_vjp(self, g: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: (B, H, H)}``: ``g^T dU(h)/dW = -f h^T`` per stream."""
        return {self.name: self.outer_factor(g).neg_()[:, :, None] * self.h[:, None, :]}

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
