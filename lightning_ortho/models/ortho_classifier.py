"""The paper's fully connected classifier with SVD-parametrised layers (Appendix B.1)."""

from __future__ import annotations

import time

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import nn

from lightning_ortho.nn import SVDLinear
from lightning_ortho.nn.orthogonal import OrthogonalMethod


class OrthoClassifier(pl.LightningModule):
    """``depth`` SVD layers ``U Sigma V^T`` of width ``in_features`` with ReLU between, then a linear layer.

    Args:
        in_features: input dimension ``d`` (784 for MNIST; linked from the data module by the CLI).
        num_classes: output classes.
        depth: number of SVD layers (3 in the paper).
        orthogonal: map for ``U`` and ``V``: ``"aux"`` (one auxiliary reflection each), ``"householder"``
            (``d`` reflections), ``"cayley"``, ``"matrix_exp"`` or ``"torch_householder"``.
        lr: Adam learning rate (PyTorch defaults otherwise, as in the paper).

    Logs ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``, ``test_acc`` and ``epoch_time`` (seconds).
    """

    def __init__(
        self,
        in_features: int = 64,
        num_classes: int = 10,
        depth: int = 3,
        orthogonal: OrthogonalMethod = "aux",
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(SVDLinear(in_features, in_features, orthogonal=orthogonal))
            if i < depth - 1:
                layers.append(nn.ReLU())
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(in_features, num_classes)
        metric = lambda: torchmetrics.classification.MulticlassAccuracy(num_classes=num_classes, average="micro")  # noqa: E731
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()
        self._epoch_start = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, in_features) -> (N, num_classes)`` logits (images are flattened)."""
        return self.head(torch.relu(self.features(x.flatten(1))))

    def _step(
        self, batch: tuple[torch.Tensor, torch.Tensor], stage: str, accuracy: torchmetrics.Metric
    ) -> torch.Tensor:
        inputs, labels = batch
        logits = self(inputs)
        loss = nn.functional.cross_entropy(logits, labels)
        accuracy(logits, labels)
        on_step = stage == "train"
        self.log(f"{stage}_loss", loss, on_step=on_step, on_epoch=True, prog_bar=stage != "test", sync_dist=not on_step)
        self.log(f"{stage}_acc", accuracy, on_step=False, on_epoch=True, prog_bar=stage != "train")
        return loss

    def training_step(self, batch, batch_idx):  # noqa: D102
        return self._step(batch, "train", self.train_acc)

    def validation_step(self, batch, batch_idx):  # noqa: D102
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx):  # noqa: D102
        self._step(batch, "test", self.test_acc)

    def on_train_epoch_start(self) -> None:
        self._epoch_start = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        self.log("epoch_time", time.perf_counter() - self._epoch_start, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
