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

    ``state_dict()`` holds tensors only (and one int), so ``torch.save`` and Lightning checkpoints store it;
    ``load_state_dict`` restores it in place, bit-exactly.
    """

    def __init__(
        self,
        h: torch.Tensor,
        tensors: dict[str, torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
        step: int = 0,
    ) -> None:
        self.h = h
        self.tensors = dict(tensors or {})
        self.generator = generator
        self.step = step

    @property
    def batch_size(self) -> int:
        return self.h.shape[0]

    def replace(self, **changes: Any) -> OnlineState:
        """A new state with some fields changed; it shares the generator (one noise stream per estimator run)."""
        fields = {"h": self.h, "tensors": self.tensors, "generator": self.generator, "step": self.step}
        fields.update(changes)
        return OnlineState(**fields)

    def state_dict(self) -> dict[str, Any]:
        return {
            "h": self.h.detach().clone(),
            "tensors": {k: v.detach().clone() for k, v in self.tensors.items()},
            "generator": None if self.generator is None else self.generator.get_state(),
            "step": torch.tensor(self.step),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (onto this state's device).

        Raises:
            ValueError: the saved state has a generator and this one has none, or the other way round.
        """
        device = self.h.device
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError(
                "OnlineState.load_state_dict: the saved state and this one disagree on having a noise generator;"
                " restore it into the state of the same estimator type (initial_state of the estimator that saved it)."
            )
        self.h = state["h"].to(device)
        self.tensors = {k: v.to(device) for k, v in state["tensors"].items()}
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self.step = int(state["step"])
