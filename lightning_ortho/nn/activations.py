"""Activations of the orthogonal recurrent networks, defined once for :mod:`lightning_ortho.nn` and
:mod:`lightning_ortho.online`."""

from __future__ import annotations

import torch


def modrelu(z: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``sign(z) relu(|z| + b)`` (Arjovsky et al. 2016, real case): keeps the sign, thresholds the magnitude.

    Args:
        z: ``(..., d)`` preactivations.
        bias: ``(d,)`` thresholds ``b``, broadcast over ``z``.

    Returns:
        A tensor of ``z``'s shape.
    """
    return torch.sign(z) * torch.relu(torch.abs(z) + bias)
