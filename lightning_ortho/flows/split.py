"""Multi-scale split (Dinh et al. 2017) with a learned conditional prior, as in Glow."""

from __future__ import annotations

import math

import torch
from torch import nn

from lightning_ortho.flows.base import check_images
from lightning_ortho.flows.coupling import ZeroConv2d

LOG_2PI = math.log(2 * math.pi)


def gaussian_log_prob(z: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """``(N,)``: ``sum log N(z; mean, exp(log_std)^2)`` over all but the batch dimension.

    Args:
        z: ``(N, ...)`` values.
        mean: means, broadcast against ``z``.
        log_std: log standard deviations, broadcast against ``z``.
    """
    return (-0.5 * (LOG_2PI + 2 * log_std + (z - mean) ** 2 * torch.exp(-2 * log_std))).flatten(1).sum(1)


class Split(nn.Module):
    """Factor out half the channels: ``x -> (z_keep, z_out)`` with ``z_out ~ N(mean(z_keep), exp(log_std(z_keep)))``.

    ``forward(x) -> (z_keep, z_out, log_prob)`` where ``log_prob = log p(z_out | z_keep)`` per sample is the
    factored-out variables' contribution to the likelihood. ``inverse(z_keep, z_out=None, temperature=1)``
    puts them back; without ``z_out`` it samples from the prior with its standard deviation scaled by
    ``temperature``. The prior network is zero-initialised (standard normal at the start).

    Args:
        channels: channels of ``x`` (at least 2); ``z_keep`` holds the first ``channels - channels // 2``.

    Raises:
        ValueError: fewer than 2 channels.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        if channels < 2:
            raise ValueError(f"Split: needs at least 2 channels, got {channels}.")
        self.channels = channels
        self.keep = channels - channels // 2
        self.prior = ZeroConv2d(self.keep, 2 * (channels // 2))

    def _prior(self, z_keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.prior(z_keep)
        return h[:, 0::2], h[:, 1::2]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(z_keep, z_out, log_prob)``: the channels split in two and ``log p(z_out | z_keep)`` per sample.

        ``z_keep`` is the first ``channels - channels // 2`` channels; ``log_prob`` is the log-density of
        ``z_out`` under the diagonal Gaussian whose mean and log standard deviation the prior network computes
        from ``z_keep`` (its output channels alternate mean (even) and log standard deviation (odd)). Not a
        :class:`~lightning_ortho.flows.FlowLayer`: it returns three values (the split itself has ``log|det| = 0``).

        Args:
            x: ``(N, C, H, W)``.

        Returns:
            ``z_keep`` ``(N, C - C // 2, H, W)``, ``z_out`` ``(N, C // 2, H, W)`` and ``log_prob`` ``(N,)`` (nats).

        Raises:
            TypeError: ``x`` is not floating point.
            ValueError: ``x`` is not ``(N, C, H, W)`` with this layer's ``C``.
        """
        check_images(x, self.channels, "Split")
        z_keep, z_out = x[:, : self.keep], x[:, self.keep :]
        mean, log_std = self._prior(z_keep)
        return z_keep, z_out, gaussian_log_prob(z_out, mean, log_std)

    def inverse(
        self, z_keep: torch.Tensor, z_out: torch.Tensor | None = None, temperature: float = 1.0
    ) -> torch.Tensor:
        """``x = cat(z_keep, z_out)`` along the channels; without ``z_out``, ``z_out`` is drawn from the prior.

        Args:
            z_keep: ``(N, C - C // 2, H, W)``, the kept channels.
            z_out: ``(N, C // 2, H, W)``, the factored-out channels; ``None`` samples them as
                ``mean + exp(log_std) * temperature * eps`` with ``eps ~ N(0, I)`` (``torch.randn_like``, the
                global generator) and the prior's ``mean`` and ``log_std`` at ``z_keep``.
            temperature: scale of the prior's standard deviation when sampling (``0``: its mean).

        Returns:
            ``x`` ``(N, C, H, W)``.

        Raises:
            TypeError: ``z_keep`` or ``z_out`` is not floating point.
            ValueError: ``z_keep`` is not ``(N, C - C // 2, H, W)``, or ``z_out`` not ``(N, C // 2, H, W)`` of the
                same ``N``, ``H``, ``W``.
        """
        check_images(z_keep, self.keep, "Split.inverse (z_keep)")
        if z_out is not None:
            check_images(z_out, self.channels // 2, "Split.inverse (z_out)")
            if z_out.shape[0] != z_keep.shape[0] or z_out.shape[2:] != z_keep.shape[2:]:
                raise ValueError(
                    f"Split.inverse: z_keep {tuple(z_keep.shape)} and z_out {tuple(z_out.shape)} must share the batch"
                    " and the image size; pass the pair Split.forward returned."
                )
        if z_out is None:
            mean, log_std = self._prior(z_keep)
            z_out = mean + torch.exp(log_std) * temperature * torch.randn_like(mean)
        return torch.cat([z_keep, z_out], dim=1)
