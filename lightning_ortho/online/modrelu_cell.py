"""The modReLU recurrent cell (Arjovsky et al. 2016, real case) with closed-form Jacobian products."""

from __future__ import annotations

import math

import torch
from torch import nn

from lightning_ortho.nn.activations import modrelu
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, _cell_parameters, steps_as


class ModReLURNNCell(nn.Module):
    """``h' = modReLU(W_h h + W_x x; b) = sign(z) relu(|z| + b)`` with ``z = W_h h + W_x x``.

    Parameters ``weight_hh`` ``(H, H)`` (orthogonal initialisation), ``weight_ih`` ``(H, I)`` (Kaiming normal, as
    expRNN), ``bias`` ``(H,)`` (the threshold, ``U(-0.01, 0.01)``). The bias acts after the preactivation, so
    UORO's ``projection="preactivation"`` projects its influence at ``h`` (still unbiased) and
    ``projection="none"`` refuses the cell. Its closed-form :meth:`linearize` replaces ``torch.func``: with
    ``on = 1[|z| + b > 0]``, ``J^{h'}_z = diag(on)``, ``J^{h'}_b = diag(sign(z) on)`` (``z = 0`` has measure zero).
    For an orthogonal ``W_h`` kept orthogonal during training use ``lightning_ortho.nn.OrthogonalRNNCell``
    (generic path).

    Shapes: ``x`` ``(B, input_size)``, ``h`` ``(B, hidden_size)`` -> ``(B, hidden_size)``.

    Args:
        input_size: ``I``, features of ``x``.
        hidden_size: ``H``, units of ``h``.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModReLURNNCell: {name} must be a positive integer, got {value!r}.")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_hh = nn.Parameter(nn.init.orthogonal_(torch.empty(hidden_size, hidden_size)))
        self.weight_ih = nn.Parameter(
            torch.randn(hidden_size, input_size) * math.sqrt(2.0 / input_size)  # Kaiming normal (fan_in, relu)
        )
        self.bias = nn.Parameter(torch.empty(hidden_size).uniform_(-0.01, 0.01))

    def preactivation(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``z = W_h h + W_x x``: ``(B, I), (B, H) -> (B, H)`` (no bias: the threshold acts in :meth:`activation`).

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.
        """
        return h @ self.weight_hh.T + x @ self.weight_ih.T

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        """``h' = sign(z) relu(|z| + b)`` elementwise, with the parameter ``bias`` as ``b``.

        Args:
            z: ``(B, H)`` preactivations.
        """
        return modrelu(z, self.bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step ``h' = modReLU(W_h h + W_x x; b)``: ``activation(preactivation(x, h))``.

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.

        Returns:
            ``(B, hidden_size)``, the new states.
        """
        return self.activation(self.preactivation(x, h))

    def linearize(self, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None) -> StepLinearization:
        """The step at ``(x, h)`` with its closed-form Jacobian products (see the class docstring), for the
        estimators.

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.
            layout: the cell's :class:`~lightning_ortho.online.ParameterLayout` (built here when ``None``).

        Returns:
            The step, a :class:`~lightning_ortho.online.StepLinearization` whose products (state, parameter,
                activation, preactivation) are closed forms in ``on = 1[|z| + b > 0]``, with ``h_new`` the new
                states; the generic ``torch.func`` products for a subclass that overrides ``forward``,
                ``preactivation`` or ``activation``, or a parametrised cell (the closed forms would not be its).
        """
        layout = layout if layout is not None else ParameterLayout(self)
        if not steps_as(self, ModReLURNNCell, layout):
            return StepLinearization(self, x, h, layout)
        return ModReLUStepLinearization(self, x, h, layout)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


class ModReLUStepLinearization(StepLinearization):
    """Closed-form products of :class:`ModReLURNNCell` (per stream, as :class:`StepLinearization`)."""

    def __init__(self, cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None):
        self.cell, self.x, self.h = cell, x, h
        self.layout = layout if layout is not None else ParameterLayout(cell)
        self.params = p = _cell_parameters(cell)
        self._z = h @ p["weight_hh"].T + x @ p["weight_ih"].T
        shifted = torch.abs(self._z) + p["bias"]
        self.on = (shifted > 0).to(h.dtype)  # dh'/dz
        self.bias_slope = torch.sign(self._z) * self.on  # dh'/db
        self.h_new = torch.sign(self._z) * torch.relu(shifted)
        self.input_norm_sq = h.square().sum(1) + x.square().sum(1)  # ||[h; x]||^2

    def _flat(self, weight_factor: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        """``(B, P)`` with the weight blocks ``g [h; x]^T`` for ``g = weight_factor`` and the bias block ``bias``."""
        batch, hidden = self.h.shape
        zeros = self.h.new_zeros(batch, hidden)
        g = zeros if weight_factor is None else weight_factor
        parts = {
            "weight_hh": g[:, :, None] * self.h[:, None, :],
            "weight_ih": g[:, :, None] * self.x[:, None, :],
            "bias": zeros if bias is None else bias,
        }
        return self.layout.flatten(parts, lead=1)

    def state_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return self.on * (tangent @ self.params["weight_hh"].T)

    def state_jvp_columns(self, tangents: torch.Tensor) -> torch.Tensor:
        return self.on[:, :, None] * torch.matmul(self.params["weight_hh"], tangents)

    def parameter_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._flat(cotangent * self.on, cotangent * self.bias_slope)

    def parameter_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        p = self.layout.unflatten(tangent)
        dz = torch.einsum("bij,bj->bi", p["weight_hh"], self.h) + torch.einsum("bij,bj->bi", p["weight_ih"], self.x)
        return self.on * dz + self.bias_slope * p["bias"]

    def parameter_jacobian(self) -> torch.Tensor:
        eye = torch.eye(self.h.shape[1], dtype=self.h.dtype, device=self.h.device)
        scaled = eye[None] * self.on[:, :, None]
        parts = {
            "weight_hh": scaled[:, :, :, None] * self.h[:, None, None, :],
            "weight_ih": scaled[:, :, :, None] * self.x[:, None, None, :],
            "bias": eye[None] * self.bias_slope[:, :, None],
        }
        return self.layout.flatten(parts, lead=2)

    def activation_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return self.on * tangent

    def activation_jacobian(self) -> torch.Tensor:
        return torch.diag_embed(self.on)

    def preactivation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._flat(cotangent, None)

    def post_activation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._flat(None, cotangent * self.bias_slope)

    def has_post_activation_parameters(self) -> bool:
        return True

    def vjp_norm(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        weight, bias = self._split(kind, cotangent)
        total = torch.zeros_like(self.input_norm_sq)
        if weight is not None:
            total = total + weight.square().sum(1) * self.input_norm_sq  # ||g [h; x]^T||_F^2
        if bias is not None:
            total = total + bias.square().sum(1)
        return total.sqrt()

    def vjp_accumulate(self, kind: str, out: torch.Tensor, cotangent: torch.Tensor, scale: torch.Tensor) -> None:
        weight, bias = self._split(kind, cotangent)
        if weight is not None:
            g = weight * scale[:, None]
            self.layout.block(out, "weight_hh").addcmul_(g[:, :, None], self.h[:, None, :])
            self.layout.block(out, "weight_ih").addcmul_(g[:, :, None], self.x[:, None, :])
        if bias is not None:
            self.layout.block(out, "bias").addcmul_(bias, scale[:, None])

    def _split(self, kind: str, c: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The weight factor ``g`` and the bias block of ``c^T J`` for the parameters, preactivation or post part."""
        if kind == "parameter":
            return c * self.on, c * self.bias_slope
        if kind == "preactivation":
            return c, None
        if kind == "post_activation":
            return None, c * self.bias_slope
        raise ValueError(f"unknown product kind {kind!r}")
