"""Maximum-likelihood training of :class:`~lightning_ortho.flows.Glow` on any image data module."""

from __future__ import annotations

import torch

from lightning_ortho._lightning import pl
from lightning_ortho.flows import Glow
from lightning_ortho.flows.conv1x1 import Conv1x1Kind
from lightning_ortho.models.optimizers import build_optimizer


class GlowModule(pl.LightningModule):
    """Glow trained by maximum likelihood: the loss is bits/dim (:meth:`Glow.bits_per_dim`).

    Args:
        in_channels: image channels of the :class:`Glow` (1 for digits/MNIST, 3 for CIFAR-10).
        image_size: image side (must be divisible by ``2 ** levels``).
        levels: number of scales ``L`` of the :class:`Glow`.
        steps: flow steps per scale ``K``.
        hidden_channels: coupling width ``C``.
        conv1x1: kind of the invertible 1x1 convolutions: ``plain``, ``lu``, ``householder``, ``aux``,
            ``aux_invertible``.
        num_levels: quantisation levels of the data (256 for 8-bit images, 17 for scikit-learn's digits);
            images must arrive in [0, 1] (data modules with standardisation turned off).
        lr: Adam learning rate, reached by a linear warm-up over ``warmup_steps`` optimizer steps.
        warmup_steps: optimizer steps of the linear learning-rate warm-up.

    Batches are ``(images, ...)`` with images ``(N, C, S, S)``. Logs ``train_bpd``, ``val_bpd`` and ``test_bpd``;
    ``predict`` returns each image's bits/dim.
    Diagnostics are callbacks, as the Glow recipes configure them: while training,
    :class:`~lightning_ortho.callbacks.InvertibilityMonitor` with ``modules=["glow"]`` (round-trip error of
    ``decode(encode(y))``, Newton failures, Theorem 2 margin) and
    :class:`~lightning_ortho.callbacks.JacobianDeterminantMonitor` with
    ``modules=[Invertible1x1Conv]`` (in a YAML config, its class path ``lightning_ortho.flows.Invertible1x1Conv``; ``log|det J|`` of every 1x1 convolution and the fraction
    of pixels whose ``det J_g`` is negative: Jacobian sign flips); per validation epoch,
    :class:`~lightning_ortho.callbacks.GlowInvertibilityCheck` (the same numbers on held-out images) and
    :class:`~lightning_ortho.callbacks.GlowImageGrids`.
    Gradient clipping: the Trainer's ``gradient_clip_val``.

    Raises:
        ValueError: on the first batch, when pixel values lie outside [0, 1] (standardised data).
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int = 8,
        levels: int = 3,
        steps: int = 8,
        hidden_channels: int = 64,
        conv1x1: Conv1x1Kind = "lu",
        num_levels: int = 17,
        lr: float = 1e-3,
        warmup_steps: int = 200,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.glow = Glow(in_channels, image_size, levels, steps, hidden_channels, conv1x1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` log-density of dequantised images."""
        return self.glow(y)

    def _bits_per_dim(self, images: torch.Tensor) -> torch.Tensor:
        return self.glow.bits_per_dim(images, self.hparams.num_levels).mean()

    def training_step(self, batch, batch_idx):  # noqa: D102
        bpd = self._bits_per_dim(batch[0])
        self.log("train_bpd", bpd, prog_bar=True, on_step=True, on_epoch=True)
        return bpd

    def validation_step(self, batch, batch_idx):  # noqa: D102
        self.log("val_bpd", self._bits_per_dim(batch[0]), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):  # noqa: D102
        self.log("test_bpd", self._bits_per_dim(batch[0]), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        """``(N,)`` bits/dim of each image of the batch (uniform dequantisation noise, as in validation)."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        return self.glow.bits_per_dim(images, self.hparams.num_levels)

    def prediction_record(self, outputs: list[torch.Tensor], targets: list[torch.Tensor | None]) -> dict:
        """What ``lightning-ortho predict`` saves: ``bits_per_dim`` ``(N,)`` of each image and, when every batch
        has them, the images' ``labels`` ``(N,)``."""
        record = {"bits_per_dim": torch.cat(outputs)}
        if targets and all(t is not None for t in targets):
            record["labels"] = torch.cat(targets)  # type: ignore[arg-type]
        return record

    def prediction_summary(self, record: dict[str, torch.Tensor], reduce) -> str:
        """The mean bits/dim over every image of every process."""
        bits = record["bits_per_dim"].double()
        total, count = reduce(torch.stack([bits.sum(), torch.tensor(float(len(bits)), dtype=torch.float64)]))
        return f"mean bits/dim {float(total / count):.4f} over {int(count)} images"

    def configure_optimizers(self):
        optimizer = build_optimizer(type(self).__name__, torch.optim.Adam, self.parameters(), lr=self.hparams.lr)
        warmup = max(1, self.hparams.warmup_steps)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
