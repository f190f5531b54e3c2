"""Recurrent cells for online training: ``cell(x, h) -> h_new``, every parameter inside the module.

Any ``nn.Module`` with that call and its parameters inside works with every estimator of this package
(Jacobian products go through ``torch.func`` on ``functional_call``). A cell can offer more:

* ``preactivation(x, h) -> z`` and ``activation(z) -> h_new`` with ``forward = activation o preactivation``:
  the cut vertex of UORO's ``projection="preactivation"`` (Cooijmans & Martens 2019). Parameters used by ``activation``
  (a bias added after ``z``, modReLU's threshold) do not pass through ``z``: the estimator projects their
  influence in state space (their cut vertex is ``h`` itself), which keeps the estimate unbiased.
* ``preactivation_input(x, h) -> a`` with ``z = W a`` and ``W`` the parameters named in
  ``preactivation_weights`` laid side by side (a vector parameter is one column): the factorisation
  ``J^z_W = I (x) a^T`` that UORO's ``projection="none"`` and the oracle (:mod:`lightning_ortho.online.oracle`) need.
* ``linearize(x, h)`` returning a closed-form :class:`~lightning_ortho.online.linearization.StepLinearization`:
  the fast path (:class:`TanhRNNCell` has one; tests compare it with the generic path).

These factorisations are checked, not trusted: every path that uses one first checks, once per cell at random
points, that it holds of the cell's ``forward`` (:func:`~lightning_ortho.online.linearization.factorisation_problem`).
A cell where it does not (a subclass whose ``forward`` is ``0.5 * h + 0.5 * super().forward(x, h)``; for ``z = W a``
also a subclass that overrides ``preactivation`` alone, or a parametrised cell, whose ``W`` is no parameter) gets the
generic products of its ``forward`` where the estimator has them (RTRL, UORO at the state or the parameters, RFLO's
dense trace, SnAp, truncated BPTT) and is refused with the reason where the estimator is the factorisation (UORO's
``projection="preactivation"``/``"none"``, KF-RTRL). Closed forms apply only to the class they were written for
(:func:`~lightning_ortho.online.linearization.steps_as`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lightning_ortho._native.tanh_cell import TanhCellForward
from lightning_ortho.online.linearization import (
    LinearStepLinearization,
    ParameterLayout,
    StepLinearization,
    TanhStepLinearization,
    steps_as,
)

_grad_enabled, _compiling = torch.is_grad_enabled, torch.compiler.is_compiling


def _check_sizes(cell: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{cell}: {name} must be a positive integer, got {value!r}.")


class TanhRNNCell(nn.Module):
    """The vanilla RNN of Cooijmans & Martens 2019: ``h' = tanh(W_h h + W_x x + b)``.

    Parameters ``weight_hh`` ``(H, H)``, ``weight_ih`` ``(H, I)``, ``bias`` ``(H,)``; initialised as
    ``torch.nn.RNNCell`` does (``U(-1/sqrt(H), 1/sqrt(H))``). ``preactivation_input`` is ``a = [h; x; 1]``, so
    ``z = [W_h W_x b] a``. Its closed-form :meth:`linearize` costs one ``(B, H) x (H, H)`` product per
    Jacobian-vector product instead of a ``torch.func`` transform.

    Shapes: ``x`` ``(B, input_size)``, ``h`` ``(B, hidden_size)`` -> ``(B, hidden_size)``.

    Args:
        input_size: ``I``, features of ``x``.
        hidden_size: ``H``, units of ``h``.
    """

    preactivation_weights = ("weight_hh", "weight_ih", "bias")

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # the one C call computes tanh(W_h h + W_x x + b): not what a subclass with its own pieces steps
        cls._plain_step = cls.preactivation is TanhRNNCell.preactivation and cls.activation is TanhRNNCell.activation
        # a call is the C call only where it would run this class's forward (a subclass's own forward runs)
        cls._call_in_c = cls._plain_step and cls.forward is TanhRNNCell.forward

    _plain_step = True
    _call_in_c = True
    #: the cell's one-call forward (:class:`~lightning_ortho._native.tanh_cell.TanhCellForward`), made at the first
    #: call that may use it
    _fused_forward: TanhCellForward | None = None

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        _check_sizes("TanhRNNCell", input_size=input_size, hidden_size=hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        bound = 1.0 / math.sqrt(hidden_size)
        self.weight_hh = nn.Parameter(torch.empty(hidden_size, hidden_size).uniform_(-bound, bound))
        self.weight_ih = nn.Parameter(torch.empty(hidden_size, input_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(hidden_size).uniform_(-bound, bound))

    def preactivation(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``z = W_h h + W_x x + b``: ``(B, I), (B, H) -> (B, H)`` (the bias is inside the preactivation).

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.
        """
        return torch.addmm(self.bias, h, self.weight_hh.T) + x @ self.weight_ih.T

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        """``h' = tanh(z)``, elementwise (no parameters).

        Args:
            z: ``(B, H)`` preactivations.
        """
        return torch.tanh(z)

    def preactivation_input(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``a = [h; x; 1]``, ``(B, H + I + 1)``, so that ``z = [W_h W_x b] a`` (the factor ``J^z_W = I (x) a^T``).

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.
        """
        return torch.cat([h, x, h.new_ones(h.shape[0], 1)], dim=1)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.__call__``. At one stream nn.Module's call (two Python frames and the hooks' checks) costs a
        microsecond, a quarter of the step: where the call would only run :meth:`forward` and forward would be its
        one C call with ``h`` the last output, the whole call is that C call
        (:attr:`~lightning_ortho._native.tanh_cell.TanhCellForward.call`, which checks the hooks, autograd and the
        rest); anything else, or while compiling (the compiler traces nn.Module's call), is nn.Module's call."""
        fused = self._fused_forward
        if fused is not None and not kwargs and self._call_in_c and not _compiling():
            call = fused.call
            if call is not None:
                h_new = call(self, args)
                if h_new is not None:
                    return h_new
        return super().__call__(*args, **kwargs)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step ``h' = tanh(W_h h + W_x x + b)``: ``activation(preactivation(x, h))``.

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.

        Returns:
            ``(B, hidden_size)``, the new states.

        Outside autograd, at small sizes on plain CPU tensors, the step is one C call
        (:class:`~lightning_ortho._native.tanh_cell.TanhCellForward`: the same expression to rounding); a subclass that
        overrides ``preactivation`` or ``activation`` keeps them.
        """
        if self._plain_step and not _grad_enabled() and not _compiling():
            fused = self._fused_forward
            if fused is None:  # made at the first call (a cell unpickled from an older version has none either)
                fused = self._fused_forward = TanhCellForward()
            parameters = self._parameters  # (nn.Module's __getattr__ costs a microsecond a name)
            fast = fused.fast  # the common case in C: h the last output, nothing else changed
            h_new = fast(parameters, x, h) if fast is not None else None
            if h_new is None:
                h_new = fused(parameters, x, h)
            if h_new is not None:
                return h_new
        return self.activation(self.preactivation(x, h))

    def linearize(self, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None) -> StepLinearization:
        """The closed form, or the generic ``torch.func`` path for a subclass whose step is no longer
        ``tanh(W_h h + W_x x + b)`` (it overrides ``forward``, ``preactivation`` or ``activation``)."""
        layout = layout if layout is not None else ParameterLayout(self)
        if not plain_tanh_step(self, layout):
            return StepLinearization(self, x, h, layout)
        return TanhStepLinearization(self, x, h, layout)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


def plain_tanh_step(cell: nn.Module, layout: ParameterLayout) -> bool:
    """Whether ``cell`` steps exactly as :class:`TanhRNNCell` does, ``tanh(W_h h + W_x x + b)`` on its three plain
    parameters: the class or a subclass that overrides none of ``forward``, ``preactivation``, ``activation``
    (and no parametrisation renames the parameters), so its closed forms apply."""
    return steps_as(cell, TanhRNNCell, layout)


class GRUCell(nn.Module):
    """A gated recurrent unit (Cho et al. 2014, torch's convention) written from ``addmm``, ``sigmoid``, ``tanh``:

    ``r = s(W_ir x + b_ir + W_hr h + b_hr)``, ``u = s(W_iu x + b_iu + W_hu h + b_hu)``,
    ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = (1 - u) * n + u * h``.

    Same parameter layout and initialisation as ``torch.nn.GRUCell`` (``weight_ih`` ``(3H, I)``, ``weight_hh``
    ``(3H, H)``, biases ``(3H,)``, gates in the order r, u, n), so its outputs equal torch's for the same
    weights (tested). It has no single preactivation (the state enters three gates), so UORO projects in state
    or parameter space; its Jacobian products are closed forms
    (:class:`~lightning_ortho.online.gru_linearization.GRUStepLinearization`; a subclass takes ``torch.func``).

    Shapes: ``x`` ``(B, input_size)``, ``h`` ``(B, hidden_size)`` -> ``(B, hidden_size)``.

    Args:
        input_size: ``I``, features of ``x``.
        hidden_size: ``H``, units of ``h``.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        _check_sizes("GRUCell", input_size=input_size, hidden_size=hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        bound = 1.0 / math.sqrt(hidden_size)
        self.weight_ih = nn.Parameter(torch.empty(3 * hidden_size, input_size).uniform_(-bound, bound))
        self.weight_hh = nn.Parameter(torch.empty(3 * hidden_size, hidden_size).uniform_(-bound, bound))
        self.bias_ih = nn.Parameter(torch.empty(3 * hidden_size).uniform_(-bound, bound))
        self.bias_hh = nn.Parameter(torch.empty(3 * hidden_size).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step ``h' = (1 - u) * n + u * h`` with the gates of the class docstring (as ``torch.nn.GRUCell``).

        Args:
            x: ``(B, input_size)`` inputs.
            h: ``(B, hidden_size)`` previous states.

        Returns:
            ``(B, hidden_size)``, the new states.
        """
        gates_x = torch.addmm(self.bias_ih, x, self.weight_ih.T)
        gates_h = torch.addmm(self.bias_hh, h, self.weight_hh.T)
        rx, ux, nx = gates_x.chunk(3, dim=1)
        rh, uh, nh = gates_h.chunk(3, dim=1)
        reset = torch.sigmoid(rx + rh)
        update = torch.sigmoid(ux + uh)
        candidate = torch.tanh(nx + reset * nh)
        return (1 - update) * candidate + update * h

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


class InfluenceBalancingCell(nn.Module):
    """Tallec & Ollivier's influence-balancing model (UORO paper, section 6): ``h' = A h + theta c``.

    ``A = 0.5 (I + S)`` with ``S`` the superdiagonal of ones, so unit ``i`` reads unit ``i + 1`` and the first
    unit feels unit ``k`` after ``k`` steps; ``c`` is ``+1`` on the first ``positive`` units and ``-1`` on the
    rest; ``theta`` is one scalar parameter (initial value ``theta``). The fixed point's first unit is
    ``2 theta (2 positive - units)``: with the defaults (23 units, 10 positive) the nearby, fast influences of
    ``theta`` on the first unit are positive and the total influence is negative, so a truncated gradient that
    sees only the last few steps has the wrong sign and diverges. The input is ignored (the estimators still check
    that it is ``(B, input_size)``).

    Shapes: ``x`` ``(B, I)``, ``h`` ``(B, units)`` -> ``(B, units)``.

    Args:
        units: size of the state.
        positive: units that ``theta`` enters positively (the first ones; ``0 <= positive <= units``).
        theta: initial value of the parameter ``theta``.
        input_size: ``I``, features of the (ignored) input.
    """

    def __init__(self, units: int = 23, positive: int = 10, theta: float = 0.0, input_size: int = 1) -> None:
        super().__init__()
        _check_sizes("InfluenceBalancingCell", units=units, input_size=input_size)
        if not isinstance(positive, int) or not 0 <= positive <= units:
            raise ValueError(
                f"InfluenceBalancingCell: positive must be an int in [0, units={units}], got {positive!r}."
            )
        self.input_size, self.hidden_size, self.positive = input_size, units, positive
        self.theta = nn.Parameter(torch.tensor(float(theta)))
        transition = 0.5 * (torch.eye(units) + torch.diag(torch.ones(units - 1), 1))
        signs = torch.cat([torch.ones(positive), -torch.ones(units - positive)])
        self.register_buffer("transition", transition)
        self.register_buffer("signs", signs)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step ``h' = A h + theta c``; ``x`` is not read.

        Args:
            x: ``(B, input_size)`` inputs (ignored).
            h: ``(B, units)`` previous states.

        Returns:
            ``(B, units)``, the new states.
        """
        return h @ self.transition.T + self.theta * self.signs

    def linearize(self, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None) -> StepLinearization:
        """Closed-form products (the generic ``torch.func`` path costs far more than this tiny linear map itself), or
        the generic ones for a subclass that overrides ``forward`` or a parametrised cell (:func:`steps_as`)."""
        layout = layout if layout is not None else ParameterLayout(self)
        if not steps_as(self, InfluenceBalancingCell, layout, ("theta",), ("forward",)):
            return StepLinearization(self, x, h, layout)
        return LinearStepLinearization(self, x, h, layout)

    def extra_repr(self) -> str:
        return f"units={self.hidden_size}, positive={self.positive}"
