"""The checkpointable state of an online gradient estimator."""

from __future__ import annotations

from typing import Any

import torch


class OnlineState:
    """What an estimator carries from one step to the next, for ``B`` independent streams.

    Attributes:
        h: ``(B, H)`` the current hidden states.
        tensors: the estimator's influence approximation, every entry with the streams on dim 0 (UORO's
            ``h_tilde`` ``(B, H)`` and ``w_tilde`` ``(B, P)``, RTRL's ``influence`` ``(B, H, P)``, truncated
            BPTT's window of inputs and states).
        generator: the estimator's own ``torch.Generator`` (UORO's noise) or ``None``; its state is part of
            :meth:`state_dict`, so a run that stops and resumes draws the same noise.
        step: the number of steps taken since :meth:`~lightning_ortho.online.OnlineGradientEstimator.initial_state`.
        kind: the name of the estimator that made the state (``"rtrl"``, ``"tbptt"``, ``"uoro"``) or ``None``.
        varying_dims: ``{entry: dims}``, the dims of a ``tensors`` entry whose size changes from step to step
            (truncated BPTT's window); every other dim of every entry keeps its size.

    ``state_dict()`` holds tensors, one int and the kind, so ``torch.save`` and Lightning checkpoints store it;
    ``load_state_dict`` checks that it fits and restores it in place, bit-exactly.
    """

    def __init__(
        self,
        h: torch.Tensor,
        tensors: dict[str, torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
        step: int = 0,
        kind: str | None = None,
        varying_dims: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.h = h
        self.tensors = dict(tensors or {})
        self.generator = generator
        self.step = step
        self.kind = kind
        self.varying_dims = varying_dims or {}

    @property
    def batch_size(self) -> int:
        return self.h.shape[0]

    def replace(self, **changes: Any) -> OnlineState:
        """A new state with some fields changed; it shares the generator (one noise stream per estimator run)."""
        fields = {"h": self.h, "tensors": self.tensors, "generator": self.generator, "step": self.step}
        fields.update(changes)
        return OnlineState(**fields, kind=self.kind, varying_dims=self.varying_dims)

    def state_dict(self) -> dict[str, Any]:
        return {
            "h": self.h.detach().clone(),
            "tensors": {k: v.detach().clone() for k, v in self.tensors.items()},
            "generator": None if self.generator is None else self.generator.get_state(),
            "step": torch.tensor(self.step),
            "kind": self.kind,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (onto this state's device; floating entries in this state's dtypes).

        The saved state must fit this one: the same streams and hidden size, a noise generator in both or neither
        and, when an estimator made this state (``kind`` is set), the same estimator kind (if the saved state
        records it) and the same influence entries with the same shapes (but for ``varying_dims``) and kinds of
        dtype. Make the state to load into with ``initial_state`` of an estimator like the one that saved it,
        with ``h0`` of the saved streams.

        Raises:
            ValueError: ``state`` is not a :meth:`state_dict`, or it does not fit this state; the message says
                what differs.
        """
        self._check_loadable(state)
        device = self.h.device
        self.h = state["h"].to(device, self.h.dtype)
        dtypes = {k: v.dtype for k, v in self.tensors.items() if v.is_floating_point()}
        self.tensors = {
            k: v.to(device, dtypes.get(k, v.dtype) if v.is_floating_point() else v.dtype)
            for k, v in state["tensors"].items()
        }
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self.step = int(state["step"])

    def _check_loadable(self, state: Any) -> None:
        """Raise ``ValueError`` naming what differs between a saved state and this one (see load_state_dict)."""
        where = "OnlineState.load_state_dict"
        needed = {"h", "tensors", "generator", "step"}
        if not isinstance(state, dict) or not needed <= set(state):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{where}: expected a state_dict() with keys {sorted(needed)}, got {got}.")
        redo = "make the state to load into with initial_state of the estimator that saved it"
        saved_kind = state.get("kind")
        if saved_kind is not None and self.kind is not None and saved_kind != self.kind:
            raise ValueError(
                f"{where}: the saved state belongs to a {saved_kind!r} estimator, this one to a {self.kind!r}"
                f" estimator; their influence approximations differ. Restore it into the state of a {saved_kind!r}"
                f" estimator ({redo})."
            )
        h = state["h"]
        if not isinstance(h, torch.Tensor) or h.shape != self.h.shape or not h.is_floating_point():
            got = f"{h.dtype} {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__
            raise ValueError(
                f"{where}: the saved hidden states h are {got}, this state's are {self.h.dtype}"
                f" {tuple(self.h.shape)} (streams, hidden size); {redo}, with h0 of shape {tuple(h.shape)}"
                " on a cell of that hidden size."
            )
        saved, mine = state["tensors"], self.tensors
        if self.kind is None:  # a state made by hand has no estimator to say what it holds
            saved = mine = {}
        if set(saved) != set(mine):
            raise ValueError(
                f"{where}: the saved state holds the entries {sorted(saved)}, this one {sorted(mine)}"
                f" (missing {sorted(set(mine) - set(saved))}, unexpected {sorted(set(saved) - set(mine))}); the"
                f" estimators differ: {redo}."
            )
        for key, value in saved.items():
            want, varying = mine[key], self.varying_dims.get(key, ())
            same_shape = value.dim() == want.dim() and all(
                a == b or d in varying for d, (a, b) in enumerate(zip(value.shape, want.shape, strict=True))
            )
            same_kind = value.is_floating_point() == want.is_floating_point() and (
                value.is_floating_point() or value.dtype == want.dtype
            )
            if not (same_shape and same_kind):
                dims = ["*" if d in varying else str(n) for d, n in enumerate(want.shape)]
                pattern = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
                raise ValueError(
                    f"{where}: the saved entry {key!r} is {value.dtype} {tuple(value.shape)}, this state needs"
                    f" {want.dtype} {pattern} (* varies); the cell or the estimator's options differ: {redo}."
                )
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError(f"{where}: the saved state and this one disagree on having a noise generator; {redo}.")
