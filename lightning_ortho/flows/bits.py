"""Uniform dequantisation and bits per dimension, so numbers compare with published ones."""

from __future__ import annotations

import math

import torch


def dequantize(x: torch.Tensor, num_levels: int, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Map images with values ``k / (L - 1)``, ``k in {0..L-1}`` (i.e. in [0, 1]), to ``(k + u) / L - 1/2``.

    ``u ~ U(0, 1)`` per entry (or ``noise``, for tests). The result lies in ``[-1/2, 1/2)``: the flow models a
    density on that cube and each discrete value owns a bin of width ``1 / L``. For 8-bit images
    ``num_levels = 256`` (``n_bits = 8``); for scikit-learn's digits (0..16) ``num_levels = 17``.

    Args:
        x: images with values in [0, 1].
        num_levels: ``L``, the number of discrete values.
        noise: optional ``u`` of ``x``'s shape, in ``[0, 1)``; ``None`` draws it.

    Raises:
        ValueError: values outside [0, 1] (did the data module standardise the images?).
    """
    if float(x.min()) < -1e-6 or float(x.max()) > 1 + 1e-6:
        raise ValueError(
            "dequantize: pixel values must lie in [0, 1] (k / (num_levels - 1)); got values in "
            f"[{float(x.min()):.3f}, {float(x.max()):.3f}]. Turn off standardisation in the data module."
        )
    levels = torch.round(x * (num_levels - 1))
    u = torch.rand_like(x) if noise is None else noise
    return (levels + u) / num_levels - 0.5


def bits_per_dim(log_density: torch.Tensor, dims: int, num_levels: int) -> torch.Tensor:
    """``(N,)`` bits per dimension of the discrete data from the log-density of its dequantised version.

    With ``y = (k + u) / L - 1/2``, ``P(k) >= E_u p(y) / L^D`` (Theis et al. 2016), so
    ``bits/dim = (-log p(y) + D log L) / (D log 2)``: the upper bound every flow paper reports.

    Args:
        log_density: ``(N,)`` ``log p(y)`` of the dequantised data, in nats.
        dims: ``D``, the dimensions of one sample (``C H W`` for images).
        num_levels: ``L``, the number of discrete values per dimension.
    """
    return (-log_density + dims * math.log(num_levels)) / (dims * math.log(2.0))
