"""Maximum-likelihood training of :class:`~lightning_ortho.flows.Glow` on any image data module."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_only

from lightning_ortho.flows import Glow, Invertible1x1Conv, bits_per_dim, dequantize
from lightning_ortho.flows.conv1x1 import Conv1x1Kind
from lightning_ortho.nn import NewtonInverseError


class GlowModule(pl.LightningModule):
    """Glow trained by maximum likelihood; logs bits/dim and image grids of samples and reconstructions.

    Args:
        in_channels, image_size, levels, steps, hidden_channels, conv1x1: the :class:`Glow`
            (``conv1x1``: ``plain``, ``lu``, ``householder``, ``aux``, ``aux_invertible``).
        num_levels: quantisation levels of the data (256 for 8-bit images, 17 for scikit-learn's digits);
            images must arrive in [0, 1] (data modules with standardisation turned off).
        lr: Adam learning rate, reached by a linear warm-up over ``warmup_steps`` optimizer steps.
        sample_temperature: temperature of the logged samples; num_samples: how many.

    Logs ``train_bpd``, ``val_bpd`` (the loss is bits/dim), ``val_reconstruction_error`` (max |x - f^-1(f(x))|
    on the first validation batch; for the auxiliary kinds the inverse is Newton's method),
    ``val_newton_failures`` (batches whose inverse did not converge), for the auxiliary kinds
    ``aux_jacobian_sign_flips`` (fraction of pixels whose Jacobian determinant has the minority sign in the
    worst layer: nonzero means that layer is not invertible on this data), and for ``aux_invertible`` the
    smallest Theorem 2 margin. Sample and reconstruction grids go to ``<log_dir>/images/`` as PNG and to the logger when it
    takes images (TensorBoard). Gradient clipping: the Trainer's ``gradient_clip_val``.
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
        sample_temperature: float = 0.7,
        num_samples: int = 36,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.glow = Glow(in_channels, image_size, levels, steps, hidden_channels, conv1x1)
        self._first_val_batch: torch.Tensor | None = None

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` log-density of dequantised images."""
        return self.glow(y)

    def _bits_per_dim(self, images: torch.Tensor) -> torch.Tensor:
        h = self.hparams
        log_density = self.glow(dequantize(images, h.num_levels))
        return bits_per_dim(log_density, self.glow.dims, h.num_levels).mean()

    def training_step(self, batch, batch_idx):  # noqa: D102
        bpd = self._bits_per_dim(batch[0])
        self.log("train_bpd", bpd, prog_bar=True, on_step=True, on_epoch=True)
        return bpd

    def validation_step(self, batch, batch_idx):  # noqa: D102
        if batch_idx == 0:
            self._first_val_batch = batch[0][:16].detach()
        self.log("val_bpd", self._bits_per_dim(batch[0]), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):  # noqa: D102
        self.log("test_bpd", self._bits_per_dim(batch[0]), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or self._first_val_batch is None:
            return
        if self.hparams.conv1x1 == "aux_invertible":
            margins = [m.invertibility_margin() for m in self.glow.modules() if isinstance(m, Invertible1x1Conv)]
            self.log("min_invertibility_margin", min(margins), sync_dist=True)
        failures, error = 0.0, float("nan")
        images = self._first_val_batch
        y = dequantize(images, self.hparams.num_levels, noise=torch.full_like(images, 0.5))
        if self.hparams.conv1x1 in ("aux", "aux_invertible"):
            self.log("aux_jacobian_sign_flips", self._jacobian_sign_flips(y), sync_dist=True)
        try:
            error = float((self.glow.reconstruct(y) - y).abs().max())
        except NewtonInverseError as exc:  # report, do not stop training
            failures = 1.0
            warnings.warn(f"GlowModule: reconstruction failed: {exc}", stacklevel=2)
        # Log unconditionally on every process: a metric logged with sync_dist on only some ranks would hang DDP.
        self.log("val_newton_failures", failures, sync_dist=True)
        self.log("val_reconstruction_error", error, sync_dist=True)  # NaN where the inverse failed
        # trainer.log_dir broadcasts under DDP: read it on every process, outside the rank-zero-only part.
        self._save_grids(images, y, Path(self.trainer.log_dir or self.trainer.default_root_dir) / "images")

    @torch.no_grad()
    def _jacobian_sign_flips(self, y: torch.Tensor) -> float:
        """Largest fraction, over the auxiliary 1x1 convolutions, of pixels whose Jacobian determinant has the
        minority sign (see :meth:`Invertible1x1Conv.jacobian_sign_flips`): nonzero means a layer is not
        provably invertible on this data and reconstructions may fail."""
        inputs: dict[Invertible1x1Conv, torch.Tensor] = {}
        hooks = [
            m.register_forward_hook(lambda mod, args, out: inputs.__setitem__(mod, args[0]))
            for m in self.glow.modules()
            if isinstance(m, Invertible1x1Conv)
        ]
        try:
            self.glow.encode(y)
        finally:
            for hook in hooks:
                hook.remove()
        return max(layer.jacobian_sign_flips(x) for layer, x in inputs.items())

    @rank_zero_only
    def _save_grids(self, images: torch.Tensor, y: torch.Tensor, folder: Path) -> None:
        from torchvision.utils import make_grid, save_image

        grids = {"reconstructions": None, "samples": None}
        try:
            grids["reconstructions"] = torch.cat([images, (self.glow.reconstruct(y) + 0.5).clamp(0, 1)])
            grids["samples"] = (
                self.glow.sample(self.hparams.num_samples, self.hparams.sample_temperature) + 0.5
            ).clamp(0, 1)
        except NewtonInverseError:
            pass
        folder.mkdir(parents=True, exist_ok=True)
        experiment = getattr(self.logger, "experiment", None)
        for name, grid_images in grids.items():
            if grid_images is None:
                continue
            grid = make_grid(grid_images.float().cpu(), nrow=8 if name == "reconstructions" else 6, padding=1)
            save_image(grid, folder / f"{name}-epoch{self.current_epoch:03d}.png")
            if hasattr(experiment, "add_image"):
                experiment.add_image(name, grid, self.global_step)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        warmup = max(1, self.hparams.warmup_steps)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
