"""Closed-form Jacobian products of :class:`~lightning_ortho.nn.OrthogonalRNNCell` for the online estimators.

The step is ``z = U(h) + V x``, ``h' = sigma(z; b)`` with ``sigma`` modReLU ``sign(z) relu(|z| + b)`` or
``tanh(z + b)``. With ``s = dh'/dz`` (``1[|z| + b > 0]`` where ``z != 0``, or ``1 - h'^2``) and
``s_b = dh'/db`` (``sign(z) 1[|z| + b > 0]``, or ``1 - h'^2``), per stream:

* ``J^{h'}_h t = s * dU[t]`` (the transition's state product);
* ``c^T J^{h'}_theta``: the bias block ``c * s_b``, the input block ``(c * s) x^T`` and the transition block,
  the pull-back of ``g = c * s`` through ``U``: ``(dL/dv) h^T`` for an auxiliary reflection (Theorem 3 of "One
  Reflection Suffice"), or ``g h^T`` mapped through the map's parametrisation for Householder, Cayley and matrix
  exponential transitions (:mod:`~lightning_ortho.online._orthogonal_transitions`);
* the cut vertex ``z``: ``J^{h'}_z = diag(s)``; the bias acts after ``z`` (post-activation parameter).

Norms of ``c^T J`` come from the factors (``||g x^T|| = ||g|| ||x||``) where the blocks are outer products, so
UORO never materialises them for an auxiliary reflection. A matrix map's parameters change from step to step in
online training, so each step maps its own ``U``-space cotangents at its own parameters (exact; nothing is
deferred to the gradient).

:func:`orthogonal_linearization` is what :func:`~lightning_ortho.online.linearization.linearize` calls for this
cell (the cell lives in ``nn``, which never imports ``online``).
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.nn import HouseholderProduct, OrthogonalRNNCell
from lightning_ortho.nn._checks import LOW_PRECISION
from lightning_ortho.nn.auxiliary import AuxiliaryReflection
from lightning_ortho.nn.parametrized import ParametrizedOrthogonal
from lightning_ortho.online._orthogonal_matrix_maps import matrix_transition
from lightning_ortho.online._orthogonal_transitions import ReflectionTransition
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, register_closed_form

_BIAS, _INPUT = "bias", "input_kernel.weight"


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def has_closed_form(cell: nn.Module) -> bool:
    """Whether :func:`orthogonal_linearization` covers ``cell``: an ``OrthogonalRNNCell`` (this exact class) whose
    transition is an auxiliary reflection with ``n(h) = W h`` and a free ``W``, or a map that builds its matrix
    (``HouseholderProduct``, ``ParametrizedOrthogonal``). Others (a custom auxiliary network, Theorem-2 ``W``)
    take the generic ``torch.func`` path."""
    if type(cell) is not OrthogonalRNNCell:
        return False
    transition = cell.transition
    if isinstance(transition, AuxiliaryReflection):
        return transition.network is None and not transition.invertible
    return isinstance(transition, (HouseholderProduct, ParametrizedOrthogonal))


def orthogonal_linearization(
    cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None
) -> StepLinearization | None:
    """The closed-form :class:`OrthogonalStepLinearization` of ``cell`` at ``(x, h)``, or ``None`` when
    :func:`has_closed_form` says the cell has none."""
    return OrthogonalStepLinearization(cell, x, h, layout) if has_closed_form(cell) else None


class OrthogonalStepLinearization(StepLinearization):
    """The step of an :class:`~lightning_ortho.nn.OrthogonalRNNCell` with closed-form products (module docstring).

    Args and shapes as :class:`~lightning_ortho.online.linearization.StepLinearization`: ``x`` ``(B, I)``,
    ``h`` ``(B, H)``; products take and return tensors of ``h``'s dtype. Half-precision cells compute in float32.
    """

    def __init__(self, cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None):
        self.cell, self.x, self.h = cell, x, h
        self.layout = layout if layout is not None else ParameterLayout(cell)
        self.dtype = dtype = torch.float32 if h.dtype in LOW_PRECISION else h.dtype
        self._x, self._h = _cast(x, dtype), _cast(h, dtype)
        transition = cell.transition
        if isinstance(transition, AuxiliaryReflection):
            weight = _cast(transition.weight.detach(), dtype)
            self.transition = ReflectionTransition("transition.weight", weight, self._h)
        else:
            self.transition = matrix_transition("transition.", transition, self._h)
        kernel = _cast(cell.input_kernel.weight.detach(), dtype)
        bias = _cast(cell.bias.detach(), dtype)
        self._z = z = torch.addmm(self.transition.value, self._x, kernel.t())
        if cell.nonlinearity == "modrelu":
            sign = torch.sign(z)
            shifted = torch.abs(z).add_(bias)
            self.bias_slope = sign * (shifted > 0)  # dh'/db = sign(z) 1[|z| + b > 0]
            h_new = self.bias_slope * shifted  # sign(z) relu(|z| + b); NaN stays NaN
            self.slope = self.bias_slope * sign  # dh'/dz: 0 in the dead zone and at z = 0 (as autograd)
        else:
            h_new = torch.tanh(z + bias)
            self.slope = self.bias_slope = 1 - h_new * h_new
        self.h_new = _cast(h_new, h.dtype)
        self._last: tuple | None = None

    # -- dtype plumbing ------------------------------------------------------------------------------------------
    def _in(self, t: torch.Tensor) -> torch.Tensor:
        return _cast(t, self.dtype)

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        return _cast(t, self.h.dtype)

    # -- state side ----------------------------------------------------------------------------------------------
    def state_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return self._out(self.slope * self.transition.jvp(self._in(tangent)))

    def state_jvp_columns(self, tangents: torch.Tensor) -> torch.Tensor:
        return self._out(self.slope[:, :, None] * self.transition.columns(self._in(tangents)))

    # -- the cut vertex z ----------------------------------------------------------------------------------------
    @property
    def preactivation(self) -> torch.Tensor:
        return self._out(self._z)

    def activation_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return self._out(self.slope * self._in(tangent))

    def activation_jacobian(self) -> torch.Tensor:
        return self._out(torch.diag_embed(self.slope))

    def has_post_activation_parameters(self) -> bool:
        return True  # the bias acts after z

    # -- parameter side ------------------------------------------------------------------------------------------
    def _split(self, kind: str, cotangent: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(g, bias)``: the cotangent at ``z`` of the parameters inside ``z`` and the bias block, for ``kind``."""
        c = self._in(cotangent)
        if kind == "parameter":
            g = c * self.slope
            return g, (g if self.bias_slope is self.slope else c * self.bias_slope)
        if kind == "preactivation":
            return c, None
        if kind == "post_activation":
            return None, c * self.bias_slope
        raise ValueError(f"unknown product kind {kind!r}")

    def _blocks(self, kind: str, cotangent: torch.Tensor) -> tuple:
        """``(g, bias, transition)`` of ``c^T J`` for ``kind``: ``transition`` is ``f = -dL/dv`` (the ``W`` block is
        ``-f h^T``) for a reflection, the pulled-back ``{name: (B, *shape)}`` for a matrix map; cached for the
        norm and the accumulation of the same cotangent."""
        if self._last is not None and self._last[0] == kind and self._last[1] is cotangent:
            return self._last[2]
        g, bias = self._split(kind, cotangent)
        through = None
        if g is not None:
            t = self.transition
            through = t.outer_factor(g) if t.factored else t.parameter_vjp(g)
        blocks = (g, bias, through)
        self._last = (kind, cotangent, blocks)
        return blocks

    def vjp_norm(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        """``||c_b^T J||`` per stream from the blocks' norms (``||g x^T|| = ||g|| ||x||``)."""
        g, bias, through = self._blocks(kind, cotangent)
        if g is None:
            return self._out(torch.linalg.vector_norm(bias, dim=1))
        if not self.transition.factored:
            matrix_part = torch.cat([p.flatten(1) for p in through.values()], dim=1)
            parts = [g * self.input_norm[:, None], matrix_part] + ([] if bias is None else [bias])
            return self._out(torch.linalg.vector_norm(torch.cat(parts, dim=1), dim=1))
        # ||g x^T|| = ||g|| ||x|| and ||(dL/dv) h^T|| = ||dL/dv|| ||h||: one norm over the scaled factors
        parts = [g * self.input_norm[:, None], through * self.transition.h_norm[:, None]]
        return self._out(torch.linalg.vector_norm(torch.cat(parts if bias is None else [*parts, bias], 1), dim=1))

    @property
    def input_norm(self) -> torch.Tensor:
        """``(B,)``: ``||x||``."""
        return torch.linalg.vector_norm(self._x, dim=1)

    def vjp_accumulate(self, kind: str, out: torch.Tensor, cotangent: torch.Tensor, scale: torch.Tensor) -> None:
        """``out += scale_b c_b^T J`` in place, block by block (outer products per stream, no ``(B, P)`` temporary)."""
        g, bias, through = self._blocks(kind, cotangent)
        column = _cast(scale, out.dtype)[:, None]
        if bias is not None:
            self.layout.block(out, _BIAS).addcmul_(_cast(bias, out.dtype), column)
        if g is None:
            return
        self.layout.block(out, _INPUT).addcmul_(_cast(g, out.dtype).mul(column)[:, :, None], self.x[:, None, :])
        if self.transition.factored:
            factor = _cast(through, out.dtype).mul(column)[:, :, None]  # the W block is -f h^T
            self.layout.block(out, self.transition.name).addcmul_(factor, self.h[:, None, :], value=-1.0)
            return
        for name, value in through.items():
            block = self.layout.block(out, name)
            block.addcmul_(_cast(value, out.dtype), column.view(-1, *([1] * (block.dim() - 1))))

    def _flat(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        out = self.h.new_zeros(self.h.shape[0], self.layout.size)
        self.vjp_accumulate(kind, out, cotangent, torch.ones_like(self.h[:, 0]))
        return out

    def parameter_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._flat("parameter", cotangent)

    def preactivation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._flat("preactivation", cotangent)

    def post_activation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._flat("post_activation", cotangent)

    def parameter_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        """``J^{h'}_theta n`` per stream: ``s * (dV x + dU h-part) + s_b * db``."""
        n = self._in(tangent)
        blocks = {name: self.layout.block(n, name) for name in self.layout.names}
        dz = torch.einsum("bij,bj->bi", blocks[_INPUT], self._x) + self.transition.parameter_jvp(blocks)
        return self._out(self.slope * dz + self.bias_slope * blocks[_BIAS])

    def parameter_jacobian(self) -> torch.Tensor:
        """``(B, H, P)``: the immediate Jacobian, block by block (RTRL's source term)."""
        batch, hidden = self._h.shape
        eye = torch.eye(hidden, dtype=self._h.dtype, device=self._h.device)
        parts = {
            _BIAS: eye * self.bias_slope[:, :, None],
            _INPUT: (eye * self.slope[:, :, None])[:, :, :, None] * self._x[:, None, None, :],
            **self.transition.parameter_jacobian(self.slope),
        }
        out = self.h.new_empty(batch, hidden, self.layout.size)
        for name, numel in zip(self.layout.names, self.layout.numels, strict=True):
            start = self.layout.offsets[name]
            out[:, :, start : start + numel] = parts[name].reshape(batch, hidden, numel)
        return out


register_closed_form(OrthogonalRNNCell, orthogonal_linearization)
