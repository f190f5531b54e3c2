"""A monitor's values: one statistic as measured on one process (:class:`Measurement`), its reduction across
processes, and logging the reduced values the way Lightning logs ``self.log(..., on_step=True)`` values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from lightning_ortho._lightning import pl

Reduction = Literal["mean", "sum", "min", "max"]


@dataclass(frozen=True)
class Measurement:
    """One statistic of one module: its value on this process's probe, how processes combine, and this process's
    weight: in a ``"mean"`` its number of probe rows; for every reduction, ``0`` says that the statistic is not
    defined on this process (e.g. the sign of ``det J`` where it is unknown). A statistic with weight 0 on every
    process is not logged; under DDP each process returns the same keys (the reductions must match), with weight 0
    where it has no value."""

    value: float
    reduce: Reduction = "mean"
    weight: float = 1.0


def reduce_measurement(trainer: pl.Trainer, measurement: Measurement) -> float | None:
    """The value across processes, or ``None`` where no process has one (weight 0 everywhere)."""
    present = measurement.weight > 0
    if trainer.world_size == 1:
        return float(measurement.value) if present else None
    # float64 on the wire, so a DDP run logs the single-process value to the last digits; one all-reduce of a pair
    # (value, presence) per statistic, so that a process without the value leaves it out.
    value, op = float(measurement.value), measurement.reduce
    if op == "mean":
        pair = [value * measurement.weight, measurement.weight] if present else [0.0, 0.0]
    elif op == "sum":
        pair = [value if present else 0.0, float(present)]
    elif op == "max":
        pair = [value if present else -math.inf, float(present)]
    else:  # min: the presence flag negated, so that min finds it
        pair = [value if present else math.inf, -float(present)]
    options = {"dtype": torch.float64, "device": trainer.strategy.root_device}
    total = trainer.strategy.reduce(torch.tensor(pair, **options), reduce_op="sum" if op == "mean" else op)
    reduced, count = float(total[0]), abs(float(total[1]))
    if count == 0:
        return None
    return reduced / count if op == "mean" else reduced


def logging_step(trainer: pl.Trainer, after_loop: bool = False) -> int:
    """The step at which Lightning logs the ``on_step`` values of the training batch that just ended:
    ``trainer.fit_loop.epoch_loop._batches_that_stepped`` (what ``self.log`` and ``LearningRateMonitor`` use; it
    counts batches that stepped the optimizer, so it differs from ``global_step`` under manual optimisation with
    several steps per batch). In a batch hook it is that batch's step; ``after_loop`` (``on_train_end``, when the
    loop has counted the last batch): the last batch's, one less."""
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    return max(step - 1, 0) if after_loop else step


def log_values(trainer: pl.Trainer, values: dict[str, float], step: int, prog_bar: bool) -> None:
    """Send reduced ``values`` to every logger at ``step`` (once: a measurement belongs to one step), into
    ``trainer.callback_metrics`` (for ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping``) and, with
    ``prog_bar``, into the progress bar's metrics."""
    if not values:
        return
    trainer.callback_metrics.update({key: torch.tensor(value) for key, value in values.items()})
    if prog_bar:
        trainer.progress_bar_metrics.update(values)
    for logger in trainer.loggers:
        logger.log_metrics(values, step=step)
