"""Logs whether a Glow still inverts on validation data: the validation-time variant of the invertibility monitors."""

from __future__ import annotations

import math
import warnings

import torch

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks._glow_probe import GlowProbeCallback
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.flows import AuxiliaryReflectionConv1x1
from lightning_ortho.nn.eval_mode import eval_mode


class GlowInvertibilityCheck(GlowProbeCallback):
    """After every validation epoch, checks that the model's :class:`~lightning_ortho.flows.Glow` still inverts.

    The validation-time variant of what the Glow recipes watch during training with
    :class:`~lightning_ortho.callbacks.InvertibilityMonitor` (``modules=["glow"]``) and
    :class:`~lightning_ortho.callbacks.JacobianDeterminantMonitor` (on the 1x1 convolutions): the numbers are
    computed by those monitors' measurements, on held-out images and under the names this callback has always
    logged. Use it to report invertibility per epoch on validation data; it adds nothing to the monitors'
    training-time numbers.

    The probe is the first ``num_images`` dequantised images the Glow sees in the epoch (a forward hook, on
    each process). Logged on every process with ``sync_dist`` (a metric logged on only some processes would
    hang DDP):

    * ``val_reconstruction_error``: ``max |decode(encode(y)) - y|`` (``inf`` where a Newton inverse failed;
      a warning says why), the monitor's ``roundtrip_abs_error_max``; max over processes.
    * ``val_newton_failures``: pixels whose Newton solve did not converge (in the first layer that failed);
      summed over processes.
    * ``aux_jacobian_sign_flips`` (models with auxiliary 1x1 convolutions): the worst layer's fraction of
      pixels whose Jacobian determinant has the minority sign, ``min(p, 1 - p)`` of the Jacobian monitor's
      ``pixel_negative_fraction`` ``p`` on that layer's input while the probe is encoded; nonzero means that
      layer is not invertible on this data. Max over processes.
    * ``min_invertibility_margin`` (models with ``aux_invertible`` layers): the smallest Theorem 2 margin
      ``3/2 lambda_min(W) - lambda_max(W)`` (positive: provably invertible), the monitor's ``theorem2_margin``.
      Min over processes.

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
        # Used for their measurements only (never registered with the Trainer).
        self._roundtrip = InvertibilityMonitor(probe_size=num_images, plot=False)
        self._jacobians = JacobianDeterminantMonitor(probe_size=num_images, plot=False)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        y = self._probe.take(type(self).__name__)
        if y is None:
            return
        glow = self._glow
        convs = {name: m for name, m in glow.named_modules() if isinstance(m, AuxiliaryReflectionConv1x1)}
        inputs: dict[str, torch.Tensor] = {}

        def keep_input(name: str):  # noqa: ANN202 - a forward hook that returns None (the output stays)
            def hook(module: torch.nn.Module, args: tuple, output: object) -> None:
                inputs.setdefault(name, args[0])

            return hook

        hooks = [conv.register_forward_hook(keep_input(name)) for name, conv in convs.items()]
        # decode(encode(y)): the encoder's pass gives each 1x1 convolution's input to the hooks
        with eval_mode(glow):
            try:
                roundtrip = self._roundtrip.measure("glow", glow, y)
                fractions = [
                    self._jacobians.measure(name, convs[name], x)["pixel_negative_fraction"].value
                    for name, x in inputs.items()
                ]
            finally:
                for hook in hooks:
                    hook.remove()
        if "theorem2_margin" in roundtrip:
            pl_module.log(
                "min_invertibility_margin", roundtrip["theorem2_margin"].value, sync_dist=True, reduce_fx="min"
            )
        if convs:
            flips = max((min(p, 1.0 - p) for p in fractions), default=0.0)
            pl_module.log("aux_jacobian_sign_flips", flips, sync_dist=True, reduce_fx="max")
        failures = roundtrip["newton_failures"].value if "newton_failures" in roundtrip else 0.0
        error = roundtrip["roundtrip_abs_error_max"].value
        if failures or not math.isfinite(error):
            warnings.warn(
                f"GlowInvertibilityCheck: epoch {trainer.current_epoch}: the Glow does not invert its validation "
                f"probe ({int(failures)} Newton solves failed). Its 1x1 convolutions may have stopped being "
                "invertible; conv1x1='aux_invertible' is invertible by construction.",
                stacklevel=2,
            )
        pl_module.log("val_newton_failures", float(failures), sync_dist=True, reduce_fx="sum")
        pl_module.log("val_reconstruction_error", error, sync_dist=True, reduce_fx="max")
