"""A small convolutional classifier: the model the compression recipe trains and compresses."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from lightning_ortho.models.classification import ClassifierModule
from lightning_ortho.models.optimizers import build_optimizer


class ConvClassifier(ClassifierModule):
    """``len(channels)`` blocks of a 3x3 convolution (padding 1), ReLU and 2x2 max pooling, then a hidden linear
    layer with ReLU and a linear head: for 8x8 digits with ``channels=(16, 32, 32)``, 8x8 -> 4x4 -> 2x2 -> 1x1.

    Args:
        in_features: the pixels of one input, ``in_channels * side^2`` (linked from the data module by the CLI,
            as for the fully connected models); inputs may come flattened or as images.
        num_classes: output classes.
        in_channels: channels of the images (1 for digits and MNIST, 3 for CIFAR-10).
        channels: output channels of the convolution blocks.
        hidden: width of the hidden linear layer.
        lr: Adam learning rate.

    Raises:
        ValueError: ``in_features`` is not ``in_channels`` times a square, or the image is too small for the blocks'
            poolings (each halves the side).
    """

    def __init__(
        self,
        in_features: int = 64,
        num_classes: int = 10,
        in_channels: int = 1,
        channels: Sequence[int] = (16, 32, 32),
        hidden: int = 64,
        lr: float = 1e-3,
    ) -> None:
        super().__init__(num_classes)
        self.save_hyperparameters()
        side = math.isqrt(in_features // in_channels) if in_features % in_channels == 0 else 0
        if side < 1 or in_channels * side * side != in_features:
            raise ValueError(
                f"ConvClassifier: in_features={in_features} is not in_channels={in_channels} times a square image."
            )
        if side >> len(channels) < 1:
            raise ValueError(
                f"ConvClassifier: a {side}x{side} image is too small for {len(channels)} blocks (each pools 2x2); "
                "use fewer channels entries or larger images."
            )
        self.in_channels, self.side = in_channels, side
        layers: list[nn.Module] = []
        previous = in_channels
        for width in channels:
            layers += [nn.Conv2d(previous, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            previous = width
        self.features = nn.Sequential(*layers)
        flat = previous * (side >> len(channels)) ** 2
        self.classifier = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, in_features)`` vectors or ``(N, in_channels, side, side)`` images ``-> (N, num_classes)`` logits."""
        images = x.reshape(x.shape[0], self.in_channels, self.side, self.side)
        return self.classifier(self.features(images).flatten(1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(type(self).__name__, torch.optim.Adam, self.parameters(), lr=self.hparams.lr)
