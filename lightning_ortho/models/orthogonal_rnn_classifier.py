"""Sequence classifier with an orthogonal(-like) RNN (section 3.2 / Appendix B.2, the expRNN setting)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from lightning_ortho.models.classification import ClassifierModule
from lightning_ortho.models.optimizer_group import OptimizerGroup
from lightning_ortho.models.optimizers import build_optimizer
from lightning_ortho.nn.orthogonal_maps import OrthogonalMethod
from lightning_ortho.nn.rnn import Nonlinearity, OrthogonalRNN

OPTIMIZERS = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop}


class OrthogonalRNNClassifier(ClassifierModule):
    """``OrthogonalRNN`` over the sequence, then a linear read-out of the last hidden state.

    Args:
        in_features: values per time step (1 for pixel MNIST; linked from the data module by the CLI).
        num_classes: output classes.
        hidden_size: ``H`` (170 in the paper and expRNN).
        transition: the map for ``U``: ``"aux"`` (one auxiliary reflection), ``"householder"`` (``reflections``
            normal reflections; 1 or ``H`` in the paper), ``"cayley"`` or ``"matrix_exp"``.
        reflections: number of normal reflections for ``"householder"`` (default ``H``).
        nonlinearity: ``"modrelu"`` (default, as expRNN) or ``"tanh"``.
        initial_orthogonal: ``"cayley"``: every map that can represent it starts from the same Cayley-initialised
            ``U`` (normal reflections via QR, aux via ``W = I - U``); ``"default"``: each map's own init.
        lr: learning rate for everything but the transition.
        optimizer: optimizer for everything but the transition: ``"rmsprop"`` (as expRNN) or ``"adam"``.
        transition_lr: learning rate for the transition's parameters.
        transition_optimizer: optimizer for the transition's parameters; Adam by default, which the paper found
            stable for auxiliary reflections where RMSprop was not (Appendix B.2).
        gradient_clip_val: clip each optimizer's gradient norm to this value (``None``: no clipping).

    The two optimizers are one :class:`~lightning_ortho.models.optimizer_group.OptimizerGroup` to Lightning:
    automatic optimisation, one step per batch (``Trainer(max_steps=N)`` trains N batches), both states in the
    checkpoint (checkpoints of version 0.1, which had two optimizers, still resume).
    """

    def __init__(
        self,
        in_features: int = 1,
        num_classes: int = 10,
        hidden_size: int = 170,
        transition: OrthogonalMethod = "aux",
        reflections: int | None = None,
        nonlinearity: Nonlinearity = "modrelu",
        initial_orthogonal: Literal["cayley", "default"] = "cayley",
        lr: float = 1e-3,
        optimizer: Literal["rmsprop", "adam"] = "rmsprop",
        transition_lr: float = 1e-4,
        transition_optimizer: Literal["rmsprop", "adam"] = "adam",
        gradient_clip_val: float | None = None,
    ) -> None:
        super().__init__(num_classes)
        self.save_hyperparameters()
        for name in (optimizer, transition_optimizer):
            if name not in OPTIMIZERS:
                raise ValueError(
                    f"OrthogonalRNNClassifier: optimizer must be one of {sorted(OPTIMIZERS)}, got {name!r}."
                )
        self.rnn = OrthogonalRNN(
            in_features,
            hidden_size,
            transition=transition,
            reflections=reflections,
            nonlinearity=nonlinearity,
            initial_orthogonal=initial_orthogonal,
        )
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, in_features) -> (B, num_classes)`` logits from the last hidden state."""
        _, last = self.rnn(x)
        return self.head(last)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """The Trainer's clipping (if any) over all parameters, then ``gradient_clip_val`` per member optimizer."""
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if self.hparams.gradient_clip_val is not None:
            for member in getattr(optimizer, "optimizers", [optimizer]):
                self.clip_gradients(
                    member, gradient_clip_val=self.hparams.gradient_clip_val, gradient_clip_algorithm="norm"
                )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Version 0.1 saved the two optimizers separately (manual optimisation); they are one group now.
        states = checkpoint.get("optimizer_states", [])
        if len(states) == 2 and all("optimizers" not in state for state in states):
            checkpoint["optimizer_states"] = [{"optimizers": states}]

    def configure_optimizers(self):
        transition = list(self.rnn.cell.transition.parameters())
        ids = {id(p) for p in transition}
        rest = [p for p in self.parameters() if id(p) not in ids]
        h, owner = self.hparams, type(self).__name__
        return OptimizerGroup(
            [
                build_optimizer(owner, OPTIMIZERS[h.transition_optimizer], transition, lr=h.transition_lr),
                build_optimizer(owner, OPTIMIZERS[h.optimizer], rest, lr=h.lr),
            ]
        )
