"""Affine coupling (Dinh et al. 2017) as in Glow: half the channels scale and shift the other half."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.flows.base import FlowLayer, check_images


class ZeroConv2d(nn.Module):
    """3x3 convolution initialised to zero with a learned output scale ``exp(3 s)`` (Glow): the layer it
    ends starts as the identity.

    Args:
        in_channels: input channels.
        out_channels: output channels.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)
        self.log_scale = nn.Parameter(torch.zeros(1, out_channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``conv3x3(x) * exp(3 s)`` per output channel (padding 1): ``(N, in, H, W) -> (N, out, H, W)``; zero
        at init.

        Args:
            x: ``(N, in_channels, H, W)``.

        Returns:
            ``(N, out_channels, H, W)``.
        """
        return self.conv(x) * torch.exp(3.0 * self.log_scale)


class AffineCoupling(FlowLayer):
    """``y_a = x_a``, ``y_b = (x_b + t(x_a)) * sigmoid(r(x_a) + 2)``; ``log|det| = sum log sigmoid(r + 2)``.

    ``x_a`` is the first ``C - C // 2`` channels. The network (conv 3x3, ReLU, conv 1x1, ReLU, zero-initialised
    conv 3x3) starts at ``t = 0`` and scale ``sigmoid(2)``, close to the identity, as in Glow.

    Shapes: ``(N, C, H, W) -> (N, C, H, W)``, log-det ``(N,)``; needs ``C >= 2``.

    Args:
        channels: ``C``, the channels of the images (at least 2).
        hidden_channels: width of the coupling network.

    Raises:
        ValueError: fewer than 2 channels.
    """

    def __init__(self, channels: int, hidden_channels: int = 64) -> None:
        super().__init__()
        if channels < 2:
            raise ValueError(f"AffineCoupling: needs at least 2 channels, got {channels} (squeeze first).")
        self.channels = channels
        self.split = channels - channels // 2
        passive, active = self.split, channels // 2
        self.network = nn.Sequential(
            nn.Conv2d(passive, hidden_channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden_channels, hidden_channels, 1),
            nn.ReLU(),
            ZeroConv2d(hidden_channels, 2 * active),
        )

    def _shift_scale(self, x_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.network(x_a)
        shift, raw = h[:, 0::2], h[:, 1::2]
        return shift, torch.sigmoid(raw + 2.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``y = (x_a, (x_b + t(x_a)) * sigmoid(r(x_a) + 2))``, ``log_abs_det = sum log sigmoid(r(x_a) + 2)``.

        ``x_a`` is the first ``C - C // 2`` channels and passes unchanged; the network's output channels
        alternate shift ``t`` (even) and raw scale ``r`` (odd). The scale is below 1, so ``log_abs_det < 0``.

        Args:
            x: ``(N, C, H, W)``.

        Returns:
            ``y`` ``(N, C, H, W)`` and ``log_abs_det`` ``(N,)``, summed over the ``C // 2`` scaled channels and
                the pixels.

        Raises:
            TypeError: ``x`` is not floating point.
            ValueError: ``x`` is not ``(N, C, H, W)`` with this layer's ``C``.
        """
        check_images(x, self.channels, "AffineCoupling")
        x_a, x_b = x[:, : self.split], x[:, self.split :]
        shift, scale = self._shift_scale(x_a)
        y_b = (x_b + shift) * scale
        return torch.cat([x_a, y_b], dim=1), torch.log(scale).flatten(1).sum(1)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``x = (y_a, y_b / sigmoid(r(y_a) + 2) - t(y_a))``, exact: ``y_a = x_a`` gives back the same ``t``
        and ``r``.

        Args:
            y: ``(N, C, H, W)``.

        Returns:
            ``x`` ``(N, C, H, W)``.

        Raises:
            TypeError: ``y`` is not floating point.
            ValueError: ``y`` is not ``(N, C, H, W)`` with this layer's ``C``.
        """
        check_images(y, self.channels, "AffineCoupling.inverse")
        y_a, y_b = y[:, : self.split], y[:, self.split :]
        shift, scale = self._shift_scale(y_a)
        return torch.cat([y_a, y_b / scale - shift], dim=1)
