"""Space-to-depth: each 2x2 spatial block becomes 4 channels (Dinh et al. 2017)."""

from __future__ import annotations

import torch

from lightning_ortho.flows.base import FlowLayer, check_images


class Squeeze(FlowLayer):
    """``(N, C, H, W) -> (N, 4C, H/2, W/2)``, a permutation of the entries: ``log|det| = 0``.

    Raises:
        ValueError: ``H`` or ``W`` is odd.
    """

    log_abs_det_is_zero = True  # a permutation of the entries

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Space-to-depth: ``y[n, 4 c + 2 i + j, h, w] = x[n, c, 2 h + i, 2 w + j]`` for ``i, j`` in ``{0, 1}``.

        Args:
            x: ``(N, C, H, W)`` with even ``H`` and ``W``.

        Returns:
            ``y`` ``(N, 4 C, H / 2, W / 2)`` and ``log_abs_det`` ``(N,)`` zeros (a permutation of the entries).

        Raises:
            TypeError: ``x`` is not floating point.
            ValueError: ``x`` is not 4-dimensional, or ``H`` or ``W`` is odd.
        """
        check_images(x, None, "Squeeze")
        n, c, h, w = x.shape
        if h % 2 or w % 2:
            raise ValueError(f"Squeeze: height and width must be even, got {h}x{w}; pad or resize the images.")
        y = x.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(n, 4 * c, h // 2, w // 2)
        return y, x.new_zeros(n)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """Depth-to-space, the inverse of :meth:`forward`: ``(N, 4 C, H, W) -> (N, C, 2 H, 2 W)``.

        Args:
            y: ``(N, 4 C, H, W)``; its channels must be a multiple of 4.

        Returns:
            ``x`` ``(N, C, 2 H, 2 W)``.

        Raises:
            TypeError: ``y`` is not floating point.
            ValueError: ``y`` is not 4-dimensional, or its channels are not a multiple of 4.
        """
        check_images(y, None, "Squeeze.inverse")
        n, c4, h, w = y.shape
        if c4 % 4:
            raise ValueError(
                f"Squeeze.inverse: the channels must be a multiple of 4 (each pixel's 2x2 block), got {c4} in shape "
                f"{tuple(y.shape)}; pass the output of Squeeze.forward."
            )
        c = c4 // 4
        return y.reshape(n, c, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(n, c, 2 * h, 2 * w)
