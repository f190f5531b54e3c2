"""Write what ``predict`` computes to a file in the run directory, and summarise it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from lightning_ortho._lightning import Callback, every_package, pl, rank_zero_info

#: Sums a float64 tensor over the processes (the identity for one process); every process must call it.
Reduce = Callable[[torch.Tensor], torch.Tensor]


@runtime_checkable
class RecordsPredictions(Protocol):
    """What a LightningModule may declare to name and summarise its predictions for :class:`PredictionWriter`.

    ``prediction_record(outputs, targets)``: the dict of tensors to save, from ``outputs`` (what ``predict_step``
    returned for each batch, on the CPU, in order) and ``targets`` (each batch's labels: the second element of a
    ``(inputs, labels, ...)`` batch, or ``None``). ``prediction_summary(record, reduce)``: a short line about
    ``record``; figures summed over the processes go through ``reduce`` (a collective: call it on every process).
    """

    def prediction_record(
        self, outputs: list[Any], targets: list[torch.Tensor | None]
    ) -> dict[str, torch.Tensor]: ...  # pragma: no cover

    def prediction_summary(self, record: dict[str, torch.Tensor], reduce: Reduce) -> str: ...  # pragma: no cover


# Lightning's predict loop keeps the batch indices for writers of its own package: derive from every package's.
class PredictionWriter(*every_package("callbacks.BasePredictionWriter"), Callback):
    """Saves the outputs of ``predict`` as a dict of tensors (``torch.save``) and logs its path and a summary.

    The file is ``dirpath / filename`` (``predictions.pt`` in the run directory, ``trainer.log_dir``, by default).
    What it holds is the module's to say (:class:`RecordsPredictions`): lightning-ortho's classifiers save
    ``logits`` ``(N, classes)``, ``predicted`` ``(N,)`` and ``targets`` ``(N,)`` (when the data has labels) and
    report the accuracy; Glow saves ``bits_per_dim`` ``(N,)``; the fast transform ``codes`` ``(P, n)`` and
    per-row ``squared_error`` and ``squared_norm`` ``(P,)``; the online RNN ``outputs`` ``(streams, steps, outputs)``
    with ``targets`` and ``mask``. For any other module: a tensor per batch becomes ``predictions`` (batches
    joined along dim 0), a dict of tensors keeps its keys, the batches' labels become ``targets``; the summary is
    the accuracy where ``predictions`` are ``(N, classes)`` scores of labelled data, else the count.

    Under DDP every process writes its own part, ``predictions-rank{r}.pt`` (with ``index``, the dataset indices
    of its rows, where Lightning's sampler reports them); the summary's figures are summed over the processes.
    Several predict loaders write one file each (``predictions-dataloader{i}.pt``). Batches are kept on the CPU
    until the end of the pass.

    Args:
        dirpath: folder of the file (``None``: ``trainer.log_dir``, the logger's version folder, or
            ``default_root_dir`` without a logger); created if missing.
        filename: the file's name (``.pt``).
        verbose: log the path and the summary (rank zero, Lightning's info logger).

    After a pass, :attr:`paths` lists the files this process wrote and :attr:`summary` the summary line.

    Raises:
        ValueError: ``filename`` does not end in ``.pt``.
        TypeError: at the end of the pass, ``predict_step`` returned something other than a tensor or a dict of
            tensors and the module declares no ``prediction_record``.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "predictions.pt", verbose: bool = True) -> None:
        super().__init__(write_interval="batch")
        if not filename.endswith(".pt") or Path(filename).name != filename:
            raise ValueError(f"PredictionWriter: filename must be a file name ending in .pt, got {filename!r}.")
        self.dirpath, self.filename, self.verbose = dirpath, filename, verbose
        self.paths: list[Path] = []
        self.summary: str | None = None
        self._outputs: dict[int, list[Any]] = {}
        self._targets: dict[int, list[torch.Tensor | None]] = {}
        self._indices: dict[int, list[Sequence[int] | None]] = {}

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._outputs, self._targets, self._indices = {}, {}, {}
        self.paths, self.summary = [], None

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        """Keep the batch's outputs and labels (on the CPU) until the end of the pass."""
        self._outputs.setdefault(dataloader_idx, []).append(_to_cpu(prediction))
        self._targets.setdefault(dataloader_idx, []).append(_labels(batch))
        self._indices.setdefault(dataloader_idx, []).append(batch_indices)

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Write the file(s) and summarise (every process: the summary's sums and the run directory are collective)."""
        # trainer.log_dir is None without a logger (fast_dev_run turns loggers off): the run's root folder then
        folder = Path(self.dirpath or trainer.log_dir or trainer.default_root_dir)
        world, rank = trainer.world_size, trainer.global_rank
        reduce = _reducer(trainer, pl_module)
        lines = []
        for loader in sorted(self._outputs):
            record = _record(pl_module, self._outputs[loader], self._targets[loader])
            indices = self._indices[loader]
            # (loaders without a sampler, such as the online streams, report empty index lists: nothing to save)
            if world > 1 and indices and all(i is not None for i in indices) and any(len(i) for i in indices):
                record["index"] = torch.tensor([int(i) for batch in indices for i in batch], dtype=torch.long)
            stem = Path(self.filename).stem + (f"-dataloader{loader}" if len(self._outputs) > 1 else "")
            path = folder / (f"{stem}-rank{rank}.pt" if world > 1 else f"{stem}.pt")
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(record, path)
            self.paths.append(path)
            summarize = getattr(pl_module, "prediction_summary", None)
            summary = summarize(record, reduce) if callable(summarize) else default_summary(record, reduce)
            where = path if world == 1 else folder / f"{stem}-rank*.pt"
            lines.append(f"{where}: {summary}")
        self.summary = "; ".join(lines) if lines else "no batches were predicted"
        if self.verbose:
            rank_zero_info(f"PredictionWriter: wrote {self.summary}")
        self._outputs, self._targets, self._indices = {}, {}, {}


def join(outputs: list[Any], dim: int = 0) -> dict[str, torch.Tensor] | torch.Tensor:
    """Batches' outputs joined along ``dim``: tensors into one tensor, dicts of tensors key by key.

    Raises:
        TypeError: an output is neither (the message says what to return, or to declare ``prediction_record``).
    """
    if all(isinstance(o, torch.Tensor) for o in outputs):
        return torch.cat([o.reshape(1) if o.dim() == 0 else o for o in outputs], dim)
    if all(isinstance(o, dict) and all(isinstance(v, torch.Tensor) for v in o.values()) for o in outputs):
        return {key: torch.cat([o[key] for o in outputs], dim) for key in outputs[0]}
    kinds = sorted({type(o).__name__ for o in outputs})
    raise TypeError(
        f"PredictionWriter: predict_step returned {kinds}; return a tensor or a dict of tensors (batch first), or"
        " give the module a prediction_record(outputs, targets) method that builds the dict of tensors to save."
    )


def default_record(outputs: list[Any], targets: list[torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """The record of a module that declares none: ``predictions`` (or the dict's keys) and ``targets``."""
    joined = join(outputs)
    record = dict(joined) if isinstance(joined, dict) else {"predictions": joined}
    if targets and all(t is not None for t in targets) and "targets" not in record:
        record["targets"] = torch.cat(targets)  # type: ignore[arg-type]
    return record


def default_summary(record: dict[str, torch.Tensor], reduce: Reduce) -> str:
    """Accuracy where ``predictions`` are ``(N, classes)`` scores with ``(N,)`` integer ``targets``; else the count."""
    scores, targets = record.get("predictions"), record.get("targets")
    if scores is None:
        scores = next(iter(record.values()))
    labelled = (
        targets is not None
        and scores.dim() == 2
        and scores.is_floating_point()
        and targets.dim() == 1
        and not targets.is_floating_point()
        and len(targets) == len(scores)
    )
    if labelled:
        return accuracy_line(scores.argmax(1), targets, reduce)
    count = int(reduce(torch.tensor([float(len(scores))], dtype=torch.float64))[0])
    return f"{count} predictions"


def accuracy_line(predicted: torch.Tensor, targets: torch.Tensor, reduce: Reduce) -> str:
    """``"accuracy 0.9650 (260 of 270 labelled samples)"``, counted over all processes."""
    sums = reduce(torch.tensor([float((predicted == targets).sum()), float(len(targets))], dtype=torch.float64))
    correct, count = int(sums[0]), int(sums[1])
    accuracy = correct / count if count else float("nan")
    return f"accuracy {accuracy:.4f} ({correct} of {count} labelled samples)"


def _record(module: pl.LightningModule, outputs: list[Any], targets: list[torch.Tensor | None]) -> dict:
    build = getattr(module, "prediction_record", None)
    return build(outputs, targets) if callable(build) else default_record(outputs, targets)


def _reducer(trainer: pl.Trainer, module: pl.LightningModule) -> Reduce:
    if trainer.world_size == 1:
        return lambda t: t
    # float64 sums on the module's device (a NCCL collective needs CUDA tensors), returned on the CPU
    return lambda t: trainer.strategy.reduce(t.to(module.device), reduce_op="sum").cpu()


def _labels(batch: Any) -> torch.Tensor | None:
    """The labels of an ``(inputs, labels, ...)`` batch (same first dimension as the inputs), else ``None``."""
    if isinstance(batch, list | tuple) and len(batch) >= 2:
        inputs, labels = batch[0], batch[1]
        if isinstance(inputs, torch.Tensor) and isinstance(labels, torch.Tensor) and labels.dim() >= 1:
            if len(labels) == len(inputs):
                return labels.detach().cpu()
    return None


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value
