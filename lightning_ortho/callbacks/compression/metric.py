"""What TransformCompression scores the model with: a ``torchmetrics.Metric`` chosen and tried on one validation
batch before training, and its value over the validation data around the compression."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torchmetrics
from torchmetrics.classification import BinaryAccuracy, MulticlassAccuracy, MultilabelAccuracy

from lightning_ortho._lightning import every_package, pl, rank_zero_info
from lightning_ortho.nn.eval_mode import eval_mode

BatchKeys = tuple[int | str, int | str]

_ACCURACIES = (MulticlassAccuracy, BinaryAccuracy, MultilabelAccuracy)


def metric_name_of(metric: torchmetrics.Metric) -> str:
    """The name a metric is logged under when the user gives none: ``"val_acc"`` for an accuracy (what the
    package's classifiers log), else ``"val_"`` and the class name in snake case (``val_mean_squared_error``)."""
    if isinstance(metric, _ACCURACIES):
        return "val_acc"
    return "val_" + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(metric).__name__).lower()


def num_classes_of(pl_module: pl.LightningModule) -> int | None:
    """The module's ``num_classes`` (an attribute, else a saved hyperparameter) when it is an int >= 2."""
    value = getattr(pl_module, "num_classes", None)
    if value is None:
        value = getattr(pl_module, "hparams", {}).get("num_classes")
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 2
    return value if ok else None


def default_metric(pl_module: pl.LightningModule) -> tuple[torchmetrics.Metric | None, str | None, str]:
    """``(metric, name, where from)`` for ``metric="auto"``: a fresh copy of the module's own validation metric
    (its one ``torchmetrics.Metric`` attribute whose name starts with ``val``, and that name); else
    ``MulticlassAccuracy`` (micro, ``"val_acc"``) when the module declares ``num_classes``; else ``None, None`` and
    the reason."""
    own = [(name, child) for name, child in pl_module.named_children() if isinstance(child, torchmetrics.Metric)]
    validation = [(name, child) for name, child in own if name.startswith("val")]
    if len(validation) == 1:
        name, child = validation[0]
        copy = child.clone()  # the module's metric keeps its own state; the copy is never registered on the module
        copy.reset()
        return copy, name, f"the module's own {name} ({type(child).__name__})"
    num_classes = num_classes_of(pl_module)
    if num_classes is not None:
        metric = MulticlassAccuracy(num_classes=num_classes, average="micro")
        return metric, "val_acc", f"MulticlassAccuracy({num_classes}) from the module's num_classes"
    found = f" (it has {len(validation)}: {[n for n, _ in validation]})" if validation else ""
    return None, None, f"the module has no single torchmetrics metric named val*{found} and no num_classes"


def batch_parts(batch: Any, keys: BatchKeys) -> tuple[Any, Any]:
    """``(inputs, target)`` = ``batch[keys[0]], batch[keys[1]]``.

    Raises:
        ValueError: the batch has no such items (the message shows the batch's kind and the keys).
    """
    try:
        return batch[keys[0]], batch[keys[1]]
    except (KeyError, IndexError, TypeError) as error:
        kind = f"a dict with keys {list(batch)}" if isinstance(batch, dict) else f"a {type(batch).__name__}"
        raise ValueError(
            f"TransformCompression: a validation batch is {kind}, which has no inputs/target at batch_keys="
            f"{tuple(keys)} ({type(error).__name__}: {error}); pass batch_keys=(inputs, target) that fit it, e.g. "
            f"('x', 'y') for dict batches."
        ) from None


def _update(metric: torchmetrics.Metric, pl_module: pl.LightningModule, batch: Any, keys: BatchKeys) -> None:
    inputs, target = batch_parts(batch, keys)
    metric.update(pl_module(inputs), target)


def validation_loaders(trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[Any]:
    """The validation dataloaders of the fit, ``[]`` when there are none.

    Before the fit's first validation (at its start) the validation loop is set up now, as its sanity check would
    (same loaders, same distributed samplers); where the loop has none (``limit_val_batches=0``, no
    ``validation_step``), the data module's (or the model's) ``val_dataloader()``."""
    if trainer.val_dataloaders is None and trainer.state.fn == "fit" and trainer.enable_validation:
        trainer.fit_loop.epoch_loop.val_loop.setup_data()
    loaders = trainer.val_dataloaders
    if loaders is None:
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        hook = getattr(type(source), "val_dataloader", None)
        # Lightning's own hook (DataHooks, in either Lightning package) only raises "must be implemented".
        if hook is not None and hook.__qualname__ != "DataHooks.val_dataloader":
            try:
                loaders = source.val_dataloader()
            # (a data module of either Lightning package may say it has no loader: both packages' exception)
            except (
                AttributeError,
                NotImplementedError,
                *every_package("utilities.exceptions.MisconfigurationException"),
            ):
                loaders = None
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, list | tuple) else [loaders]


def _scalar(value: Any, name: str) -> float:
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_complex():
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(
            f"TransformCompression: the metric {name!r} computes {shape}, not one number; pass a metric whose "
            f"compute() is a scalar (e.g. average='micro' for an accuracy)."
        )
    return float(value)


def _not_classes(metric: torchmetrics.Metric, outputs: Any, target: Any) -> str | None:
    """Why a multiclass metric's input is not classes, where torchmetrics does not say: under
    ``torch.use_deterministic_algorithms`` it counts classes without ``bincount``, which refuses floats otherwise,
    and would score a regressor's outputs as if they were labels."""
    if not type(metric).__name__.startswith("Multiclass"):
        return None
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        return f"{type(metric).__name__} needs integer class labels as the target, got {target.dtype} values"
    tensors = isinstance(outputs, torch.Tensor) and isinstance(target, torch.Tensor)
    if tensors and outputs.is_floating_point() and outputs.dim() == target.dim():
        return "floating-point outputs without a class dimension are neither labels nor scores per class"
    return None


def check_metric(
    trainer: pl.Trainer, pl_module: pl.LightningModule, metric: torchmetrics.Metric, name: str, keys: BatchKeys
) -> None:
    """Score one validation batch with a copy of ``metric`` (the module in eval mode, no gradients, the trainer's
    precision), so that a metric unfit for this model fails before training instead of after it.

    Raises:
        ValueError: there is no validation data, the batch has nothing at ``keys``, the metric cannot take the
            module's output and the target, or it does not compute one number.
    """
    loaders = validation_loaders(trainer, pl_module)
    batch = next((b for loader in loaders for b in loader), None)
    if batch is None:
        raise ValueError(
            f"TransformCompression: the metric {name!r} needs validation data, but this fit has none; give fit "
            f"val_dataloaders (or a val_dataloader() on the data module or the model), or metric=None to report "
            f"the compression error only."
        )
    trial = metric.clone().to(pl_module.device)
    trial.reset()
    batch = trainer.strategy.batch_to_device(batch, dataloader_idx=0)
    inputs, target = batch_parts(batch, keys)
    try:
        with eval_mode(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
            outputs = pl_module(inputs)
            problem = _not_classes(metric, outputs, target)
            if problem is not None:
                raise ValueError(problem)
            trial.update(outputs, target)
            value = trial.compute()
    except Exception as error:
        got = tuple(outputs.shape) if "outputs" in locals() and isinstance(outputs, torch.Tensor) else "?"
        want = tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__
        raise ValueError(
            f"TransformCompression: the metric {name!r} ({type(metric).__name__}) cannot score this model: on a "
            f"validation batch, pl_module(inputs) gives {got} and the target is {want} ({type(error).__name__}: "
            f"{error}). Pass metric=... that scores this output (e.g. torchmetrics.MeanSquaredError() for a "
            f"regressor), batch_keys=... if inputs and target sit elsewhere in the batch, or metric=None to report "
            f"the compression error only."
        ) from error
    _scalar(value, name)


def choose_metric(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    metric: torchmetrics.Metric | str | None,
    name: str | None,
    keys: BatchKeys,
) -> tuple[torchmetrics.Metric | None, str | None]:
    """``(metric to score with, its name)`` at the start of fit, tried on one validation batch (:func:`check_metric`);
    ``(None, None)`` for no metric. A given metric is cloned (the user's instance keeps its state); ``"auto"`` is
    :func:`default_metric`, dropped with an info line (nothing to choose, no validation data) or a warning (it
    cannot score the batches).

    Raises:
        ValueError: a given metric cannot score the model (:func:`check_metric`).
    """
    if metric is None:
        return None, None
    if isinstance(metric, torchmetrics.Metric):
        name = name or metric_name_of(metric)
        chosen = metric.clone()
        check_metric(trainer, pl_module, chosen, name, keys)
        return chosen, name
    chosen, own_name, source = default_metric(pl_module)
    if chosen is None:
        rank_zero_info(
            f"TransformCompression: no metric ({source}); the report gives the compression error only. Pass "
            f"metric=<a torchmetrics.Metric> to score the model before and after compression."
        )
        return None, None
    name = name or own_name
    if not validation_loaders(trainer, pl_module):
        rank_zero_info(f"TransformCompression: no validation data to score {source}; compression error only.")
        return None, None
    try:
        check_metric(trainer, pl_module, chosen, name, keys)
    except ValueError as error:
        warnings.warn(f"{error} (The automatic choice, {source}, is dropped.)", stacklevel=3)
        return None, None
    return chosen, name


def evaluate(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    metric: torchmetrics.Metric,
    name: str,
    keys: BatchKeys,
    loaders: Sequence[Any],
) -> float | None:
    """``metric`` over every batch of ``loaders`` (the model in eval mode, each submodule back in its own mode
    afterwards); torchmetrics reduces its state across processes in ``compute()``. ``None`` without batches."""
    metric = metric.to(pl_module.device)
    metric.reset()
    batches = 0
    # eval_mode gives every submodule its own mode back through its train(mode): a train() override's side
    # effects (a noise level, a frozen part) are those of training again for the fine-tuning epochs.
    with eval_mode(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
        for index, loader in enumerate(loaders):
            for batch in loader:
                _update(metric, pl_module, trainer.strategy.batch_to_device(batch, dataloader_idx=index), keys)
                batches += 1
    # Every process reaches compute() (its all-gather), also one whose shard happened to be empty.
    batches = int(trainer.strategy.reduce(torch.tensor(float(batches), device=pl_module.device), reduce_op="sum"))
    if batches == 0:
        return None
    value = _scalar(metric.compute(), name)
    metric.reset()
    return value
