"""What every classifier of the package shares: cross-entropy, torchmetrics accuracy."""

from __future__ import annotations

import torch
import torchmetrics
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.models.factorized_checkpoint import RestoresFactorizedLayers


class ClassifierModule(RestoresFactorizedLayers, pl.LightningModule):
    """Base LightningModule for classification: subclasses implement ``forward(x) -> logits``. Checkpoints saved
    after :class:`~lightning_ortho.callbacks.TransformCompression` load by every route (see
    :class:`RestoresFactorizedLayers`).

    Logs ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``, ``test_loss``, ``test_acc`` (torchmetrics,
    reduced across processes under DDP). For wall time add Lightning's ``Timer`` callback
    (``timer.time_elapsed("train")``); the loggers also stamp every record with its wall time.

    Args:
        num_classes: number of classes of the accuracy metrics.
    """

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        metric = lambda: torchmetrics.classification.MulticlassAccuracy(num_classes=num_classes, average="micro")  # noqa: E731
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()

    def shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        inputs, labels = batch
        logits = self(inputs)
        loss = nn.functional.cross_entropy(logits.float(), labels)
        accuracy = getattr(self, f"{stage}_acc")
        accuracy(logits, labels)
        on_step = stage == "train"
        self.log(f"{stage}_loss", loss, on_step=on_step, on_epoch=True, prog_bar=stage != "test", sync_dist=not on_step)
        self.log(f"{stage}_acc", accuracy, on_step=False, on_epoch=True, prog_bar=stage != "train")
        return loss

    def training_step(self, batch, batch_idx):  # noqa: D102
        return self.shared_step(batch, "train")

    def validation_step(self, batch, batch_idx):  # noqa: D102
        self.shared_step(batch, "val")

    def test_step(self, batch, batch_idx):  # noqa: D102
        self.shared_step(batch, "test")

    def predict_step(self, batch, batch_idx):
        """``(N, num_classes)`` logits of the batch's inputs (labels, if the batch has them, are ignored)."""
        inputs = batch[0] if isinstance(batch, list | tuple) else batch
        return self(inputs)

    def prediction_record(self, outputs: list[torch.Tensor], targets: list[torch.Tensor | None]) -> dict:
        """What ``lightning-ortho predict`` saves (:class:`~lightning_ortho.callbacks.PredictionWriter`):
        ``logits`` ``(N, num_classes)``, ``predicted`` ``(N,)`` (the arg-max class) and, when every batch has
        labels, ``targets`` ``(N,)``."""
        logits = torch.cat(outputs)
        record = {"logits": logits, "predicted": logits.argmax(1)}
        if targets and all(t is not None for t in targets):
            record["targets"] = torch.cat(targets)  # type: ignore[arg-type]
        return record

    def prediction_summary(self, record: dict[str, torch.Tensor], reduce) -> str:
        """The accuracy of ``predicted`` against ``targets`` over all processes, or the count without labels."""
        predicted, targets = record["predicted"], record.get("targets")
        correct = float((predicted == targets).sum()) if targets is not None else 0.0
        correct, count = reduce(torch.tensor([correct, float(len(predicted))], dtype=torch.float64)).tolist()
        if targets is None:
            return f"{int(count)} samples predicted (the data has no labels: no accuracy)"
        return f"accuracy {correct / count:.4f} ({int(correct)} of {int(count)} labelled samples)"
