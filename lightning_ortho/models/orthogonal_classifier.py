"""The paper's fully connected classifier with SVD-parametrised layers (Appendix B.1)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.models.classification import ClassifierModule
from lightning_ortho.models.optimizers import build_optimizer
from lightning_ortho.nn import SVDLinear
from lightning_ortho.nn.orthogonal_maps import OrthogonalMethod


class OrthogonalClassifier(ClassifierModule):
    """``depth`` SVD layers ``U Sigma V^T`` of width ``in_features`` with ReLU between, then a linear layer.

    Args:
        in_features: input dimension ``d`` (784 for MNIST; linked from the data module by the CLI).
        num_classes: output classes.
        depth: number of SVD layers (3 in the paper).
        orthogonal: map for ``U`` and ``V``: ``"aux"`` (one auxiliary reflection each), ``"householder"``
            (``d`` reflections, compact WY), ``"cayley"``, ``"matrix_exp"`` or ``"torch_householder"``.
        lr: Adam learning rate (PyTorch defaults otherwise, as in the paper).

    Logs ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``, ``test_loss`` and ``test_acc``.
    """

    def __init__(
        self,
        in_features: int = 64,
        num_classes: int = 10,
        depth: int = 3,
        orthogonal: OrthogonalMethod = "aux",
        lr: float = 1e-3,
    ) -> None:
        super().__init__(num_classes)
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(SVDLinear(in_features, in_features, orthogonal=orthogonal))
            if i < depth - 1:
                layers.append(nn.ReLU())
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, in_features)`` (or images, flattened) ``-> (N, num_classes)`` logits."""
        return self.head(torch.relu(self.features(x.flatten(1))))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(type(self).__name__, torch.optim.Adam, self.parameters(), lr=self.hparams.lr)
