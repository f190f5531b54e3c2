"""Logs whether a Glow still inverts on validation data: reconstruction, Newton, Jacobian signs, Theorem 2."""

from __future__ import annotations

import warnings

import pytorch_lightning as pl

from lightning_ortho.callbacks._glow_probe import GlowProbeCallback
from lightning_ortho.flows import diagnostics


class GlowInvertibilityCheck(GlowProbeCallback):
    """After every validation epoch, checks that the model's :class:`~lightning_ortho.flows.Glow` still inverts.

    The probe is the first ``num_images`` dequantised images the Glow sees in the epoch (a forward hook, on
    each process). Logged on every process with ``sync_dist`` (a metric logged on only some processes would
    hang DDP), computed by :mod:`lightning_ortho.flows.diagnostics`:

    * ``val_reconstruction_error``: ``max |decode(encode(y)) - y|`` (``inf`` where a Newton inverse failed;
      a warning says why); max over processes.
    * ``val_newton_failures``: pixels whose Newton solve did not converge (in the first layer that failed);
      summed over processes.
    * ``aux_jacobian_sign_flips`` (models with auxiliary 1x1 convolutions): the worst layer's fraction of
      pixels whose Jacobian determinant has the minority sign; nonzero means that layer is not invertible on
      this data. Max over processes.
    * ``min_invertibility_margin`` (models with ``aux_invertible`` layers): the smallest Theorem 2 margin
      ``3/2 lambda_min(W) - lambda_max(W)`` (positive: provably invertible). Min over processes.

    Nothing is logged during the sanity check, nor (with a warning) in an epoch where the Glow was not called
    as a module (``glow(y)``, ``glow.bits_per_dim(x)``), since the probe comes from its forward hook.

    Args:
        num_images: images in the probe (the first of the first validation batch).

    Raises:
        ValueError: ``num_images`` is not a positive integer; at setup, the model contains no Glow.
    """

    def __init__(self, num_images: int = 16) -> None:
        if not isinstance(num_images, int) or isinstance(num_images, bool) or num_images < 1:
            raise ValueError(
                "GlowInvertibilityCheck: num_images must be a positive integer (images in the probe), "
                f"got {num_images!r}."
            )
        super().__init__(num_images)
        self.num_images = num_images

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        y = self._probe.take(type(self).__name__)
        if y is None:
            return
        glow = self._glow
        margin = diagnostics.min_invertibility_margin(glow)
        if margin is not None:
            pl_module.log("min_invertibility_margin", margin, sync_dist=True, reduce_fx="min")
        if diagnostics.has_auxiliary_conv1x1(glow):
            flips = diagnostics.jacobian_sign_flips(glow, y)
            pl_module.log("aux_jacobian_sign_flips", flips, sync_dist=True, reduce_fx="max")
        result = diagnostics.reconstruction(glow, y)
        if not result.ok:
            warnings.warn(
                f"GlowInvertibilityCheck: epoch {trainer.current_epoch}: the Glow does not invert its validation "
                f"probe ({result.newton_failures} Newton solves failed). Its 1x1 convolutions may have stopped being "
                "invertible; conv1x1='aux_invertible' is invertible by construction.",
                stacklevel=2,
            )
        pl_module.log("val_newton_failures", float(result.newton_failures), sync_dist=True, reduce_fx="sum")
        pl_module.log("val_reconstruction_error", result.max_error, sync_dist=True, reduce_fx="max")
