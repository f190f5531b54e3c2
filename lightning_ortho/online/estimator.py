"""The interface every online gradient estimator shares, so they can be swapped and compared.

    est = UORO(cell)                        # or RTRL(cell), TruncatedBPTT(cell, k=...)
    state = est.initial_state(h0)           # h0: (B, H)
    h, state = est.step(x_t, state)         # x_t: (B, I) -> h_t: (B, H)
    grads = est.gradient(state, grad_h)     # grad_h = dL_t/dh_t (B, H) -> {name: tensor} like cell.named_parameters()

``gradient`` is the estimate of ``dL_t/dtheta`` through the whole history (RTRL exactly, UORO unbiased,
truncated BPTT through the last ``k`` steps), summed over the streams (``per_stream=True`` keeps them apart:
``(B, *shape)``). Summing ``gradient`` over ``t`` estimates the gradient of ``L = sum_t L_t``.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, linearize
from lightning_ortho.online.state import OnlineState


class OnlineGradientEstimator:
    """Base class: input checks, resets and the layout of the cell's parameters.

    Args:
        cell: any ``nn.Module`` with ``cell(x, h) -> h_new`` whose parameters all live in it.
        closed_form: use the cell's closed-form Jacobian products when it has them (``cell.linearize``);
            ``False`` forces the generic ``torch.func`` path (tests compare the two).

    Subclasses implement :meth:`_initial_tensors`, :meth:`_advance` and :meth:`_gradient_flat`.
    """

    name = "estimator"

    def __init__(self, cell: nn.Module, *, closed_form: bool = True) -> None:
        if not isinstance(cell, nn.Module):
            raise TypeError(f"{type(self).__name__}: cell must be an nn.Module with cell(x, h) -> h_new, got {cell!r}.")
        self.cell = cell
        self.closed_form = closed_form
        self.layout = ParameterLayout(cell)

    # -- the interface ---------------------------------------------------------------------------------------
    def initial_state(self, h0: torch.Tensor) -> OnlineState:
        """The state before the first step: ``h0`` ``(B, H)`` and a zero influence approximation.

        Raises:
            ValueError: ``h0`` is not a 2-d floating tensor or holds NaN/inf.
        """
        self._check(h0, "h0", dims=2)
        dtypes = {p.dtype for p in self.cell.parameters()}
        if dtypes != {h0.dtype}:
            names = ", ".join(sorted(str(d) for d in dtypes))
            raise ValueError(
                f"{type(self).__name__}: h0 is {h0.dtype} but the cell's parameters are {names}; convert one of them"
                " (e.g. cell.double() for float64 references)."
            )
        return OnlineState(h0, self._initial_tensors(h0), self._new_generator(h0))

    def step(self, x: torch.Tensor, state: OnlineState) -> tuple[torch.Tensor, OnlineState]:
        """Advance every stream one step: ``x`` ``(B, I)`` -> ``(h_t (B, H), new state)``.

        Raises:
            ValueError: ``x`` is not ``(B, I)`` with the state's ``B``, dtype and device, or holds NaN/inf.
        """
        self._check(x, "x", dims=2, like=state.h)
        with torch.no_grad():
            lin = linearize(self.cell, x, state.h, self.layout, closed_form=self.closed_form)
            tensors = self._advance(lin, x, state)
        h_new = lin.h_new.detach()
        if not torch.isfinite(h_new).all():
            raise FloatingPointError(
                f"{type(self).__name__}.step: the cell produced NaN/inf states at step {state.step + 1}; lower the"
                " learning rate or clip gradients (the parameters or the inputs have blown up)."
            )
        self._check_finite_tensors(tensors, state.step + 1)
        return h_new, state.replace(h=h_new, tensors=tensors, step=state.step + 1)

    def gradient(
        self, state: OnlineState, grad_h: torch.Tensor, *, per_stream: bool = False
    ) -> dict[str, torch.Tensor]:
        """The estimate of ``dL_t/dtheta`` given ``grad_h = dL_t/dh_t`` ``(B, H)`` at the state's step.

        Returns ``{name: tensor}`` with the shapes of ``cell.named_parameters()`` (summed over streams), or
        ``(B, *shape)`` per stream with ``per_stream=True``.

        Raises:
            ValueError: ``grad_h`` is not ``(B, H)`` like the state's ``h``, or holds NaN/inf.
        """
        self._check(grad_h, "grad_h", dims=2, like=state.h, same_shape=True)
        with torch.no_grad():
            flat = self._gradient_flat(state, grad_h) if per_stream else self._gradient_summed(state, grad_h)
        return self.layout.unflatten(flat)

    def reset(self, state: OnlineState, mask: torch.Tensor, h0: torch.Tensor | None = None) -> OnlineState:
        """Restart the streams where ``mask`` ``(B,)`` is true: their state becomes ``h0`` (``(B, H)`` or
        ``(H,)``; zeros when ``None``) and their influence approximation zero; the others are untouched.

        Raises:
            ValueError: ``mask`` is not a boolean ``(B,)`` tensor, or ``h0`` has the wrong shape.
        """
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (state.batch_size,):
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(
                f"{type(self).__name__}.reset: mask must be a bool tensor of shape ({state.batch_size},), got {shape}."
            )
        batch, hidden = state.h.shape
        if h0 is not None and (
            not isinstance(h0, torch.Tensor) or tuple(h0.shape) not in ((hidden,), (1, hidden), (batch, hidden))
        ):
            shape = tuple(h0.shape) if isinstance(h0, torch.Tensor) else type(h0).__name__
            raise ValueError(
                f"{type(self).__name__}.reset: h0 must have shape ({batch}, {hidden}) or ({hidden},), got {shape}."
            )
        start = torch.zeros_like(state.h) if h0 is None else h0.to(state.h).expand_as(state.h)
        keep = ~mask
        h = torch.where(keep[:, None], state.h, start)
        tensors = {k: self._reset_tensor(k, v, keep) for k, v in state.tensors.items()}
        return state.replace(h=h, tensors=tensors)

    # -- for subclasses ----------------------------------------------------------------------------------------
    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _check_finite_tensors(self, tensors: dict[str, torch.Tensor], step: int = 0) -> None:
        """Raise ``FloatingPointError`` if an influence tensor overflowed. One sum per tensor (a single pass; an
        overflowed or NaN entry makes it non-finite) instead of ``isfinite``, which takes several passes."""
        for name, value in tensors.items():
            if value.is_floating_point() and value.numel() and not torch.isfinite(value.sum()):
                raise FloatingPointError(
                    f"{type(self).__name__}.step: its influence approximation {name!r} overflowed at step {step}"
                    " (the recurrent Jacobian has been expansive for a long time); lower the learning rate, clip"
                    " gradients, or reset the streams more often."
                )

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        """``(P,)``: the estimate summed over streams (subclasses may skip the per-stream ``(B, P)`` temporary)."""
        return self._gradient_flat(state, grad_h).sum(0)

    def _new_generator(self, h0: torch.Tensor) -> torch.Generator | None:
        return None

    def _reset_tensor(self, name: str, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Zero a reset stream's entry (streams on dim 0)."""
        return value * keep.view(-1, *([1] * (value.dim() - 1))).to(value.dtype)

    def _check(
        self,
        tensor: torch.Tensor,
        name: str,
        *,
        dims: int,
        like: torch.Tensor | None = None,
        same_shape: bool = False,
    ) -> None:
        where = type(self).__name__
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{where}: {name} must be a tensor, got {type(tensor).__name__}.")
        if tensor.dim() != dims:
            raise ValueError(f"{where}: {name} must be (streams, features), got shape {tuple(tensor.shape)}.")
        if not tensor.is_floating_point():
            raise ValueError(f"{where}: {name} must be floating point, got {tensor.dtype}; convert it with .float().")
        if like is not None:
            if tensor.shape[0] != like.shape[0] or (same_shape and tensor.shape != like.shape):
                want = tuple(like.shape) if same_shape else (like.shape[0], "...")
                raise ValueError(f"{where}: {name} must have shape {want} like the state, got {tuple(tensor.shape)}.")
            if tensor.dtype != like.dtype or tensor.device != like.device:
                raise ValueError(
                    f"{where}: {name} is {tensor.dtype} on {tensor.device} but the state is {like.dtype} on"
                    f" {like.device}; convert one of them (the cell's parameters must match too)."
                )
        if not torch.isfinite(tensor).all():
            raise ValueError(f"{where}: {name} holds NaN or inf values; check the data and the loss.")
