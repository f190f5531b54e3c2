"""What TransformCompression measures and prints: its metric over the validation data, and the report table."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from lightning_ortho._lightning import MisconfigurationException, pl, rank_zero_only
from lightning_ortho.nn.eval_mode import eval_mode

#: ``metric(pl_module, batch) -> (total, count)``: summed over batches and processes, the metric is total / count.
Metric = Callable[[pl.LightningModule, Any], tuple[torch.Tensor | float, int]]


def accuracy_metric(pl_module: pl.LightningModule, batch: Any) -> tuple[torch.Tensor, int]:
    """Default metric: batch ``(inputs, labels, ...)``, ``pl_module(inputs)`` logits ``(N, C)``; returns
    ``(correct, N)`` (the micro accuracy that ``ClassifierModule`` logs as ``val_acc``)."""
    inputs, labels = batch[0], batch[1]
    logits = pl_module(inputs)
    return (logits.argmax(dim=-1) == labels).sum(), labels.numel()


def validation_loaders(trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[Any]:
    """The trainer's validation dataloaders, else the data module's (or the model's) ``val_dataloader()``; ``[]``
    when there are none."""
    loaders = trainer.val_dataloaders
    if loaders is None:
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        try:
            loaders = source.val_dataloader()
        except (AttributeError, NotImplementedError, MisconfigurationException):
            loaders = None
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, list | tuple) else [loaders]


def evaluate_metric(trainer: pl.Trainer, pl_module: pl.LightningModule, metric: Metric) -> float | None:
    """``sum(total) / sum(count)`` of ``metric`` over every batch of the validation dataloaders (summed across
    processes; the model in eval mode, each submodule back in its own mode afterwards), or ``None`` (with a
    warning) when there is no validation data."""
    loaders = validation_loaders(trainer, pl_module)
    if not loaders:
        warnings.warn("TransformCompression: no validation dataloader; the metric is not measured.", stacklevel=3)
        return None
    sums = torch.zeros(2, dtype=torch.float64)
    # eval_mode gives every submodule its own mode back through its train(mode): a train() override's side
    # effects (a noise level, a frozen part) are those of training again for the fine-tuning epochs.
    with eval_mode(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
        for index, loader in enumerate(loaders):
            for batch in loader:
                batch = trainer.strategy.batch_to_device(batch, dataloader_idx=index)
                total, count = metric(pl_module, batch)
                sums += torch.tensor([float(total), float(count)], dtype=torch.float64)
    dtype = torch.float32 if pl_module.device.type == "mps" else torch.float64  # MPS has no float64
    sums = trainer.strategy.reduce(sums.to(device=pl_module.device, dtype=dtype), reduce_op="sum")
    return float(sums[0] / sums[1]) if float(sums[1]) > 0 else None


@rank_zero_only
def print_report(report: list[dict], metric_name: str, before: float | None, after: float | None) -> None:
    """A rich table of the compressed layers (sizes, codes, blocks, error, operations) under the metric's change."""
    from rich.console import Console
    from rich.table import Table

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    table = Table(title=f"TransformCompression ({metric_name}: {fmt(before)} -> {fmt(after)})")
    for column in ("module", "type", "in -> out", "s", "blocks", "error %", "ops before", "ops after", "ratio"):
        table.add_column(column, justify="left" if column in ("module", "type") else "right")
    for row in report:
        ops = lambda k: row[f"{k}_additions"] + row[f"{k}_multiplications"] + row[f"{k}_shifts"]  # noqa: E731
        table.add_row(
            row["module"],
            row["type"],
            f"{row['in_features']} -> {row['out_features']}",
            str(row["s"]),
            str(row["blocks"]),
            f"{row['error']:.2f}",
            str(ops("dense_ops")),
            str(ops("factorized_ops")),
            f"{row['ops_ratio']:.3f}",
        )
    Console().print(table)
