"""Several torch optimizers over disjoint parameters, stepped as one: one optimizer step per batch for Lightning.

The paper's RNN (Appendix B.2, after expRNN) trains the transition with Adam and everything else with RMSprop.
Two Lightning optimizers need manual optimisation, and Lightning then counts *each* optimizer's step as a global
step, so ``Trainer(max_steps=N)`` stopped after N / 2 batches and checkpoints were named by twice the batch count
(Lightning issue #17958). One :class:`OptimizerGroup` is one optimizer to Lightning: automatic optimisation, one
step per batch, precision plugins and gradient scaling unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class OptimizerGroup(torch.optim.Optimizer):
    """``optimizers`` stepped together: ``step`` steps each in order, ``zero_grad`` clears each.

    ``param_groups`` is the list of the members' own groups (the same dicts), so learning-rate schedulers,
    ``LearningRateMonitor`` and gradient unscaling see and change every member. ``state_dict`` nests the
    members' state dicts.

    Args:
        optimizers: torch optimizers whose parameters do not overlap.

    Raises:
        ValueError: no optimizer, or two optimizers share a parameter.
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        optimizers = list(optimizers)
        params = [p for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]]
        if not optimizers or len({id(p) for p in params}) != len(params):
            raise ValueError("OptimizerGroup: give at least one optimizer, and no parameter to two of them.")
        super().__init__(params, {})
        self.optimizers = optimizers
        self.param_groups = [group for optimizer in optimizers for group in optimizer.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Evaluate ``closure`` once (with gradients), then step every member. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        states = state_dict["optimizers"]
        if len(states) != len(self.optimizers):
            raise ValueError(
                f"OptimizerGroup: {len(states)} saved optimizer states for {len(self.optimizers)} optimizers."
            )
        for optimizer, state in zip(self.optimizers, states, strict=True):
            optimizer.load_state_dict(state)
