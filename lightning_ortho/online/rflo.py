"""Random-feedback local online learning (RFLO): Murray 2019, "Local online learning in recurrent networks with
random feedback" (eLife 8:e43299), as presented by Marschall, Cho & Savin 2020 ("A Unified Framework of Online
Learning Algorithms for Training Recurrent Neural Networks", JMLR 21(135), section on RFLO).

RTRL's influence ``M_t = J_t M_{t-1} + I_t`` with the recurrent Jacobian ``J_t = dh_t/dh_{t-1}`` dropped: what is
left is a leaky trace of the immediate influences ``I_t = dh_t/dtheta`` alone, local to each unit's own inputs.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from lightning_ortho._native.factored_traces import FactoredTanhTrace
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator
from lightning_ortho.online.linearization import (
    ParameterLayout,
    StepLinearization,
    factorisation_problem,
    flatten_weight,
    weight_columns,
    weight_rows,
)
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.uoro_fused import fusable_tanh_cell

__all__ = ["RFLO"]


class RFLO(OnlineGradientEstimator):
    """RFLO's eligibility trace (Murray 2019, the learning rule's trace; Marschall, Cho & Savin 2020, RFLO), per stream:

        ``B_t = (1 - 1/tau) B_{t-1} + (1/tau) I_t``,  ``B_0 = 0``,  ``dL_t/dtheta ~ (dL_t/dh_t) B_t``

    with ``I_t = J^{h_t}_{theta_t}`` ``(H, P)`` the cell's immediate influence (the step's own Jacobian with
    ``h_{t-1}`` held fixed). RTRL propagates ``M_{t-1}`` through ``J_t``; RFLO never does, so the estimate is
    **biased by design**: it keeps no credit for how a parameter moved earlier states that still feed the present
    one, except the leak ``1 - 1/tau`` it imposes itself. In exchange each unit's trace reads only its own
    preactivation slope and inputs (local and causal), and a step costs no product with ``J``.

    ``tau = 1`` keeps only ``I_t``: the one-step truncated gradient, equal to ``TruncatedBPTT(cell, k=1)`` for
    every cell (tested, also on cells whose declared factorisation is not their step).
    ``tau > 1`` low-passes the immediate influences with time constant ``tau`` steps (a weighted mean of them, of
    total weight ``1 - (1 - 1/tau)^t``), as Murray's trace does for a network of time constant ``tau``. Scale for
    a leaky cell: Murray and Marschall et al. write the network itself as ``h' = (1 - a) h + a tanh(W x_hat)``
    (``a = 1/tau``) and its trace as ``(1 - a) B + a D (x) x_hat`` (``D = diag(tanh')``), which is that cell's
    ``(1 - a) B + I_t``; given that leaky cell, this class's trace is ``a`` times theirs (the same direction, a
    constant a learning rate absorbs; tested).

    Murray's rule also replaces the readout's transpose that carries the output error back to the units by a
    fixed random feedback matrix. Here the caller gives ``grad_h = dL_t/dh_t`` to :meth:`gradient`, so that
    choice is the caller's: pass ``W_out^T e_t`` for the trace part alone, or ``B_fb e_t`` with a fixed random
    ``B_fb`` ``(H, outputs)`` for Murray's full rule (feedback alignment).

    Two ways to hold the trace, the same estimate:

    * factored (``O(H n_a)`` memory and time per stream, ``O(P)``): for a cell with ``z = W a``, ``h' = sigma(z)``
      element-wise (it offers ``preactivation_input(x, h) -> a`` ``(B, n_a)``, ``preactivation``, ``activation``
      and ``preactivation_weights`` naming every parameter, laid side by side as ``W`` ``(H, n_a)``, a vector
      parameter being one column), ``I_t = diag(d_t) (a_t^T (x) I)`` with ``d_t = sigma'(z_t)``, so entry
      ``(i, (i, j))`` is all ``B_t`` holds: ``E_t = (1 - 1/tau) E_{t-1} + (1/tau) d_t a_t^T`` ``(H, n_a)`` and
      ``dL_t/dW ~ diag(g_t) E_t``. :class:`~lightning_ortho.online.TanhRNNCell` takes this path. The factorisation
      is checked once, at random points, to be the cell's ``forward`` with an element-wise activation
      (:func:`~lightning_ortho.online.linearization.factorisation_problem`, all its parts): a cell whose ``forward``
      is something else (a subclass that overrides it, a parametrised cell) takes the dense trace, which is the
      same rule on the step the cell really takes.
    * dense (any cell; ``O(H P)`` memory per stream): ``B_t`` ``(H, P)`` from the step's
      :meth:`~lightning_ortho.online.linearization.StepLinearization.parameter_jacobian` (closed form where the
      cell has one, else ``torch.func``); a step costs that Jacobian, no ``J M`` product (RTRL's ``O(H^2 P)``).

    State entry: ``trace`` ``(B, H, n_a)`` (factored) or ``(B, H, P)`` (dense); :attr:`factored` says which.

    Args:
        cell: the recurrent cell (see :mod:`lightning_ortho.online.cells`).
        tau: the trace's time constant in steps, a finite number ``>= 1`` (the decay ``1 - 1/tau`` in ``[0, 1)``).
        closed_form: use the cell's closed-form Jacobian products and the factored trace when it has them;
            ``False`` forces ``torch.func`` and the dense trace (tests compare the two).

    Raises:
        ValueError: ``tau`` is not a finite real number ``>= 1``. At a step: ``preactivation_input`` does not
            return ``(B, n_a)`` (factored path). The other errors: see
            :class:`~lightning_ortho.online.OnlineGradientEstimator`.
    """

    name = "rflo"

    def __init__(self, cell: nn.Module, *, tau: float, closed_form: bool = True) -> None:
        if (
            isinstance(tau, bool)
            or not isinstance(tau, numbers.Real)
            or not math.isfinite(float(tau))
            or float(tau) < 1
        ):
            raise ValueError(
                f"RFLO: tau must be a finite number >= 1 (the trace's time constant in steps: its decay 1 - 1/tau"
                f" must lie in [0, 1)), got {tau!r}; tau=1 keeps only the immediate influence."
            )
        super().__init__(cell, closed_form=closed_form)
        self.tau = float(tau)
        self.decay = 1.0 - 1.0 / self.tau
        self.rate = 1.0 / self.tau
        #: ``[(name, columns, is_vector)]`` of ``W`` when the trace is factored, else ``None``.
        self.weight_columns = _elementwise_factorisation(cell, self.hidden_size) if closed_form else None
        self.inputs = None if self.weight_columns is None else sum(c for _, c, _ in self.weight_columns)  # n_a
        #: the fused step and estimate (one C call each: :meth:`_advance_step`) on a plain tanh cell, else ``None``
        self._fused = FactoredTanhTrace(cell) if _fuses_factored_trace(cell, self.layout, self.weight_columns) else None

    @property
    def factored(self) -> bool:
        """Whether the trace is held as ``(B, H, n_a)`` (``z = W a`` with an element-wise activation)."""
        return self.weight_columns is not None

    # -- the estimator's hooks ------------------------------------------------------------------------------
    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        columns = self.inputs if self.factored else self.layout.size
        return {"trace": h0.new_zeros(h0.shape[0], h0.shape[1], columns)}

    def _fused_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """The cell's step and the factored trace's update in one C call on a plain
        :class:`~lightning_ortho.online.TanhRNNCell`
        (:meth:`~lightning_ortho._native.factored_traces.FactoredTanhTrace.step`, which also sums ``x``, ``h'`` and
        the new trace for the NaN/inf verdict) where the tensors allow it (see
        :meth:`OnlineGradientEstimator._fused_step`); else ``None``: the cell's linearisation and :meth:`_advance`."""
        fused = self._fused
        if fused is not None:
            done = fused.step(x, state.h, state.tensors["trace"], False, self.decay, self.rate)
            if done is not None:
                return Advance(done[0], {"trace": done[1]}, None, done[2])
        return None

    def _fused_gradient(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[dict[str, torch.Tensor], float] | None:
        """The summed estimate in one C call where :meth:`_fused_step` may fuse (its verdict: the sum of ``grad_h``
        and the estimate); else ``None``: :meth:`_gradient_summed`."""
        fused = self._fused
        return None if fused is None else fused.gradient(state.h, state.tensors["trace"], grad_h)

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        trace = state.tensors["trace"]
        if not self.factored:
            return {"trace": torch.add(trace * self.decay, lin.parameter_jacobian(), alpha=self.rate)}
        inputs = self.cell.preactivation_input(x, state.h).detach()  # a_t (B, n_a)
        if inputs.shape != (x.shape[0], self.inputs):
            raise ValueError(
                f"RFLO: {type(self.cell).__name__}.preactivation_input returned shape {tuple(inputs.shape)}, but its"
                f" preactivation_weights {[n for n, _, _ in self.weight_columns]} have {self.inputs} columns side by"
                f" side: W a needs ({x.shape[0]}, {self.inputs}); make the two agree."
            )
        slope = lin.activation_jvp(torch.ones_like(lin.h_new))  # d_t = sigma'(z_t) (B, H): the diagonal of dh/dz
        decayed = trace * self.decay
        return {"trace": decayed.addcmul_((self.rate * slope)[:, :, None], inputs[:, None, :])}

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        trace = state.tensors["trace"]
        if not self.factored:
            return torch.einsum("bh,bhp->bp", grad_h, trace)
        return flatten_weight(self.layout, self.weight_columns, grad_h[:, :, None] * trace, lead=1)  # diag(g_t) E_t

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        trace = state.tensors["trace"]
        if not self.factored:
            return torch.einsum("bh,bhp->p", grad_h, trace)
        return flatten_weight(self.layout, self.weight_columns, torch.einsum("bh,bha->ha", grad_h, trace), lead=0)


def _fuses_factored_trace(
    cell: nn.Module, layout: ParameterLayout, weight_columns: list[tuple[str, int, bool]] | None
) -> bool:
    """Whether ``cell`` is a plain :class:`~lightning_ortho.online.TanhRNNCell`
    (:func:`~lightning_ortho.online.uoro_fused.fusable_tanh_cell`) whose factored trace is laid out as ``[W_h W_x
    b]`` (``weight_columns``), so that :class:`~lightning_ortho._native.factored_traces.FactoredTanhTrace`
    computes its step."""
    if weight_columns is None or not fusable_tanh_cell(cell, layout):
        return False
    return weight_columns == [
        ("weight_hh", cell.hidden_size, False),
        ("weight_ih", cell.input_size, False),
        ("bias", 1, True),
    ]


def _elementwise_factorisation(cell: nn.Module, hidden: int | None) -> list[tuple[str, int, bool]] | None:
    """``[(name, columns, is_vector)]`` of ``W`` in ``preactivation_weights`` order when ``cell``'s step is checked
    to be ``h' = sigma(W a)`` with every parameter in ``W``, ``H`` rows and ``sigma`` element-wise and free of
    parameters (:func:`~lightning_ortho.online.linearization.factorisation_problem`); ``None`` (the dense trace)
    otherwise."""
    if hidden is None or factorisation_problem(cell, ("step", "complete", "elementwise")) is not None:
        return None
    if weight_rows(cell) != hidden:
        return None
    return weight_columns(cell)
