"""Multi-scale Glow (Kingma & Dhariwal 2018) whose 1x1 convolutions can be auxiliary reflections."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lightning_ortho.flows.actnorm import ActNorm
from lightning_ortho.flows.base import FlowSequence, check_images
from lightning_ortho.flows.bits import bits_per_dim, dequantize
from lightning_ortho.flows.conv1x1 import Conv1x1Kind, invertible_1x1_conv
from lightning_ortho.flows.coupling import AffineCoupling
from lightning_ortho.flows.split import Split, gaussian_log_prob
from lightning_ortho.flows.squeeze import Squeeze
from lightning_ortho.nn._checks import check_positive_int


@dataclass
class Encoding:
    """``zs``: latents, one per split then the top one; ``log_det``: ``(N,)`` sum of log-determinants;
    ``log_prior``: ``(N,)`` log-density of all latents under their (conditional) priors."""

    zs: list[torch.Tensor]
    log_det: torch.Tensor
    log_prior: torch.Tensor

    @property
    def log_prob(self) -> torch.Tensor:
        """``(N,)``: the exact log-density of the encoded images, ``log_det + log_prior`` (nats; change of
        variables)."""
        return self.log_det + self.log_prior


class Glow(nn.Module):
    """``levels`` scales of ``Squeeze -> steps x [ActNorm, Invertible1x1Conv, AffineCoupling] -> Split``.

    Args:
        in_channels: image channels (1 for digits/MNIST, 3 for CIFAR-10).
        image_size: image side (needed to sample; must be divisible by ``2 ** levels``).
        levels: number of scales ``L``.
        steps: flow steps per scale ``K``.
        hidden_channels: coupling width ``C``.
        conv1x1: kind of the invertible 1x1 convolutions (see :func:`~lightning_ortho.flows.invertible_1x1_conv`).

    ``log_prob(y)`` is the exact log-density of dequantised images ``y`` (``(N,)`` nats);
    ``bits_per_dim(x, num_levels)`` dequantises ``x`` in [0, 1] and converts; ``sample(n, temperature)`` and
    ``reconstruct(x)`` invert the flow (Newton for the auxiliary kinds).
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int = 8,
        levels: int = 3,
        steps: int = 8,
        hidden_channels: int = 64,
        conv1x1: Conv1x1Kind = "lu",
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("image_size", image_size), ("levels", levels)):
            check_positive_int(value, name, "Glow")
        check_positive_int(steps, "steps", "Glow")
        check_positive_int(hidden_channels, "hidden_channels", "Glow")
        if image_size % (2**levels):
            raise ValueError(f"Glow: image_size {image_size} must be divisible by 2**levels = {2**levels}.")
        self.in_channels, self.image_size, self.conv1x1 = in_channels, image_size, conv1x1
        self.blocks = nn.ModuleList()
        self.splits = nn.ModuleList()
        channels = in_channels
        for level in range(levels):
            channels *= 4
            steps_ = [
                FlowSequence(
                    ActNorm(channels), invertible_1x1_conv(channels, conv1x1), AffineCoupling(channels, hidden_channels)
                )
                for _ in range(steps)
            ]
            self.blocks.append(FlowSequence(Squeeze(), *steps_))
            if level < levels - 1:
                self.splits.append(Split(channels))
                channels -= channels // 2
        self.top_shape = (channels, image_size // 2**levels, image_size // 2**levels)
        self.top_mean = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.top_log_std = nn.Parameter(torch.zeros(1, channels, 1, 1))

    @property
    def dims(self) -> int:
        """``C S^2``: the values per image, by which :meth:`bits_per_dim` divides."""
        return self.in_channels * self.image_size**2

    def encode(self, y: torch.Tensor) -> Encoding:
        """``(N, C, S, S)`` dequantised images -> latents, log-determinant and prior log-density."""
        check_images(y, self.in_channels, "Glow", self.image_size)  # bits/dim divide by this size's dims
        h, zs = y, []
        log_det = y.new_zeros(y.shape[0])
        log_prior = y.new_zeros(y.shape[0])
        for level, block in enumerate(self.blocks):
            h, step_log_det = block(h)
            log_det = log_det + step_log_det
            if level < len(self.splits):
                h, z_out, split_log_prob = self.splits[level](h)
                zs.append(z_out)
                log_prior = log_prior + split_log_prob
        zs.append(h)
        log_prior = log_prior + gaussian_log_prob(h, self.top_mean, self.top_log_std)
        return Encoding(zs, log_det, log_prior)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` log-density of dequantised images (nats), the training objective."""
        return self.encode(y).log_prob

    #: ``log_prob(y)``: :meth:`forward` under the name flow libraries use, the ``(N,)`` log-density in nats.
    log_prob = forward

    def decode(self, zs: list[torch.Tensor | None], temperature: float = 1.0) -> torch.Tensor:
        """Latents (``None`` entries are sampled from their prior at ``temperature``) -> images."""
        h = zs[-1]
        for level in reversed(range(len(self.blocks))):
            if level < len(self.splits):
                h = self.splits[level].inverse(h, zs[level], temperature)
            h = self.blocks[level].inverse(h)
        return h

    @torch.no_grad()
    def sample(self, n: int, temperature: float = 0.7) -> torch.Tensor:
        """``(n, C, S, S)`` samples in the dequantised space ``[-1/2, 1/2)`` (add 1/2 and clamp to view).

        Raises:
            ValueError: ``n`` is not a non-negative integer, or ``temperature`` is negative or not finite.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"Glow.sample: n must be a non-negative integer, got {n!r}.")
        if not (0.0 <= temperature < float("inf")):
            raise ValueError(f"Glow.sample: temperature must be a finite number >= 0, got {temperature!r}.")
        mean = self.top_mean.expand(n, *self.top_shape)
        top = mean + torch.exp(self.top_log_std) * temperature * torch.randn_like(mean)
        return self.decode([None] * len(self.splits) + [top], temperature)

    @torch.no_grad()
    def reconstruct(self, y: torch.Tensor) -> torch.Tensor:
        """``decode(encode(y))``: equals ``y`` up to the inverses' accuracy."""
        return self.decode(self.encode(y).zs)

    def bits_per_dim(self, x: torch.Tensor, num_levels: int = 256, noise: torch.Tensor | None = None) -> torch.Tensor:
        """``(N,)`` bits/dim of images ``x`` in [0, 1] quantised to ``num_levels`` (uniform dequantisation).

        Calls the module (``self(y)``), so forward hooks on the Glow see the dequantised batch ``y``.

        Raises:
            ValueError: values outside [0, 1] (see :func:`dequantize`), or not ``(N, C, S, S)``.
        """
        return bits_per_dim(self(dequantize(x, num_levels, noise)), self.dims, num_levels)
