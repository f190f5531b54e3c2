"""Activation normalisation (Kingma & Dhariwal 2018): a per-channel affine map with data-dependent init."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lightning_ortho.flows.base import FlowLayer, check_images


class ActNorm(FlowLayer):
    """``y = (x + b) * exp(s)`` per channel; ``log|det| = H W sum_c s_c``.

    The first forward pass in training mode sets ``b`` and ``s`` so that the batch's output has zero mean and
    unit variance per channel (data-dependent initialisation). Under ``torch.distributed`` the statistics
    are averaged over all processes, so every replica starts identical. Whether the init happened is a
    buffer, so a checkpoint never re-initialises.

    Shapes: ``(N, C, H, W) -> (N, C, H, W)``, log-det ``(N,)``.
    """

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.channels, self.eps = channels, eps
        self.bias = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.log_scale = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.register_buffer("initialized", torch.tensor(False))

    @torch.no_grad()
    def _initialize(self, x: torch.Tensor) -> None:
        moments = torch.stack([x.mean(dim=(0, 2, 3)), (x * x).mean(dim=(0, 2, 3))])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(moments)
            moments /= dist.get_world_size()
        mean, second = moments
        std = torch.sqrt(torch.clamp(second - mean * mean, min=0.0)) + self.eps
        self.bias.copy_(-mean.reshape(1, -1, 1, 1))
        self.log_scale.copy_(-torch.log(std).reshape(1, -1, 1, 1))
        self.initialized.fill_(True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_images(x, self.channels, "ActNorm")
        if self.training and not bool(self.initialized):
            self._initialize(x)
        y = (x + self.bias) * torch.exp(self.log_scale)
        log_abs_det = (x.shape[2] * x.shape[3]) * self.log_scale.sum() * x.new_ones(x.shape[0])
        return y, log_abs_det

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        check_images(y, self.channels, "ActNorm.inverse")
        return y * torch.exp(-self.log_scale) - self.bias
