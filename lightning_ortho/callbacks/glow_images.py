"""Saves grids of a Glow's samples and reconstructions as PNG after every validation epoch."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lightning_ortho._extras import require
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks._glow_probe import GlowProbeCallback
from lightning_ortho.nn import NewtonInverseError

_NEEDS_TORCHVISION = "GlowImageGrids draws its image grids"


class GlowImageGrids(GlowProbeCallback):
    """After every validation epoch, writes ``samples-epochEEE.png`` and ``reconstructions-epochEEE.png`` under
    ``<log_dir>/images/`` (rank zero only), and hands them to the logger when it takes images (TensorBoard).

    * samples: ``num_samples`` images ``glow.sample(num_samples, temperature) + 1/2``, 6 per row. With ``seed``
      the latent noise is the same every epoch (drawn from a forked RNG, so training's random stream is
      untouched); ``seed=None`` draws from the global RNG.
    * reconstructions: the first ``num_reconstructions`` dequantised validation images the Glow saw in the
      epoch (a forward hook), then their ``decode(encode(y))``, 8 per row.

    A grid whose Newton inverse fails is skipped (:class:`GlowInvertibilityCheck` reports failures).
    Nothing is written during the sanity check.

    Args:
        num_samples: samples per grid (0: no sample grid).
        temperature: prior temperature of the samples (>= 0).
        num_reconstructions: images in the reconstruction grid (0: no reconstruction grid).
        seed: seed of the samples' latent noise, or ``None``.

    Raises:
        ValueError: a count that is not a non-negative integer, both counts 0, or a negative or non-finite
            temperature; at setup, the model contains no Glow.
        MissingExtraError: torchvision is not installed (the ``vision`` extra), when the callback is made.
    """

    def __init__(
        self, num_samples: int = 36, temperature: float = 0.7, num_reconstructions: int = 16, seed: int | None = 0
    ) -> None:
        for name, value in (("num_samples", num_samples), ("num_reconstructions", num_reconstructions)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"GlowImageGrids: {name} must be a non-negative integer, got {value!r}.")
        if num_samples == 0 and num_reconstructions == 0:
            raise ValueError("GlowImageGrids: num_samples and num_reconstructions are both 0; remove the callback.")
        if not isinstance(temperature, int | float) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(
                f"GlowImageGrids: temperature must be a finite number >= 0 (e.g. 0.7), got {temperature!r}."
            )
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"GlowImageGrids: seed must be an integer or None, got {seed!r}.")
        require("torchvision.utils", _NEEDS_TORCHVISION)  # now, not after the first epoch of training
        super().__init__(num_reconstructions)
        self.num_samples, self.temperature = num_samples, float(temperature)
        self.num_reconstructions, self.seed = num_reconstructions, seed

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        # trainer.log_dir broadcasts under DDP: read it on every process, then write on rank zero only.
        folder = Path(trainer.log_dir or trainer.default_root_dir) / "images"
        if not trainer.is_global_zero:
            return
        grids = {}
        y = self._probe.take(type(self).__name__) if self.num_reconstructions else None
        if y is not None:
            try:
                grids["reconstructions"] = (torch.cat([y, self._glow.reconstruct(y)]) + 0.5).clamp(0, 1), 8
            except NewtonInverseError:
                pass
        if self.num_samples:
            try:
                grids["samples"] = (self._sample(pl_module.device) + 0.5).clamp(0, 1), 6
            except NewtonInverseError:
                pass
        self._save(grids, folder, trainer)

    def _sample(self, device: torch.device) -> torch.Tensor:
        if self.seed is None:
            return self._glow.sample(self.num_samples, self.temperature)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            return self._glow.sample(self.num_samples, self.temperature)

    @staticmethod
    def _save(grids: dict[str, tuple[torch.Tensor, int]], folder: Path, trainer: pl.Trainer) -> None:
        utils = require("torchvision.utils", _NEEDS_TORCHVISION)
        make_grid, save_image = utils.make_grid, utils.save_image

        folder.mkdir(parents=True, exist_ok=True)
        experiment = getattr(trainer.logger, "experiment", None)
        for name, (images, nrow) in grids.items():
            grid = make_grid(images.float().cpu(), nrow=nrow, padding=1)
            save_image(grid, folder / f"{name}-epoch{trainer.current_epoch:03d}.png")
            if hasattr(experiment, "add_image"):
                experiment.add_image(name, grid, trainer.global_step)
