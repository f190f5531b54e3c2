"""Closed-form Jacobian products of :class:`~lightning_ortho.online.GRUCell` (Cho et al. 2014, torch's convention).

With ``a_x = W_ih x + b_ih`` and ``a_h = W_hh h + b_hh`` split into the gates ``(r, u, n)``::

    r = s(a_x^r + a_h^r),   u = s(a_x^u + a_h^u),   n = tanh(a_x^n + r * a_h^n),   h' = (1 - u) * n + u * h

A cotangent ``c`` of ``h'`` flows back as ``c_n = c (1 - u) (1 - n^2)`` (into ``a_x^n``), ``c_u = c (h - n) u (1 - u)``,
``c_r = c_n a_h^n r (1 - r)`` and ``c_n r`` (into ``a_h^n``), so per stream the parameter product is four outer
products: ``g_x x^T``, ``g_h h^T``, ``g_x``, ``g_h`` with ``g_x = [c_r, c_u, c_n]`` and ``g_h = [c_r, c_u, c_n r]``.
The state product is ``J t = u t + (1 - u) dn + (h - n) du`` with ``d(r, u, n)`` from ``W_hh t``. The cell has no
single preactivation (the state enters three gates), as for the generic path.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.nn._checks import LOW_PRECISION
from lightning_ortho.online.cells import GRUCell
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, register_closed_form

_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def gru_linearization(
    cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout
) -> StepLinearization | None:
    """:class:`GRUStepLinearization` for a :class:`GRUCell` (this exact class, its four parameters), else ``None``."""
    if type(cell) is not GRUCell or layout.names != _NAMES:
        return None
    return GRUStepLinearization(cell, x, h, layout)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


class GRUStepLinearization(StepLinearization):
    """The step of a :class:`GRUCell` with closed-form products (module docstring); shapes as
    :class:`~lightning_ortho.online.linearization.StepLinearization`. Half-precision cells compute in float32."""

    def __init__(self, cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None):
        self.cell, self.x, self.h = cell, x, h
        self.layout = layout if layout is not None else ParameterLayout(cell)
        self.dtype = dtype = torch.float32 if h.dtype in LOW_PRECISION else h.dtype
        self._x, self._h = _cast(x, dtype), _cast(h, dtype)
        self.weight_hh = _cast(cell.weight_hh.detach(), dtype)
        gates_x = torch.addmm(_cast(cell.bias_ih.detach(), dtype), self._x, _cast(cell.weight_ih.detach(), dtype).t())
        gates_h = torch.addmm(_cast(cell.bias_hh.detach(), dtype), self._h, self.weight_hh.t())
        rx, ux, nx = gates_x.chunk(3, dim=1)
        rh, uh, self.nh = gates_h.chunk(3, dim=1)
        self.r, self.u = torch.sigmoid(rx + rh), torch.sigmoid(ux + uh)
        self.n = torch.tanh(nx + self.r * self.nh)
        h_new = torch.lerp(self.n, self._h, self.u)  # (1 - u) n + u h
        self.h_new = _cast(h_new, h.dtype)
        # d h' / d(pre-gate sums): n-gate (1 - u)(1 - n^2), u-gate (h - n) u (1 - u); r enters through the n-gate
        self.slope_n = (1 - self.u) * (1 - self.n * self.n)
        self.slope_u = (self._h - self.n) * self.u * (1 - self.u)
        self.slope_r = self.nh * self.r * (1 - self.r)
        self._last: tuple | None = None

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        return _cast(t, self.h.dtype)

    # -- state side ----------------------------------------------------------------------------------------------
    def _combine(
        self, dr: torch.Tensor, du: torch.Tensor, dn: torch.Tensor, dh: torch.Tensor, lead: int
    ) -> torch.Tensor:
        """``J`` applied given the three gate blocks of ``W_hh t`` (each ``(B, H, ...)``) and the tangent ``t``."""
        view = (slice(None), slice(None)) + (None,) * lead
        n_part = self.slope_r[view] * dr + self.r[view] * dn
        return self.u[view] * dh + self.slope_n[view] * n_part + self.slope_u[view] * du

    def state_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        t = _cast(tangent, self.dtype)
        dr, du, dn = (t @ self.weight_hh.t()).chunk(3, dim=1)
        return self._out(self._combine(dr, du, dn, t, 0))

    def state_jvp_columns(self, tangents: torch.Tensor) -> torch.Tensor:
        t = _cast(tangents, self.dtype)
        dr, du, dn = torch.matmul(self.weight_hh, t).chunk(3, dim=1)
        return self._out(self._combine(dr, du, dn, t, 1))

    # -- parameter side ------------------------------------------------------------------------------------------
    def _gate_cotangents(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g_x, g_h)`` ``(B, ..., 3H)``: the cotangents of ``a_x`` and ``a_h`` for ``c`` ``(B, ..., H)``."""
        view = (slice(None),) + (None,) * (c.dim() - 2) + (slice(None),)
        c_n = c * self.slope_n[view]
        c_r = c_n * self.slope_r[view]
        c_u = c * self.slope_u[view]
        return torch.cat((c_r, c_u, c_n), -1), torch.cat((c_r, c_u, c_n * self.r[view]), -1)

    def _factors(self, cotangent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_gate_cotangents` of ``cotangent`` ``(B, H)``, cached for the norm and the accumulation."""
        if self._last is None or self._last[0] is not cotangent:
            self._last = (cotangent, self._gate_cotangents(_cast(cotangent, self.dtype)))
        return self._last[1]

    def vjp_norm(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        """``||c^T J_theta||`` from the factors: ``||g x^T|| = ||g|| ||x||`` and the bias blocks ``||g||``."""
        _check_kind(kind)
        g_x, g_h = self._factors(cotangent)
        norm = torch.linalg.vector_norm
        inputs = torch.stack((norm(self._x, dim=1), norm(self._h, dim=1)), 1).hypot_(torch.ones_like(g_x[:, :2]))
        return self._out(norm(torch.stack((norm(g_x, dim=1), norm(g_h, dim=1)), 1) * inputs, dim=1))

    def vjp_accumulate(self, kind: str, out: torch.Tensor, cotangent: torch.Tensor, scale: torch.Tensor) -> None:
        """``out += scale_b c_b^T J_theta`` in place, block by block."""
        _check_kind(kind)
        g_x, g_h = self._factors(cotangent)
        column = _cast(scale, out.dtype)[:, None]
        g_x, g_h = _cast(g_x, out.dtype).mul(column), _cast(g_h, out.dtype).mul(column)
        self.layout.block(out, "weight_ih").addcmul_(g_x[:, :, None], self.x[:, None, :])
        self.layout.block(out, "weight_hh").addcmul_(g_h[:, :, None], self.h[:, None, :])
        self.layout.block(out, "bias_ih").add_(g_x)
        self.layout.block(out, "bias_hh").add_(g_h)

    def parameter_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        out = self.h.new_zeros(self.h.shape[0], self.layout.size)
        self.vjp_accumulate("parameter", out, cotangent, torch.ones_like(self.h[:, 0]))
        return out

    def parameter_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        """``J_theta n`` per stream: the gate sums move by ``dW_ih x + db_ih`` and ``dW_hh h + db_hh``."""
        n = _cast(tangent, self.dtype)
        block = self.layout.block
        rx, ux, nx = (torch.einsum("bij,bj->bi", block(n, "weight_ih"), self._x) + block(n, "bias_ih")).chunk(3, 1)
        rh, uh, nh = (torch.einsum("bij,bj->bi", block(n, "weight_hh"), self._h) + block(n, "bias_hh")).chunk(3, 1)
        dn = self.slope_n * (nx + self.slope_r * (rx + rh) + self.r * nh)
        return self._out(dn + self.slope_u * (ux + uh))

    def parameter_jacobian(self) -> torch.Tensor:
        """``(B, H, P)``: row ``i`` is the parameter product of the unit cotangent ``e_i``."""
        batch, hidden = self._h.shape
        eye = torch.eye(hidden, dtype=self.dtype, device=self._h.device).expand(batch, -1, -1)
        g_x, g_h = self._gate_cotangents(eye)  # (B, H, 3H)
        parts = {
            "weight_ih": g_x[:, :, :, None] * self._x[:, None, None, :],
            "weight_hh": g_h[:, :, :, None] * self._h[:, None, None, :],
            "bias_ih": g_x,
            "bias_hh": g_h,
        }
        return self._out(self.layout.flatten(parts, lead=2))

    def require_preactivation(self) -> None:
        _check_kind("preactivation")


def _check_kind(kind: str) -> None:
    if kind != "parameter":
        raise ValueError("GRUCell has no preactivation(x, h): use projection='state' or 'parameter'.")


register_closed_form(GRUCell, gru_linearization)
