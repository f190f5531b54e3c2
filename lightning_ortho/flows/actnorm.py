"""Activation normalisation (Kingma & Dhariwal 2018): a per-channel affine map with data-dependent init."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from lightning_ortho.flows.base import FlowLayer, check_images


class ActNorm(FlowLayer):
    """``y = (x + b) * exp(s)`` per channel; ``log|det| = H W sum_c s_c``.

    The first forward pass in training mode sets ``b`` and ``s`` so that the batch's output has zero mean and
    unit variance per channel (data-dependent initialisation). Under ``torch.distributed`` the statistics
    are pooled over all processes (sums and counts), so every replica starts identical. Whether the init
    happened is a buffer, so a checkpoint never re-initialises.

    The initialisation refuses to be ruined by its batch:

    * an empty batch (on every process) leaves the layer uninitialised; the next batch initialises it;
    * a batch with NaN or inf raises ``ValueError`` and leaves it uninitialised;
    * with fewer than ``min_values`` values per channel (e.g. a few images at a 1x1 level) the statistics are too
      noisy to normalise by: the layer starts as the identity (``b = 0``, ``s = 0``) and warns. (Scales fitted to
      two images, compounded over the flow's ActNorms, sent validation bits/dim to 1e14.)
    * a channel whose standard deviation is below ``min_std`` is centred but not scaled (``s_c = 0``, with a
      warning): dividing by a near-zero spread multiplied it by up to ``1 / eps`` before.

    Args:
        channels: ``C``.
        eps: added to the standard deviation before taking ``-log``.
        min_std: smallest standard deviation a channel is scaled by.
        min_values: fewest values per channel (batch size times pixels, over all processes) to initialise from.

    Shapes: ``(N, C, H, W) -> (N, C, H, W)``, log-det ``(N,)``.
    """

    def __init__(self, channels: int, eps: float = 1e-6, min_std: float = 1e-2, min_values: int = 16) -> None:
        super().__init__()
        if not min_std >= 0:
            raise ValueError(f"ActNorm: min_std must be >= 0, got {min_std!r}.")
        if not isinstance(min_values, int) or min_values < 2:
            raise ValueError(f"ActNorm: min_values must be an integer >= 2, got {min_values!r}.")
        self.channels, self.eps, self.min_std, self.min_values = channels, eps, float(min_std), min_values
        self.bias = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.log_scale = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.register_buffer("initialized", torch.tensor(False))

    @torch.no_grad()
    def _initialize(self, x: torch.Tensor) -> None:
        # Sums and counts, not means: processes may hold batches of different sizes (or none).
        count = x.new_tensor(float(x.shape[0] * x.shape[2] * x.shape[3]))
        sums = torch.cat([x.sum(dim=(0, 2, 3)), (x * x).sum(dim=(0, 2, 3)), count.reshape(1)])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)
        total = float(sums[-1])
        if total == 0:
            return  # nothing seen anywhere: initialise on the next batch
        if not bool(torch.isfinite(sums).all()):
            raise ValueError(
                "ActNorm: the batch its data-dependent initialisation would use contains NaN or inf; the layer "
                "stays uninitialised. Check the data (and the layers before this one)."
            )
        if total < self.min_values:
            warnings.warn(
                f"ActNorm({self.channels}): {total:.0f} value(s) per channel in the initialisation batch (fewer than "
                f"min_values={self.min_values}) give no reliable statistics; starting as the identity. Use a larger "
                "batch for a data-dependent initialisation.",
                stacklevel=3,
            )
            self.initialized.fill_(True)
            return
        mean = sums[: self.channels] / total
        std = torch.sqrt(torch.clamp(sums[self.channels : 2 * self.channels] / total - mean * mean, min=0.0))
        flat = std < self.min_std
        if bool(flat.any()):
            warnings.warn(
                f"ActNorm({self.channels}): {int(flat.sum())} channel(s) of the initialisation batch have a standard "
                f"deviation below min_std={self.min_std:g}; they are centred but not scaled.",
                stacklevel=3,
            )
        log_scale = torch.where(flat, torch.zeros_like(std), -torch.log(std + self.eps))
        self.bias.copy_(-mean.reshape(1, -1, 1, 1))
        self.log_scale.copy_(log_scale.reshape(1, -1, 1, 1))
        self.initialized.fill_(True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``y = (x + b) * exp(s)`` per channel, ``log_abs_det = H W sum_c s_c`` (the same for every sample).

        In training mode, the first call on an uninitialised layer first sets ``b`` and ``s`` from the batch (see
        the class docstring).

        Args:
            x: ``(N, C, H, W)``.

        Returns:
            ``y`` ``(N, C, H, W)`` and ``log_abs_det`` ``(N,)``.

        Raises:
            TypeError: ``x`` is not floating point.
            ValueError: ``x`` is not ``(N, C, H, W)`` with this layer's ``C``, or the initialisation batch holds
                NaN/inf.
        """
        check_images(x, self.channels, "ActNorm")
        # Meta tensors (deferred initialisation, shape inference) have no statistics to start from: the layer stays
        # uninitialised and initialises on its first real batch.
        if self.training and not (x.is_meta or self.initialized.is_meta) and not bool(self.initialized):
            self._initialize(x)
        y = (x + self.bias) * torch.exp(self.log_scale)
        log_abs_det = (x.shape[2] * x.shape[3]) * self.log_scale.sum() * x.new_ones(x.shape[0])
        return y, log_abs_det

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``x = y * exp(-s) - b``: ``(N, C, H, W) -> (N, C, H, W)`` (never initialises the layer).

        Args:
            y: ``(N, C, H, W)``.

        Returns:
            ``x`` ``(N, C, H, W)``.

        Raises:
            TypeError: ``y`` is not floating point.
            ValueError: ``y`` is not ``(N, C, H, W)`` with this layer's ``C``.
        """
        check_images(y, self.channels, "ActNorm.inverse")
        return y * torch.exp(-self.log_scale) - self.bias
