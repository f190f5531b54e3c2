"""The interface every flow layer follows: ``forward(x) -> (y, log_abs_det)`` and ``inverse(y) -> x``."""

from __future__ import annotations

import torch
from torch import nn


class FlowLayer(nn.Module):
    """An invertible map on ``(N, C, H, W)`` tensors with a tractable Jacobian determinant.

    ``forward(x)`` returns ``(y, log_abs_det)`` where ``log_abs_det`` has shape ``(N,)``: the log absolute
    determinant of ``dy/dx`` for each sample. ``inverse(y)`` returns ``x``. Layers compose
    (:class:`FlowSequence`) and are all tested the same way: the log-determinant against ``slogdet`` of the
    autograd Jacobian, and ``inverse(forward(x)) == x``.
    """

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - interface
        """``(y, log_abs_det)``: the map ``y = f(x)`` and ``log|det dy/dx|`` of each sample.

        What every flow layer implements. The monitors recognise a flow layer by this output: ``y`` with as many
        entries per sample as ``x`` and one log-determinant per sample.

        Args:
            x: ``(N, C, H, W)`` inputs.

        Returns:
            ``y`` (``(N, C', H', W')`` with ``C' H' W' = C H W``; most layers keep the shape) and
                ``log_abs_det`` ``(N,)``.
        """
        raise NotImplementedError

    def inverse(self, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """``x`` with ``forward(x)[0] == y``: the inverse map, of the shape of the input that gave ``y``.

        What every flow layer implements (:class:`~lightning_ortho.callbacks.InvertibilityMonitor` checks
        ``inverse(forward(x)[0]) == x``).

        Args:
            y: an output of :meth:`forward`.

        Returns:
            The preimage ``x``.
        """
        raise NotImplementedError


class FlowSequence(FlowLayer):
    """Layers applied in order; log-determinants add up, the inverse runs backwards.

    Args:
        *layers: the flow layers, in the order they apply.
    """

    def __init__(self, *layers: FlowLayer) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer in order: ``y = f_k(... f_1(x))``, ``log_abs_det = sum_i log|det J_{f_i}|``.

        Args:
            x: ``(N, C, H, W)`` inputs of the first layer.

        Returns:
            ``y``, the last layer's output, and the summed ``log_abs_det`` ``(N,)`` (zeros for no layers).
        """
        total = x.new_zeros(x.shape[0])
        for layer in self.layers:
            x, log_abs_det = layer(x)
            total = total + log_abs_det
        return x, total

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """Every layer's inverse in reverse order: ``x = f_1^{-1}(... f_k^{-1}(y))``.

        Args:
            y: an output of :meth:`forward`.

        Returns:
            ``x``, of the shape of the first layer's input.

        Raises:
            NewtonInverseError: from a layer whose iterative inverse did not converge (the auxiliary 1x1
                convolutions).
        """
        for layer in reversed(self.layers):
            y = layer.inverse(y)
        return y


def check_images(x: torch.Tensor, channels: int | None, layer: str, size: int | None = None) -> None:
    """Raise a clear error unless ``x`` is a floating ``(N, C, H, W)`` tensor with ``channels`` channels (and,
    given ``size``, ``H = W = size``)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{layer}: expected a floating-point (N, C, H, W) tensor, got {getattr(x, 'dtype', type(x))}.")
    if x.dim() != 4 or (channels is not None and x.shape[1] != channels):
        expected = f"(N, {channels}, H, W)" if channels is not None else "(N, C, H, W)"
        raise ValueError(f"{layer}: expected shape {expected}, got {tuple(x.shape)}.")
    if size is not None and tuple(x.shape[2:]) != (size, size):
        raise ValueError(
            f"{layer}: built for {size}x{size} images, got {x.shape[2]}x{x.shape[3]} (shape {tuple(x.shape)}). "
            f"Build it with image_size={x.shape[2]} if the images are square, or resize them to {size}x{size}."
        )
