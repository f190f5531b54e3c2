"""Unbiased Online Recurrent Optimization (Tallec & Ollivier 2017) with the variance reductions of Cooijmans &
Martens 2019 ("On the Variance of Unbiased Online Recurrent Optimization"): a cut vertex of choice (their
generalised spatial projection), greedy iterative rescaling (GIR) or their fixed ``Q_t = alpha_t Q0`` recursion,
and their preactivation estimator that avoids the spatial projection.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from lightning_ortho._native.guard import real_cpu
from lightning_ortho._native.uoro import SummedEstimate, uoro_gradient_kernel
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator, _sum_dtype
from lightning_ortho.online.linearization import (
    StepLinearization,
    factorisation_problem,
    flatten_weight,
    weight_columns,
)
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.stream_noise import StreamNoise, check_eps, check_generator
from lightning_ortho.online.uoro_fused import NOTHING_MADE, FusedStep, OneCallStep, fused_step_for
from lightning_ortho.online.uoro_rescaling import Alpha, FixedRescaling, alpha_at, check_alpha, prepare_q0

__all__ = ["PROJECTIONS", "UORO", "Alpha", "FixedRescaling", "FusedStep", "Projection"]

Projection = Literal["state", "preactivation", "parameter", "none"]
PROJECTIONS: tuple[str, ...] = Projection.__args__  # type: ignore[attr-defined]

_ESTIMATE_TENSORS = ("h_tilde", "w_tilde", "a_tilde")
#: Draw buffers kept per estimator (one per thread and shape; emptied when more are asked for).
_DRAW_BUFFERS = 8
#: The methods of a step whose override (a subclass's own step or noise) keeps the one-call step from running.
_STEP_METHODS = ("_advance_step", "_noise", "_noise_bits", "_draw", "_draw_bits")


class UORO(StreamNoise, OnlineGradientEstimator):
    """UORO: a rank-one, unbiased, online estimate of the influence ``J^{h_t}_theta ~ h_tilde_t w_tilde_t^T``.

    Each step draws ``u_t = tau_t nu_t`` (``nu ~ N(0, I)`` at the cut vertex ``z_t``, ``tau = +-1``) and updates
    (greedy iterative rescaling, Cooijmans & Martens 2019)::

        h_tilde_t = gamma_t J^{h_t}_{h_{t-1}} h_tilde_{t-1} + beta_t J^{h_t}_{z_t} u_t
        w_tilde_t = w_tilde_{t-1} / gamma_t + (u_t^T J^{z_t}_{theta_t}) / beta_t

    or, with their fixed rescaling (unbiased because ``Q`` does not depend on ``u``)::

        h_tilde_t = J^{h_t}_{h_{t-1}} h_tilde_{t-1} + J^{h_t}_{z_t} alpha_t Q0 u_t
        w_tilde_t = w_tilde_{t-1} + (u_t^T Q0^{-1} J^{z_t}_{theta_t}) / alpha_t

    and estimates ``dL_t/dtheta ~ (dL_t/dh_t . h_tilde_t) w_tilde_t`` (the paper's estimator). Time is a few
    Jacobian-vector products per step and memory ``O(H + P)`` per stream, constant in the sequence length.

    Args:
        cell: the recurrent cell (:mod:`lightning_ortho.online.cells`).
        projection: the cut vertex ``z`` of the spatial projection:

            * ``"state"``: ``z = h`` (Tallec & Ollivier's UORO), ``nu`` has ``H`` entries;
            * ``"preactivation"``: ``z = cell.preactivation(x, h)`` with ``h' = cell.activation(z)`` (checked to be
              the cell's ``forward`` at random points, once per cell: :meth:`cell_problem`); parameters
              that ``activation`` reads (a bias after ``z``) do not pass through ``z``, so their influence is
              projected at ``h`` with its own noise (the cut is ``{z, h}``, still unbiased);
            * ``"parameter"``: ``z = theta``, ``nu`` has ``P`` entries (``J^h_theta nu`` is one forward-mode product);
            * ``"none"``: no spatial noise (Cooijmans & Martens's estimator that avoids the spatial projection):
              ``H_tilde`` ``(H, Z)`` and ``a_tilde`` ``(A,)`` for a cell with ``z = W a``
              (``cell.preactivation_input`` and ``cell.preactivation_weights`` covering every parameter, checked as
              for ``"preactivation"``);
              ``O(H^3)`` per step, the lowest variance.
        rescaling: ``"gir"`` (greedy iterative rescaling, gamma and beta with ``eps``) or
            ``(alpha, Q0)``: ``alpha`` a positive constant, per-step sequence or function of ``t``; ``Q0`` an
            invertible ``(Z, Z)`` matrix at the cut vertex (``None`` = identity; must be ``None`` for "none").
            :mod:`lightning_ortho.online.oracle` computes the oracle ``Q0 = B^{-1/4}`` and optimal ``alpha``.
        generator: the noise source: a seed (each :meth:`initial_state` starts a generator from it), a
            ``torch.Generator`` (used as is), or ``None`` (a seed drawn from torch's global generator, so
            ``seed_everything`` fixes it). The generator lives in the state and its ``state_dict``.
        eps: added to the norms in gamma and beta: positive and finite (at ``t = 1``, where ``w_tilde = 0``,
            gamma is ``sqrt(eps / eps)``; ``eps = 0`` would make it ``0 / 0``).
        closed_form: use the cell's closed-form Jacobian products when it has them.
        fused: on a :class:`~lightning_ortho.online.TanhRNNCell` with projection ``"state"`` or
            ``"preactivation"``, or a :class:`~lightning_ortho.nn.OrthogonalRNNCell` with ``"state"`` (and
            ``closed_form``), run the whole step as one fused sequence of calls
            (:mod:`~lightning_ortho.online.uoro_fused`, :mod:`~lightning_ortho.online.orthogonal_uoro`: the
            same estimate to float rounding, several times less overhead per step; with GIR, except where the step
            is one C call (below), it updates the state's ``w_tilde`` in place, so keep a copy of a step's
            ``w_tilde`` that you want to look at later); ``False`` keeps the step on the cell's closed-form
            linearisation.

    On the CPU (float32, float64) the summed estimate is one C pass over ``w_tilde`` that writes each parameter's
    estimate into a tensor of its own (:meth:`_fused_gradient`); the fused tanh step with GIR is one C call at small
    sizes (the cell's step and ``W_h h_tilde`` included, ``w_tilde'`` a new tensor:
    :data:`~lightning_ortho.online.uoro_fused.ONE_CALL_MAX_BYTES`; :meth:`_fused_step`), both tried before the
    template's checks, which they imply, and above those sizes PyTorch's GEMMs and two C row passes
    (:mod:`lightning_ortho._native.uoro`; the same expressions);
    :func:`lightning_ortho._native.native_kernels` ``(False)`` or ``LIGHTNING_ORTHO_NATIVE=0`` keeps them in
    PyTorch ops (as does ``torch.compile``, whose graph they could not enter).

    The noise is drawn in one place (:meth:`_noise`, or :meth:`_noise_bits` for the one-call step: the same
    generator calls, from the state's generator: :mod:`~lightning_ortho.online.stream_noise`); under
    ``torch.compile`` wrap the compiled calls in
    ``with estimator.noise_scope(state):`` to draw the state's own numbers (see that module).

    Raises:
        ValueError: an unknown projection, a cell that lacks what the projection needs or whose ``forward`` is
            not the factorisation the projection uses (the message names the estimators and projections that can
            train it), a ``Q0`` of the wrong shape, not finite or not invertible, a non-positive ``alpha``, an
            ``eps`` that is not a positive finite number.
    """

    name = "uoro"

    def __init__(
        self,
        cell: nn.Module,
        *,
        projection: Projection = "state",
        rescaling: Literal["gir"] | FixedRescaling = "gir",
        generator: int | torch.Generator | None = None,
        eps: float = 1e-7,
        closed_form: bool = True,
        fused: bool = True,
    ) -> None:
        super().__init__(cell, closed_form=closed_form)
        if projection not in PROJECTIONS:
            raise ValueError(f"UORO: projection must be one of {PROJECTIONS}, got {projection!r}.")
        self.projection, self.eps = projection, check_eps(eps, "UORO")
        self.generator = check_generator(generator, "UORO")
        self._require_cell(projection=projection)
        if projection == "none":
            self._weight_columns = self._check_linear_preactivation(cell)
        self.gir = isinstance(rescaling, str)
        if self.gir:
            if rescaling != "gir":
                raise ValueError(f"UORO: rescaling must be 'gir' or a pair (alpha, Q0), got {rescaling!r}.")
        else:
            if not (isinstance(rescaling, (tuple, list)) and len(rescaling) == 2):
                raise ValueError(f"UORO: a fixed rescaling is a pair (alpha, Q0), got {rescaling!r}.")
            self.alpha, q0 = rescaling
            check_alpha(self.alpha)
            self.q0, self.q0_inverse_t = prepare_q0(q0, projection)
        # the fused step for this cell and cut (uoro_fused.FusedStep), or None: the cell's linearisation
        self._fused: FusedStep | None = (
            fused_step_for(cell, projection, self.layout, self.eps) if fused and closed_form else None
        )
        # A subclass with a step, noise or estimate of its own keeps it: the one-call step and the C estimate,
        # which the template tries first, stand only for this class's.
        kind = type(self)
        own_step = all(getattr(kind, name) is getattr(UORO, name) for name in _STEP_METHODS)
        #: the fused step where it can run the whole GIR step as one call (uoro_fused.OneCallStep), else None
        self._one_call_step: OneCallStep | None = (
            self._fused if self.gir and own_step and isinstance(self._fused, OneCallStep) else None
        )
        self._native = True  # the deprecated per-estimator switch (see native)
        #: {(thread, total, size, dtype): (nu, bits)}: where the one-call step's draws land (_noise_bits; CPU only)
        self._draw_buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        #: the summed estimate's C pass, one output per parameter (_fused_gradient), where w_tilde is (B, P)
        self._estimate = (
            SummedEstimate(self.layout.names, self.layout.shapes)
            if projection != "none"
            and kind._gradient_summed is UORO._gradient_summed
            and kind._gradient_estimate is OnlineGradientEstimator._gradient_estimate
            else None
        )

    @property
    def native(self) -> bool:
        """Deprecated: whether this estimator may use the C kernels. Use the one switch of the package,
        :func:`lightning_ortho._native.native_kernels` (or ``LIGHTNING_ORTHO_NATIVE=0``); setting this still turns
        this estimator's kernels off, with a ``DeprecationWarning``."""
        _warn_native()
        return self._native

    @native.setter
    def native(self, value: bool) -> None:
        _warn_native()
        self._native = bool(value)
        if self._fused is not None and hasattr(self._fused, "_native"):
            self._fused._native = self._native

    # -- configuration checks -----------------------------------------------------------------------------------
    @classmethod
    def cell_problem(cls, cell: nn.Module, *, projection: Projection = "state", **options) -> str | None:
        """As :meth:`OnlineGradientEstimator.cell_problem` for ``projection``: ``"state"`` and ``"parameter"`` take
        any real cell (the products of ``forward``); ``"preactivation"`` needs ``forward = activation(preactivation(x,
        h))`` and ``"none"`` also ``preactivation = W a`` with every parameter in ``W``, checked at random points
        (:func:`~lightning_ortho.online.linearization.factorisation_problem`): with any other step the estimate would
        be another model's gradient, so such a cell is refused."""
        problem = super().cell_problem(cell, **options)
        if problem is not None or projection not in ("preactivation", "none"):
            return problem
        if projection == "preactivation":
            need, reason = "h' = activation(z), z = preactivation(x, h)", factorisation_problem(cell, ("step",))
        else:
            need = "h' = activation(z) with z = W a and every parameter in W"
            reason = factorisation_problem(cell, ("step", "complete"))
        if reason is None:
            return None
        others = "'state' or 'parameter'"
        if projection == "none" and factorisation_problem(cell, ("step",)) is None:
            others = "'preactivation', 'state' or 'parameter'"
        return f"UORO: projection={projection!r} needs a cell {need}: {reason}; use projection={others}."

    def _check_linear_preactivation(self, cell: nn.Module) -> list[tuple[str, int, bool]]:
        """``[(name, columns, is_vector)]`` of ``W`` for ``projection="none"`` (the cell was checked by
        :meth:`cell_problem`)."""
        return weight_columns(cell, self.layout)

    def alpha_at(self, step: int) -> float:
        """``alpha_t`` of a fixed rescaling at step ``t`` (1-based)."""
        return alpha_at(self.alpha, step)

    # -- state -------------------------------------------------------------------------------------------------
    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, hidden = h0.shape
        if self.projection == "none":
            columns = sum(c for _, c, _ in self._weight_columns)
            return {"h_tilde": h0.new_zeros(batch, hidden, hidden), "a_tilde": h0.new_zeros(batch, columns)}
        return {"h_tilde": h0.new_zeros(batch, hidden), "w_tilde": h0.new_zeros(batch, self.layout.size)}

    def _reset_tensor(self, name: str, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return super()._reset_tensor(name, value, keep) if name in _ESTIMATE_TENSORS else value

    # -- noise -------------------------------------------------------------------------------------------------
    def _noise(
        self, state: OnlineState, size: int, like: torch.Tensor, signs: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``nu`` ``(B, size)`` standard normal and ``tau`` ``(B, *signs)`` uniform on ``{-1, 1}`` (``(B,)``, or
        ``(B, 1)`` for the fused steps: the same numbers): every draw of UORO, fused
        or not (:meth:`~lightning_ortho.online.stream_noise.StreamNoise._draw`: the
        state's generator, all ``total_streams`` cut to the state's rows; the default generator under
        ``torch.compile`` and :meth:`noise_scope`)."""
        return self._draw(state, like, size, signs)

    def _noise_bits(
        self, state: OnlineState, size: int, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The draw of :meth:`_noise` (``signs = (1,)``) as drawn, for the one-call step (which reads the signs
        ``2 bit - 1`` itself): ``(nu (B, size), bits (B, 1))``, drawn into this thread's buffers of those shapes
        (:meth:`~lightning_ortho.online.stream_noise.StreamNoise._draw_bits`: the same numbers as fresh tensors,
        without their allocations; the caller reads them before this thread draws again). ``None``, with nothing
        drawn, where the state's streams are not all ``total_streams`` in order (a split: :meth:`_noise` cuts
        them). For CPU tensors (``like``; the one-call step runs on the CPU only)."""
        streams = total, rows = self._rows(state)
        if rows is not None:
            return None
        key = (threading.get_ident(), total, size, like.dtype)
        buffers = self._draw_buffers.get(key)
        if buffers is None:
            if len(self._draw_buffers) >= _DRAW_BUFFERS:  # threads come and go: keep a few
                self._draw_buffers.clear()
            with torch.inference_mode(False):  # normal tensors: drawn into in and out of inference mode alike
                buffers = (like.new_empty(total, size), like.new_empty(total, 1))  # (on like's device)
            self._draw_buffers[key] = buffers
        self._draw_bits(state, like, size, (1,), into=buffers, streams=streams)
        return buffers

    # -- the fused step (TanhRNNCell cut at h or z, OrthogonalRNNCell cut at h) -----------------------------------
    def _fused_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """With GIR on a plain :class:`~lightning_ortho.online.TanhRNNCell` (cut at ``h`` or ``z``) at small sizes
        on the CPU, the whole step as one C call that writes ``h'``, ``h_tilde'`` and ``w_tilde'`` into new tensors
        (:class:`~lightning_ortho.online.uoro_fused.OneCallStep`: ``whole_gir_kernels`` checks, in the contract of
        :meth:`OnlineGradientEstimator._fused_step`, then :meth:`_noise_bits` draws, then ``whole_gir``); its verdict
        is the sum of ``x``, ``h'`` and ``h_tilde'``. ``None``, with nothing drawn, wherever that call does not
        apply (other cells, cuts or rescalings, more streams, a split of the streams, tensors it cannot take): then
        :meth:`_advance_step`. A NaN/inf verdict goes through the template's checks with this same step (the noise
        is drawn once)."""
        one = self._one_call_step
        if one is None:
            return None
        h, tensors = state.h, state.tensors
        h_tilde, w_tilde = tensors["h_tilde"], tensors["w_tilde"]
        kernels = one.whole_gir_kernels(x, h, h_tilde, w_tilde)
        if kernels is None:
            return None
        draw = self._noise_bits(state, kernels[2][1], x)
        if draw is None:
            return None
        h_new, h_tilde, w_tilde, verdict = one.whole_gir(kernels, x, h, h_tilde, w_tilde, *draw)
        return Advance(h_new, {**tensors, "h_tilde": h_tilde, "w_tilde": w_tilde}, None, verdict)

    def _advance_step(self, x: torch.Tensor, state: OnlineState):
        """One step (see :meth:`OnlineGradientEstimator._advance_step`) where :meth:`_fused_step` did not take it:
        the cell's linearisation and :meth:`_advance`, or on a fused cell (``fused``) the whole step as the fused
        step's sequence of calls (:class:`~lightning_ortho.online.uoro_fused.FusedStep`), with the same noise
        (:meth:`_noise`).

        With GIR the fused step updates ``w_tilde`` in place, in its ``commit``, which the template calls after the
        NaN/inf checks: an error leaves the state passed in as it was; after a step the new state holds the
        ``w_tilde`` tensor of ``state``, updated (continue from the state returned, copy with ``state_dict``).

        Raises:
            ValueError: a fixed rescaling's ``Q0`` whose size is not the cut vertex's.
        """
        fused = self._fused
        if fused is None:
            return super()._advance_step(x, state)
        t, h = state.tensors, state.h
        h_tilde, w_tilde = t["h_tilde"], t["w_tilde"]
        if self.gir:
            nu, tau = self._noise(state, h.shape[1], h, (1,))  # tau (B, 1)
            # w_tilde is read here and updated in place by commit, after the checks
            h_new, h_tilde, inverse_gamma, pending, verdict = fused.gir(x, h, h_tilde, w_tilde, nu, tau)
            commit = functools.partial(fused.commit, w_tilde, inverse_gamma, pending, h, x)
        else:
            if self.q0 is not None and self.q0.shape[0] != h.shape[1]:
                raise ValueError(
                    f"UORO: Q0 is {tuple(self.q0.shape)} but the cut vertex ({self.projection!r}) has {h.shape[1]}"
                    " entries."
                )
            nu, tau = self._noise(state, h.shape[1], h, (1,))  # tau (B, 1)
            u = tau * nu
            scaled = u if self.q0 is None else u @ self.q0.T.to(u)  # Q0 u
            dual = u if self.q0 is None else u @ self.q0_inverse_t.T.to(u)  # Q0^{-T} u
            h_new, h_tilde, w_tilde = fused.fixed(x, h, h_tilde, w_tilde, scaled, dual, self.alpha_at(state.step + 1))
            commit, verdict = None, None
        if verdict is None and not self._recording() and not h_new.is_meta:
            total = h_tilde.sum(dtype=torch.float64)
            if not self.gir:
                dtype = _sum_dtype(x.dtype)
                total = total + x.sum(dtype=dtype) + w_tilde.sum(dtype=dtype)
            verdict = total.item()
        return Advance(h_new, {**t, "h_tilde": h_tilde, "w_tilde": w_tilde}, commit, verdict)

    # The fused step's verdict (Advance.verdict) is one sum where the fused step makes that enough: a NaN/inf in ``x``,
    # ``h'`` or ``w_tilde`` reaches ``h_tilde'`` (see FusedStep.gir), so with GIR a finite sum of ``h_tilde'`` (taken
    # for free by the C pass) is a finite step, and with a fixed rescaling a finite sum of ``x``, ``h_tilde'`` and
    # ``w_tilde'``; otherwise, and whenever a non-finite verdict comes, the template's checks run and name the cause.

    # -- one step ----------------------------------------------------------------------------------------------
    def _cut(self, lin: StepLinearization) -> tuple[int, Callable, Callable, Callable]:
        """The cut vertex: ``(Z, forward, norm, accumulate)`` with ``forward(v) = J^h_z v`` ``(B, Z) -> (B, H)``,
        ``norm(c) = ||c^T J^z_theta||`` ``(B,)`` and ``accumulate(out, c, s)``: ``out += s c^T J^z_theta`` in place.
        Norm and accumulation never materialise ``c^T J`` where the cell has a closed form (one pass over
        ``w_tilde`` instead of three)."""
        hidden = lin.h_new.shape[1]
        if self.projection == "state":
            return (
                hidden,
                lambda v: v,
                lambda c: lin.vjp_norm("parameter", c),
                lambda out, c, scale: lin.vjp_accumulate("parameter", out, c, scale),
            )
        if self.projection == "parameter":
            return (
                self.layout.size,
                lin.parameter_jvp,
                lambda c: torch.linalg.vector_norm(c, dim=1),
                lambda out, c, scale: out.addcmul_(c, scale[:, None]),
            )
        size = lin.preactivation.shape[1]
        if not lin.has_post_activation_parameters():
            return (
                size,
                lin.activation_jvp,
                lambda c: lin.vjp_norm("preactivation", c),
                lambda out, c, scale: lin.vjp_accumulate("preactivation", out, c, scale),
            )

        def forward(v: torch.Tensor) -> torch.Tensor:
            return lin.activation_jvp(v[:, :size]) + v[:, size:]

        def norm(c: torch.Tensor) -> torch.Tensor:  # the two parts touch different parameters only in general: add
            pre = lin.preactivation_vjp(c[:, :size]) + lin.post_activation_vjp(c[:, size:])
            return torch.linalg.vector_norm(pre, dim=1)

        def accumulate(out: torch.Tensor, c: torch.Tensor, scale: torch.Tensor) -> None:
            lin.vjp_accumulate("preactivation", out, c[:, :size], scale)
            lin.vjp_accumulate("post_activation", out, c[:, size:], scale)

        return size + hidden, forward, norm, accumulate

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        if self.projection == "none":
            return self._advance_without_spatial_noise(lin, x, state)
        t = state.tensors
        size, forward, norm, accumulate = self._cut(lin)
        if not self.gir and self.q0 is not None and self.q0.shape[0] != size:
            raise ValueError(
                f"UORO: Q0 is {tuple(self.q0.shape)} but the cut vertex ({self.projection!r}) has {size} entries."
            )
        propagated = lin.state_jvp(t["h_tilde"])  # J h_tilde_{t-1}
        nu, tau = self._noise(state, size, propagated)
        if self.gir:
            psi = forward(nu)  # J^h_z nu
            gamma = self._ratio(
                torch.linalg.vector_norm(t["w_tilde"], dim=1), torch.linalg.vector_norm(propagated, dim=1)
            )
            beta = self._ratio(norm(nu), torch.linalg.vector_norm(psi, dim=1))  # ||nu^T J^z_theta|| / ||J^h_z nu||
            h_tilde = gamma[:, None] * propagated + (beta * tau)[:, None] * psi
            w_tilde = t["w_tilde"] * (1 / gamma)[:, None]  # a new tensor; the old state is left as it was
            accumulate(w_tilde, nu, tau / beta)  # += tau / beta nu^T J^z_theta
        else:
            alpha = self.alpha_at(state.step + 1)
            u = tau[:, None] * nu
            scaled = u if self.q0 is None else u @ self.q0.T.to(u)  # Q0 u
            dual = u if self.q0 is None else u @ self.q0_inverse_t.T.to(u)  # Q0^{-T} u
            h_tilde = propagated + alpha * forward(scaled)
            w_tilde = t["w_tilde"].clone()
            accumulate(w_tilde, dual, torch.full_like(tau, 1 / alpha))
        return {**t, "h_tilde": h_tilde, "w_tilde": w_tilde}

    def _advance_without_spatial_noise(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState):
        """Without the spatial projection (Cooijmans & Martens 2019): ``H_tilde = gamma J H_tilde + beta tau J^h_z``,
        ``a_tilde = a_tilde / gamma + tau a / beta``, with GIR's gamma and beta on Frobenius norms."""
        t = state.tensors
        propagated = lin.state_jvp_columns(t["h_tilde"])  # (B, H, Z)
        local = lin.activation_jacobian()  # (B, H, Z)
        inputs = self.cell.preactivation_input(x, state.h)  # (B, A)
        _, tau = self._noise(state, 0, propagated)
        if self.gir:
            gamma = self._ratio(self._norms(t["a_tilde"]), self._norms(propagated))
            beta = self._ratio(self._norms(inputs), self._norms(local))
        else:  # Q_t = alpha_t (no spatial noise, so no Q0)
            gamma = propagated.new_ones(propagated.shape[0])
            beta = gamma * self.alpha_at(state.step + 1)
        h_tilde = gamma[:, None, None] * propagated + (beta * tau)[:, None, None] * local
        a_tilde = t["a_tilde"] / gamma[:, None] + (tau / beta)[:, None] * inputs
        return {**t, "h_tilde": h_tilde, "a_tilde": a_tilde}

    def _ratio(self, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
        """``sqrt((n + eps) / (d + eps))`` of per-stream norms ``(B,)``."""
        return torch.sqrt((numerator + self.eps) / (denominator + self.eps))

    @staticmethod
    def _norms(value: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(value.flatten(1), dim=1)

    # -- the estimate ------------------------------------------------------------------------------------------
    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        if self.projection == "none":
            return super()._gradient_summed(state, grad_h)
        w_tilde, h_tilde = state.tensors["w_tilde"], state.tensors["h_tilde"]
        # sum_b (dL/dh_b . h_tilde_b) w_tilde_b as one matrix-vector product: no (B, P) temporary.
        return torch.mv(w_tilde.T, (grad_h * h_tilde).sum(1))

    def _fused_gradient(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[dict[str, torch.Tensor], float] | None:
        """The summed estimate ``sum_b (grad_h_b . h_tilde_b) w_tilde_b`` of any cell (a cut at ``h``, ``z`` or
        ``theta``: ``w_tilde`` ``(B, P)``) in one C pass that writes each parameter's estimate into a tensor of its
        own (:class:`~lightning_ortho._native.uoro.SummedEstimate`), with the sum of ``grad_h`` and of the estimate
        as its verdict, where ``grad_h`` is a C-contiguous ``(B, H)`` float32/float64 real CPU tensor of the state's
        ``h``'s shape and dtype and ``h_tilde`` ``(B, H)`` and ``w_tilde`` ``(B, P)`` are too (those that the
        one-call step made pass as checked then: :meth:`~lightning_ortho.online.uoro_fused.TanhUOROStep.whole_gir_kernels`),
        and the kernels are on; else ``None``: :meth:`_gradient_summed` in the template."""
        estimate = self._estimate
        if estimate is None or not isinstance(grad_h, torch.Tensor):
            return None
        kernel = uoro_gradient_kernel(grad_h)  # (first: declines while compiling, before any other call on grad_h)
        if kernel is None or not self._native or grad_h.dim() != 2 or not grad_h.is_contiguous():
            return None
        batch, hidden = grad_h.shape
        dtype, h, tensors = grad_h.dtype, state.h, state.tensors
        h_tilde, w_tilde = tensors["h_tilde"], tensors["w_tilde"]
        one = self._one_call_step
        made = NOTHING_MADE if one is None else one.made
        fits = (
            h is made[0] and h_tilde is made[1] and w_tilde is made[2] and batch == made[6] and dtype is made[7]
            and hidden == one.hidden
        )  # fmt: skip
        if fits:  # made by the one-call step, checked then: still at their memory (no set_, resize_)?
            h_tilde_pointer, w_tilde_pointer = h_tilde.data_ptr(), w_tilde.data_ptr()
            fits = h_tilde_pointer == made[4] and w_tilde_pointer == made[5]
        if not fits:
            if not (
                isinstance(h, torch.Tensor)
                and h.dtype is dtype
                and h_tilde.dtype is dtype
                and w_tilde.dtype is dtype
                and h.shape == grad_h.shape
                and h_tilde.shape == grad_h.shape
                and w_tilde.shape == (batch, estimate.size)
                and h_tilde.is_contiguous()
                and w_tilde.is_contiguous()
                and real_cpu(h, h_tilde, w_tilde)  # (h: of grad_h's device, the CPU)
            ):
                return None
            h_tilde_pointer, w_tilde_pointer = h_tilde.data_ptr(), w_tilde.data_ptr()
        return estimate(kernel, w_tilde_pointer, grad_h, h_tilde_pointer, batch, hidden)

    def _finite_estimate(self, grad_h: torch.Tensor, flat: torch.Tensor) -> bool:
        # grad_h enters the estimate only through products with it (see _gradient_summed): one sum covers both.
        return math.isfinite(flat.sum(dtype=_sum_dtype(flat.dtype)).item())

    def _watched_tensors(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # With GIR an overflowed w_tilde reaches h_tilde through gamma at the next step: the (B, H) check is enough
        # and skips a pass over the (B, P) w_tilde.
        if self.gir and self.projection != "none":
            return {"h_tilde": tensors["h_tilde"]}
        return tensors

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        t = state.tensors
        if self.projection != "none":
            return (grad_h * t["h_tilde"]).sum(1, keepdim=True) * t["w_tilde"]
        row = torch.einsum("bh,bhz->bz", grad_h, t["h_tilde"])  # H_tilde^T dL/dh, (B, Z)
        weight = row[:, :, None] * t["a_tilde"][:, None, :]  # (B, Z, A): the estimate of dL/dW
        return flatten_weight(self.layout, self._weight_columns, weight, lead=1)


def _warn_native() -> None:
    warnings.warn(
        "UORO.native is deprecated: use the package's one switch, lightning_ortho._native.native_kernels(False)"
        " (a function and a context manager), or LIGHTNING_ORTHO_NATIVE=0.",
        DeprecationWarning,
        stacklevel=3,
    )
