"""Recurrent networks whose transition matrix is orthogonal(-like): ``h_t = sigma(U h_{t-1} + V x_t; b)``.

The transition ``U`` is any map of :func:`~lightning_ortho.nn.orthogonal_map` (one auxiliary reflection,
``k`` Householder reflections, Cayley, matrix exponential), as in section 3.2 / Appendix B.2 of
"One Reflection Suffice" and the expRNN setting it follows (Lezcano-Casado & Martinez-Rubio 2019).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Literal

import torch
from torch import nn

from lightning_ortho.nn._checks import (
    LOW_PRECISION,
    check_features,
    check_finite,
    check_module_finite,
    check_positive_int,
    finite_checks_enabled,
    has_values,
)
from lightning_ortho.nn.activations import modrelu
from lightning_ortho.nn.auxiliary import AuxiliaryReflection
from lightning_ortho.nn.orthogonal_maps import OrthogonalMethod, orthogonal_map
from lightning_ortho.nn.rnn_sequence import auxiliary_rnn_sequence

Nonlinearity = Literal["modrelu", "tanh"]


def cayley_initial_orthogonal(
    d: int, *, generator: torch.Generator | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``(d, d)`` orthogonal matrix of the "Cayley initialisation" (Helfrich et al. 2018, used by expRNN).

    The skew-symmetric ``A`` has 2x2 blocks ``[[0, s], [-s, 0]]`` with ``s = -sqrt((1 - cos t) / (1 + cos t))``,
    ``t ~ U(0, pi/2)``; its Cayley transform ``(I + A)^{-1} (I - A)`` is block-diagonal with 2x2 rotations by
    ``theta = 2 atan(s)``, built here directly (the same matrix without a solve; a test checks it against the
    transform). For odd ``d`` the last diagonal entry is 1.
    """
    angles = torch.empty(d // 2, dtype=torch.float64).uniform_(0.0, math.pi / 2, generator=generator)
    # tan(theta / 2) = s  =>  the Cayley transform of the block rotates by theta = 2 atan(s) = -t.
    theta = 2 * torch.atan(-torch.sqrt((1 - torch.cos(angles)) / (1 + torch.cos(angles))))
    u = torch.eye(d, dtype=torch.float64)
    idx = torch.arange(d // 2) * 2
    u[idx, idx] = torch.cos(theta)
    u[idx + 1, idx + 1] = torch.cos(theta)
    u[idx, idx + 1] = -torch.sin(theta)
    u[idx + 1, idx] = torch.sin(theta)
    return u.to(dtype or torch.get_default_dtype())


class OrthogonalRNNCell(nn.Module):
    """One step ``h' = sigma(U h + V x; b)`` with an orthogonal(-like) transition ``U``.

    Args:
        input_size: size of ``x``.
        hidden_size: size of ``h``.
        transition: the map for ``U`` (see :func:`orthogonal_map`): ``"aux"`` (one auxiliary reflection),
            ``"householder"`` (``reflections`` normal reflections, default ``hidden_size``), ``"cayley"``,
            ``"matrix_exp"``.
        reflections: number of normal reflections for ``transition="householder"``.
        nonlinearity: ``"modrelu"`` (``sign(z) relu(|z| + b)``, bias init U(-0.01, 0.01)) or ``"tanh"``
            (``tanh(z + b)``, bias init 0).
        **map_kwargs: passed to :func:`orthogonal_map`.

    ``V`` is initialised Kaiming-normal (as in expRNN). Every parameter lives in this module, so the step is a
    pure function of ``(parameters, x, h)``: ``torch.func.functional_call(cell, params, (x, h))`` works, and
    so do ``torch.func.jvp``/``vjp`` through it (online training differentiates the cell this way).

    Shapes: ``x`` ``(B, input_size)``, ``h`` ``(B, hidden_size)`` -> ``(B, hidden_size)``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        transition: OrthogonalMethod = "aux",
        reflections: int | None = None,
        nonlinearity: Nonlinearity = "modrelu",
        **map_kwargs: Any,
    ) -> None:
        super().__init__()
        check_positive_int(input_size, "input_size", "OrthogonalRNNCell")
        check_positive_int(hidden_size, "hidden_size", "OrthogonalRNNCell")
        if nonlinearity not in ("modrelu", "tanh"):
            raise ValueError(f"OrthogonalRNNCell: nonlinearity must be 'modrelu' or 'tanh', got {nonlinearity!r}.")
        if reflections is not None:
            if transition != "householder":
                raise ValueError("OrthogonalRNNCell: `reflections` only applies to transition='householder'.")
            map_kwargs["k"] = reflections
        self.input_size, self.hidden_size = input_size, hidden_size
        self.transition_kind, self.nonlinearity = transition, nonlinearity
        self.input_kernel = nn.Linear(input_size, hidden_size, bias=False)
        nn.init.kaiming_normal_(self.input_kernel.weight, nonlinearity="relu")
        bias = torch.empty(hidden_size).uniform_(-0.01, 0.01) if nonlinearity == "modrelu" else torch.zeros(hidden_size)
        self.bias = nn.Parameter(bias)
        self.transition = orthogonal_map(hidden_size, transition, **map_kwargs)  # after V and b: see OrthogonalRNN

    @torch.no_grad()
    def reset_transition_(self, orthogonal: torch.Tensor) -> bool:
        """Make ``U`` equal the orthogonal ``(hidden, hidden)`` matrix (Appendix B.2: every map starts from the
        same ``U``; normal reflections through QR, the auxiliary reflection through ``W = I - U``).

        Returns ``False`` (and leaves ``U`` unchanged) when the map does not declare that it can represent every
        orthogonal matrix (:attr:`~lightning_ortho.nn.base.OrthogonalMap.represents_every_orthogonal`), e.g.
        fewer than ``hidden_size`` normal reflections.
        """
        if not self.transition.represents_every_orthogonal:
            return False
        self.transition.reset_orthogonal_(orthogonal.to(next(self.transition.parameters()).dtype))
        return True

    def preactivation(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``U h + V x`` (before the nonlinearity)."""
        return self.transition(h) + self.input_kernel(x)

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        """``sigma(z; b)``: modReLU or ``tanh(z + b)``. The bias acts after the preactivation (online training
        projects its influence in state space, see :mod:`lightning_ortho.online`)."""
        if self.nonlinearity == "modrelu":
            return modrelu(z, self.bias)
        return torch.tanh(z + self.bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step ``h' = sigma(U h + V x; b)``: ``activation(preactivation(x, h))``.

        Args:
            x: ``(B, input_size)`` inputs of the step.
            h: ``(B, hidden_size)`` previous states.

        Returns:
            ``(B, hidden_size)``, the new states.
        """
        return self.activation(self.preactivation(x, h))

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, nonlinearity={self.nonlinearity!r}"


class OrthogonalRNN(nn.Module):
    """An :class:`OrthogonalRNNCell` unrolled over a sequence, with a learned non-zero initial state.

    ``h_0`` is a parameter initialised ``U(-sqrt(3 / (2 H)), sqrt(3 / (2 H)))`` as suggested by Arjovsky et al.
    (2016) and used by the paper for every map (Appendix B.2: ``h_0 = 0`` made auxiliary reflections divide
    by zero in the authors' code; here ``H(0) := I`` so it would not, but the initialisation is kept).

    Args:
        input_size: size of ``x_t``.
        hidden_size: size of ``h``, ``H``.
        transition: the map for ``U``, as in :class:`OrthogonalRNNCell`.
        reflections: number of normal reflections for ``transition="householder"``, as in
            :class:`OrthogonalRNNCell`.
        nonlinearity: ``"modrelu"`` or ``"tanh"``, as in :class:`OrthogonalRNNCell`.
        initial_orthogonal: ``"cayley"`` (all maps start from the same Cayley-initialised ``U`` when they can
            represent it) or ``"default"`` (each map's own init).
        **map_kwargs: passed to :func:`orthogonal_map`.

    Shapes: ``x`` ``(B, T, input_size)`` (batch-first) -> ``(outputs (B, T, H), h_T (B, H))``.

    Speed: with ``transition="aux"`` (``n(h) = W h``) the whole sequence runs as one fused Function
    (:mod:`~lightning_ortho.nn.rnn_sequence`: a hand-written backward pass through time, one host read per
    sequence) instead of the cell step by step; values and gradients agree to float rounding, and double backward
    works. ``rnn.fused_sequence = False`` turns it off. Sequences the fused path cannot take exactly (a badly
    scaled state, NaN/inf, ``torch.func`` transforms, forward-mode AD, half-precision parameters, autocast) run the
    cell step by step.

    Raises:
        ValueError: ``x`` is not ``(B, T, input_size)`` or holds NaN/inf, or a parameter holds NaN/inf.
    """

    #: Run an auxiliary-reflection transition as one fused sequence Function (see the class docstring).
    fused_sequence: bool = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        transition: OrthogonalMethod = "aux",
        reflections: int | None = None,
        nonlinearity: Nonlinearity = "modrelu",
        initial_orthogonal: Literal["cayley", "default"] = "cayley",
        **map_kwargs: Any,
    ) -> None:
        super().__init__()
        check_positive_int(input_size, "input_size", "OrthogonalRNN")
        check_positive_int(hidden_size, "hidden_size", "OrthogonalRNN")
        if initial_orthogonal not in ("cayley", "default"):
            raise ValueError(
                f"OrthogonalRNN: initial_orthogonal must be 'cayley' or 'default', got {initial_orthogonal!r}."
            )
        # Random draws in a fixed order (U, h0, then the cell's V and b before its map's own parameters), so one
        # seed gives every transition map the same U, h0, V and b: runs that differ only in the map compare fairly.
        initial = cayley_initial_orthogonal(hidden_size) if initial_orthogonal == "cayley" else None
        bound = math.sqrt(3.0 / (2.0 * hidden_size))
        self.initial_state = nn.Parameter(torch.empty(hidden_size).uniform_(-bound, bound))
        self.cell = OrthogonalRNNCell(
            input_size,
            hidden_size,
            transition=transition,
            reflections=reflections,
            nonlinearity=nonlinearity,
            **map_kwargs,
        )
        self.cayley_initialised = initial is not None and self.cell.reset_transition_(initial)

    @property
    def hidden_size(self) -> int:
        """``H``, the size of the state (the cell's ``hidden_size``)."""
        return self.cell.hidden_size

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the cell over the sequence: ``h_t = sigma(U h_{t-1} + V x_t; b)`` for ``t = 1 .. T``.

        Args:
            x: ``(B, T, input_size)`` inputs, batch-first.
            h0: ``(B, H)`` initial states; ``None`` starts every sequence from the learned ``initial_state``
                ``(H,)``.

        Returns:
            ``(outputs, h_T)``: the states of every step ``(B, T, H)`` and the last one ``(B, H)``. For ``T = 0``,
                ``(B, 0, H)`` and the initial state.

        Raises:
            ValueError: ``x`` is not ``(B, T, input_size)`` or holds NaN/inf, or a parameter holds NaN/inf.
            TypeError: ``x`` is not a floating-point tensor.
        """
        if x.dim() != 3:
            raise ValueError(
                f"OrthogonalRNN: x must be (batch, time, {self.cell.input_size}), got shape {tuple(x.shape)}."
            )
        check_features(x, self.cell.input_size, name="x", layer="OrthogonalRNN")
        check_finite(x, name="x", layer="OrthogonalRNN")
        h = self.initial_state.expand(x.shape[0], -1) if h0 is None else h0
        if x.shape[1] == 0:  # no steps: no outputs, and the state is still h0
            return x.new_zeros(x.shape[0], 0, self.hidden_size), h
        fused = self._fused_forward(x, h)
        if fused is not None:
            return fused
        outputs = []
        with self.transition_cached():
            for t in range(x.shape[1]):
                h = self.cell(x[:, t], h)
                outputs.append(h)
        return torch.stack(outputs, dim=1), h

    def _fused_forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(outputs, h_T)`` from :func:`~lightning_ortho.nn.rnn_sequence.auxiliary_rnn_sequence`, or ``None`` where
        it does not apply (then the caller runs the cell step by step)."""
        cell, transition = self.cell, self.cell.transition
        if (
            not self.fused_sequence
            or not isinstance(transition, AuxiliaryReflection)
            or transition.network is not None
            or torch._C._functorch.is_functorch_wrapped_tensor(x)
            or torch._C._functorch.is_functorch_wrapped_tensor(h)
            or torch.compiler.is_compiling()
            or torch.autograd.forward_ad._current_level >= 0  # forward-mode AD: the cell has it, the Function not
            or not has_values(x)  # meta/fake: the fused sequence decides its path from values it reads
        ):
            return None
        weight = transition.constraint() if transition.invertible else transition.weight
        dtype = weight.dtype
        parameters = (weight, cell.input_kernel.weight, cell.bias)
        if (
            dtype in LOW_PRECISION
            or any(torch._C._functorch.is_functorch_wrapped_tensor(p) for p in parameters)
            or not isinstance(h, torch.Tensor)
            or h.shape != (x.shape[0], self.hidden_size)
            or any(t.dtype != dtype for t in (h, *parameters))
            or x.dtype != dtype
            or (x.device.type != "meta" and torch.is_autocast_enabled(x.device.type))
        ):
            return None
        modrelu, checked = cell.nonlinearity == "modrelu", finite_checks_enabled()
        result = auxiliary_rnn_sequence(
            x, h, weight, cell.input_kernel.weight, cell.bias, modrelu=modrelu, checked=checked
        )
        if result is None:  # name a NaN/inf parameter; a badly scaled state goes step by step
            check_module_finite(self, layer="OrthogonalRNN")
        return result

    def transition_cached(self) -> contextlib.AbstractContextManager:
        """Build a matrix transition (Householder, Cayley, matrix exponential) once per sequence instead of
        once per step, as expRNN does (:meth:`~lightning_ortho.nn.base.OrthogonalMap.cached`)."""
        return self.cell.transition.cached()
