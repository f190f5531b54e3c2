"""Compress a trained model's dense layers into "fast transform x sparse codes" during or after ``fit``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torchmetrics
from torch import nn

from lightning_ortho._lightning import Callback, every_package, pl, rank_zero_info
from lightning_ortho.callbacks.compression.metric import (
    BatchKeys,
    batch_parts,
    choose_metric,
    evaluate,
    validation_loaders,
)
from lightning_ortho.callbacks.compression.report import print_report
from lightning_ortho.callbacks.compression.selection import linear_modules, select_layers
from lightning_ortho.models.factorized_checkpoint import save_compressed_checkpoint
from lightning_ortho.nn.eval_mode import eval_mode
from lightning_ortho.transforms.compression import compress_linear
from lightning_ortho.transforms.conv_compression import compress_conv
from lightning_ortho.transforms.factorized_linear import keep_training_state, restore_factorized_on_load
from lightning_ortho.transforms.families import family_spec, unused_hyperparameter
from lightning_ortho.transforms.model_compression import record_layer_inputs, search_model_compression

RichProgressBar = every_package("callbacks.RichProgressBar")  # whichever Trainer runs the callback


def _check_optional_int(value: object, name: str, low: int) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        raise ValueError(f"TransformCompression: {name} must be None or an int >= {low}, got {value!r}.")


class TransformCompression(Callback):
    """Replaces dense layers by :class:`~lightning_ortho.transforms.FactorizedLinear` ``C (D^T x) + b`` learned
    with :func:`~lightning_ortho.transforms.compression.compress_linear` (``W ~ C D^T`` in the Frobenius norm), and
    ``Conv1d``/``Conv2d`` by :class:`~lightning_ortho.transforms.FactorizedConv` ``conv(D^T x, C) + b``
    (:func:`~lightning_ortho.transforms.conv_compression.compress_conv`; their op counts are per image of the size
    the first validation batch gives them, per output position without validation data).

    When: with ``at_epoch=None, finetune_epochs=0`` (default) at ``on_fit_end``, no fine-tuning. Otherwise after
    training epoch ``at_epoch`` (0-based), or after epoch ``max_epochs - 1 - finetune_epochs``, so that
    ``finetune_epochs`` epochs follow: at the start of the next epoch (``on_train_epoch_start``), once the epoch's
    validation, checkpoints and early-stopping check are done with the dense weights they scored. Every checkpoint
    then carries the score of the weights it holds: the first one holding the compressed layers is written after the
    compressed model's own validation. The remaining epochs of the same ``fit`` fine-tune the compressed model, the
    codes only on their support (see :class:`FactorizedLinear`), the transforms fixed. With ``at_epoch = max_epochs
    - 1`` the layers are compressed at ``on_fit_end``. Fine-tuning needs one process (DDP registered the old
    parameters); if ``fit`` stops before the fine-tuning epochs, compression happens at ``on_fit_end`` with a
    warning. Whenever layers are replaced, the optimizers and LR schedulers are re-created from
    ``configure_optimizers`` (``trainer.strategy.setup_optimizers``, so the new codes are optimised; optimizer state
    such as Adam moments and schedules restart), also at ``on_fit_end``, so that a checkpoint saved then (e.g.
    ``compressed.ckpt``) holds optimizer state of the compressed parameters, not the dense weights' moments.

    Around the compression the validation dataloaders are run through the model (eval mode, each submodule's own
    mode restored afterwards through its ``train(mode)``, no gradients, the trainer's precision context) and scored
    with ``metric``, a ``torchmetrics.Metric`` updated with ``(pl_module(inputs), target)`` of every batch and
    reduced across processes by torchmetrics. At the start of ``fit``, before training, it is tried on one
    validation batch, so that a metric unfit for the model fails then, not after the whole run. Logged:
    ``compression/<metric_name>_before``, ``.._after`` (when there is a metric), ``compression/error/<module>``
    (percent), ``compression/ops_before`` and ``compression/ops_after`` (additions + multiplications + shifts, bias
    excluded); in ``trainer.callback_metrics`` and the loggers (``pl_module.log`` in the epoch of compression; at
    ``on_fit_end`` written to both directly). ``report`` keeps one dict per compressed layer (its ``"epoch"``: the
    last training epoch completed before the compression), ``kept_dense`` one per layer left dense with the reason
    (a compressed form that would cost at least as many operations as the dense layer: a layer with few outputs
    pays the whole transform for them); a rich table is printed at the end, its title the metric of
    the model before and after compression. ``compressed_after_validation`` is ``True`` while the last validation
    of the run came before the compression (always after compression at ``on_fit_end``): the logged validation
    metrics, e.g. ``val_acc``, then describe the dense model, and ``compression/<metric_name>_after`` the
    compressed one.

    Checkpoints saved after compression hold each compressed layer's state with a marker (see
    :class:`~lightning_ortho.transforms.FactorizedLinear`), and a freshly built model rebuilds those layers before
    it loads them (:func:`~lightning_ortho.transforms.factorized_linear.restore_factorized`): in ``setup`` this
    callback registers that rebuild on the model, so ``Trainer.fit / validate / test / predict(..., ckpt_path=...)``
    work for any LightningModule while the callback is in the Trainer; ``Model.load_from_checkpoint``, which runs no
    callback, needs the model's own ``on_load_checkpoint`` to do it
    (:class:`~lightning_ortho.models.factorized_checkpoint.RestoresFactorizedLayers`, a base of the package's
    classifiers). A resumed ``fit`` does not compress again (this callback's state ``done``). The rebuild works both
    ways: a checkpoint saved before compression (``trainer.test(ckpt_path="best")`` after a fit whose best epoch came
    before it) loads into the compressed model by turning those layers back into ``nn.Linear``.

    Nothing compressed is lost when compression comes after the fit's last checkpoint (always at the end of fit;
    also when no checkpoint is saved after ``at_epoch``): if the Trainer has a ``ModelCheckpoint``, the compressed
    model is saved next to its checkpoints as ``compressed.ckpt`` (``compressed-v1.ckpt`` ... if taken), logged on
    rank zero and kept in ``compressed_checkpoint``. The replacements keep the mode and ``requires_grad`` of the
    layers they replace (a frozen layer stays frozen through fine-tuning).

    Args:
        modules: names of submodules to replace (``"head"``, ``"features.0"``); ``None``: every outermost
            ``nn.Linear``, :class:`~lightning_ortho.nn.SVDLinear`, ``nn.Conv1d`` and ``nn.Conv2d``, skipping (with a
            warning at the start of fit) layers that are not affine (``SVDLinear(orthogonal="aux")``), have fewer
            than 2 inputs or input channels (odd for family ``"m"``, fewer than 4 for ``"b4x4"``), grouped or
            depthwise convolutions, or belong to ``nn.MultiheadAttention``. Either way, a layer whose
            weights are all zero (unused) or not finite when its turn comes stays dense, with a warning.
        family: the transform family, one of :data:`~lightning_ortho.transforms.families.FAMILY_TABLE`
            (``"b"``, ``"m"``, ``"shear"``, ``"b4x4"``), as :func:`compress_linear`.
        s: nonzeros per code row, as :func:`compress_linear` (``None``: its default for each layer).
        m: blocks (``"b"``, ``"shear"``, ``"b4x4"``), as :func:`compress_linear` (``None``: the default per layer).
        q: stages (``"m"``), as :func:`compress_linear` (``None``: the default per layer).
        bits: SOPOT terms per shear (``"shear"``), as :func:`compress_linear`.
        at_epoch: the training epoch (0-based) after which to compress (above); give at most one of ``at_epoch``
            and ``finetune_epochs``.
        finetune_epochs: the number of epochs that follow the compression to fine-tune it (above).
        iterations: sweeps or rounds of the learner, as :func:`compress_linear` (``None``: its default).
        metric: a ``torchmetrics.Metric`` with a scalar ``compute()`` (cloned, never changed, so one instance may
            serve several callbacks); ``None``: no metric, the report gives the compression error and operations
            only. ``"auto"`` (default), chosen at the start of ``fit``: a copy of the module's own validation
            metric (its one ``torchmetrics.Metric`` attribute named ``val*``, e.g. the package's classifiers'
            ``val_acc``); else ``MulticlassAccuracy(num_classes, average="micro")`` when the module has a
            ``num_classes`` attribute or hyperparameter; else none (one info line says why). An automatic choice
            that cannot score the model's validation batches is dropped with a warning.
        metric_name: its name in the logs; default: the module attribute's name for the module's own metric,
            ``"val_acc"`` for an accuracy, else ``"val_"`` and the metric's class in snake case.
        batch_keys: where ``(inputs, target)`` sit in a validation batch: ``(0, 1)`` for ``(inputs, target, ...)``
            tuples, ``("x", "y")`` for dicts.
        verbose: print the rich table at the end of ``fit`` (rank zero).
        progress: :func:`compress_linear`'s progress bar of each layer: ``None`` (auto) draws it on an interactive
            terminal unless the Trainer shows a ``RichProgressBar`` (two live displays would garble each other;
            a compression estimated to take over a minute still warns), ``True`` always, ``False`` never.

        max_accuracy_drop: a budget instead of ``s``: the largest drop of ``metric`` (points of a metric on
            ``[0, 1]``) on the validation data allowed by the compression, before fine-tuning; the layers get the
            fewest operations that keep it
            (:func:`~lightning_ortho.transforms.model_compression.search_model_compression`, codes refit on the
            inputs each layer sees on the validation data; layers dearer than dense stay dense). Needs a metric and
            one process.
        max_output_error: instead, the largest relative output error of the model (percent) on the validation
            inputs.

    The metric is measured before compression, after it, and at the end of fit once fine-tuning epochs followed
    (``metric_finetuned``, logged as ``compression/<metric_name>_finetuned`` and in the table's title).

    Under ``fast_dev_run`` the layers are compressed at the end of fit, without fine-tuning (with a warning).

    Raises:
        ValueError: invalid arguments (in ``__init__``); at ``fit`` start, before training: a named module does
            not exist or is not compressible (the message lists the model's Linear modules), no module to compress,
            ``at_epoch`` or ``finetune_epochs`` do not fit ``max_epochs``, fine-tuning under more than one process,
            or a given ``metric`` cannot score the module's output on a validation batch (or there is no validation
            data for it).
    """

    def __init__(
        self,
        modules: Sequence[str] | None = None,
        family: str = "b",
        s: int | None = None,
        m: int | None = None,
        q: int | None = None,
        bits: int | None = None,
        at_epoch: int | None = None,
        finetune_epochs: int = 0,
        iterations: int | None = None,
        metric: torchmetrics.Metric | Literal["auto"] | None = "auto",
        metric_name: str | None = None,
        batch_keys: BatchKeys = (0, 1),
        verbose: bool = True,
        progress: bool | None = None,
        max_accuracy_drop: float | None = None,
        max_output_error: float | None = None,
    ) -> None:
        if isinstance(modules, str) or (
            modules is not None
            and (not isinstance(modules, Sequence) or not modules or not all(isinstance(n, str) and n for n in modules))
        ):
            raise ValueError(
                "TransformCompression: modules must be None (every Linear/SVDLinear/Conv) or a non-empty list of submodule "
                f"names such as ['head', 'features.0'], got {modules!r}."
            )
        if modules is not None and len(set(modules)) != len(modules):
            raise ValueError(f"TransformCompression: modules lists a name twice: {list(modules)}.")
        spec = family_spec(family, "TransformCompression")
        for name, value in (
            ("s", s),
            ("m", m),
            ("q", q),
            ("bits", bits),
            ("iterations", iterations),
            ("at_epoch", at_epoch),
        ):
            _check_optional_int(value, name, 0 if name == "at_epoch" else 1)
        message = unused_hyperparameter(spec, {"m": m, "q": q, "bits": bits}, "TransformCompression")
        if message is not None:
            raise ValueError(message)
        if not isinstance(finetune_epochs, int) or isinstance(finetune_epochs, bool) or finetune_epochs < 0:
            raise ValueError(f"TransformCompression: finetune_epochs must be an int >= 0, got {finetune_epochs!r}.")
        if at_epoch is not None and finetune_epochs:
            raise ValueError(
                "TransformCompression: give at_epoch (compress after that epoch) or finetune_epochs (compress before "
                "the last N epochs), not both."
            )
        if not (
            metric is None or isinstance(metric, torchmetrics.Metric) or (isinstance(metric, str) and metric == "auto")
        ):
            raise ValueError(
                "TransformCompression: metric must be a torchmetrics.Metric (e.g. torchmetrics.classification."
                f"MulticlassAccuracy(num_classes=10), torchmetrics.MeanSquaredError()), 'auto' or None, got {metric!r}."
            )
        if metric_name is not None and (not isinstance(metric_name, str) or not metric_name):
            raise ValueError(f"TransformCompression: metric_name must be a non-empty string, got {metric_name!r}.")
        keys_ok = isinstance(batch_keys, Sequence) and not isinstance(batch_keys, str) and len(batch_keys) == 2
        if not keys_ok or not all(isinstance(k, int | str) and not isinstance(k, bool) for k in batch_keys):
            raise ValueError(
                "TransformCompression: batch_keys must be (inputs, target): two ints for tuple batches, such as (0, "
                f"1), or two keys for dict batches, such as ('x', 'y'); got {batch_keys!r}."
            )
        if max_accuracy_drop is not None and max_output_error is not None:
            raise ValueError("TransformCompression: give one budget, max_accuracy_drop or max_output_error, not both.")
        budget = max_accuracy_drop if max_accuracy_drop is not None else max_output_error
        if budget is not None:
            if not isinstance(budget, int | float) or isinstance(budget, bool) or budget < 0:
                raise ValueError(f"TransformCompression: the budget must be a number >= 0, got {budget!r}.")
            if s is not None:
                raise ValueError("TransformCompression: give s (nonzeros per code row) or a budget, not both.")
            if max_accuracy_drop is not None and metric is None:
                raise ValueError(
                    "TransformCompression: max_accuracy_drop needs a metric ('auto' or a torchmetrics one)."
                )
        self.max_accuracy_drop, self.max_output_error = max_accuracy_drop, max_output_error
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"TransformCompression: progress must be True, False or None (auto), got {progress!r}.")
        self.progress = progress
        self.modules = None if modules is None else list(modules)
        self.family, self.at_epoch, self.finetune_epochs, self.verbose = family, at_epoch, finetune_epochs, verbose
        self.options = {"s": s, "m": m, "q": q, "bits": bits, "iterations": iterations}
        self.metric, self.batch_keys = metric, tuple(batch_keys)
        self._given_name = metric_name
        #: The metric's name in the logs, settled at the start of fit (``None``: no metric).
        self.metric_name: str | None = metric_name
        self._metric: torchmetrics.Metric | None = None  # the copy scored at compression (chosen at fit start)
        self.report: list[dict[str, Any]] = []
        #: The layers left dense: ``{"module", "type", "reason", "ops"}`` (their dense operations per sample).
        self.kept_dense: list[dict[str, Any]] = []
        self.metric_before: float | None = None
        self.metric_after: float | None = None
        #: The metric at the end of fit, after the fine-tuning epochs that followed the compression (``None``
        #: where none did).
        self.metric_finetuned: float | None = None
        #: The per-layer output-error budget the search chose (percent), with a budget.
        self.layer_budget: float | None = None
        self.done = False
        self.compressed_checkpoint: str | None = None
        self.compressed_after_validation = False
        self._epoch: int | None = None
        self._compressed_in_fit = self._saved_since = False

    # ------------------------------------------------------------------------------------------------ selection
    @staticmethod
    def linear_modules(model: nn.Module) -> list[str]:
        """Names of the outermost ``nn.Linear`` / ``SVDLinear`` / convolution modules of ``model`` and of its
        compressed ones."""
        return linear_modules(model)

    def select(self, model: nn.Module, *, warn: bool = True, weights: bool = True) -> list[str]:
        """Names of the modules this callback will replace in ``model`` (see ``modules``); ``warn`` and ``weights``
        as in :func:`~lightning_ortho.callbacks.compression.selection.select_layers`, which raises ``ValueError``
        for a named module that is missing or not compressible, or when nothing is left to compress."""
        return select_layers(model, self.modules, self.family, self.options["s"], warn=warn, weights=weights)

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Runs before the Trainer restores a ckpt_path: the model then rebuilds the compressed layers it loads.
        restore_factorized_on_load(pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._compressed_in_fit = self._saved_since = False
        if self.done:
            return
        # Fail (named modules) or warn (automatic selection) now, before training, about what no training changes.
        self.select(pl_module, warn=True, weights=False)
        # Tried on one validation batch now: at compression time (often the end of fit) a failure would come after
        # the whole training run.
        self._metric, self.metric_name = choose_metric(
            trainer, pl_module, self.metric, self._given_name, self.batch_keys
        )
        if self.max_accuracy_drop is not None and self._metric is None:
            raise ValueError(
                "TransformCompression: max_accuracy_drop needs a metric to score the validation data, and none was "
                "found for this module; pass metric=torchmetrics... (e.g. MulticlassAccuracy), or max_output_error."
            )
        max_epochs = trainer.max_epochs
        if trainer.fast_dev_run and (self.finetune_epochs or self.at_epoch is not None):
            # A smoke run of one batch cannot hold the fine-tuning epochs; compress at its end instead of failing.
            warnings.warn(
                "TransformCompression: fast_dev_run runs one epoch, so the layers are compressed at the end of fit "
                "without fine-tuning.",
                stacklevel=2,
            )
            self._epoch = None
            return
        if self.finetune_epochs:
            if max_epochs is None or max_epochs < 0 or max_epochs <= self.finetune_epochs:
                raise ValueError(
                    f"TransformCompression: finetune_epochs={self.finetune_epochs} needs Trainer(max_epochs=...) "
                    f"larger than it, got max_epochs={max_epochs}."
                )
            self._epoch = max_epochs - 1 - self.finetune_epochs
        else:
            self._epoch = self.at_epoch
        if self._epoch is not None and max_epochs is not None and max_epochs >= 0 and self._epoch >= max_epochs:
            raise ValueError(
                f"TransformCompression: at_epoch={self._epoch} is never reached with max_epochs={max_epochs} "
                f"(epochs 0..{max_epochs - 1}); lower at_epoch or use at_epoch=None to compress at the end of fit."
            )
        if (self.max_accuracy_drop is not None or self.max_output_error is not None) and trainer.world_size > 1:
            raise ValueError(
                "TransformCompression: the budget search (max_accuracy_drop / max_output_error) needs one process: "
                "each would refit the layers on its own validation shard. Give s instead under DDP."
            )
        if self._epoch is not None and trainer.world_size > 1:
            raise ValueError(
                "TransformCompression: fine-tuning after compression (at_epoch / finetune_epochs) needs a single "
                "process; under DDP use at_epoch=None (compress at the end of fit)."
            )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # "After epoch k" is the start of epoch k + 1, not the end of epoch k: by then epoch k's validation and
        # checkpoints are done with the weights they scored, and the compressed model's first checkpoint comes
        # after its own validation (at the end of epoch k, a checkpoint of the compressed layers would carry the
        # dense model's score, and ModelCheckpoint's "best" or EarlyStopping would act on it).
        if self.done or self._epoch is None or trainer.current_epoch <= self._epoch:
            return
        for key, value in self._compress(trainer, pl_module).items():
            pl_module.log(key, value)  # reduced and shown at the end of this epoch (callback_metrics, loggers)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.compressed_after_validation = False  # the logged validation metrics describe the compressed model

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.done:
            max_epochs = trainer.max_epochs
            planned_last = max_epochs is not None and max_epochs >= 0 and self._epoch == max_epochs - 1
            if self._epoch is not None and not (planned_last and trainer.current_epoch > self._epoch):
                warnings.warn(
                    f"TransformCompression: fit ended (in epoch {trainer.current_epoch}) before the fine-tuning "
                    f"planned after epoch {self._epoch}; compressing now, without fine-tuning.",
                    stacklevel=2,
                )
            metrics = self._compress(trainer, pl_module)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
            # pl_module.log is closed at on_fit_end; the figures still go where Trainer users and the CLI read them.
            trainer.callback_metrics.update({key: torch.tensor(float(value)) for key, value in metrics.items()})
        elif self._compressed_in_fit:  # compressed earlier in this fit: fine-tuning epochs followed
            self.metric_finetuned = self.evaluate(trainer, pl_module)
            if self.metric_finetuned is not None:
                key = f"compression/{self.metric_name}_finetuned"
                for logger in trainer.loggers:
                    logger.log_metrics({key: self.metric_finetuned}, step=trainer.global_step)
                trainer.callback_metrics[key] = torch.tensor(float(self.metric_finetuned))
        if self._compressed_in_fit and not self._saved_since and trainer.checkpoint_callbacks:
            if not trainer.fast_dev_run:  # a smoke run writes no checkpoint
                self._save_compressed(trainer)
        if self.verbose and (self.report or self.kept_dense):
            self._print_table()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self._compressed_in_fit:
            self._saved_since = True  # a checkpoint of this fit holds the compressed layers

    def _save_compressed(self, trainer: pl.Trainer) -> None:
        # Compressed after this fit's last checkpoint (at its end, by default): every checkpoint on disk holds the
        # layers dense, so the compressed model is saved next to them.
        self.compressed_checkpoint = save_compressed_checkpoint(trainer)
        rank_zero_info(
            f"TransformCompression: the layers were compressed after the last checkpoint of this fit was written, so "
            f"those checkpoints hold them dense (last.ckpt too, if any); the compressed model is saved to "
            f"{self.compressed_checkpoint}."
        )

    # ------------------------------------------------------------------------------------------------ work
    def _compress(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        names = self.select(pl_module, warn=False)  # the skips by kind were reported at the start of fit
        if not names:
            self.done = True
            return {}  # every layer left stays dense (warned by select)
        self.metric_before = self.evaluate(trainer, pl_module)
        replacements = {}
        progress = self.progress
        if progress is None and isinstance(trainer.progress_bar_callback, RichProgressBar):
            progress = False
        if self.max_accuracy_drop is not None or self.max_output_error is not None:
            replacements = self._search(trainer, pl_module, names)
            names = []  # the search chose and compressed them
        sizes = self._input_sizes(trainer, pl_module, names)
        for name in names:  # compress all first, then replace: an error leaves the model untouched
            kwargs = {k: v for k, v in self.options.items() if v is not None}
            layer = pl_module.get_submodule(name)
            with warnings.catch_warnings():  # a layer dearer than dense stays dense below, said in the table
                warnings.filterwarnings("ignore", message=r"compress_(linear|conv): the compressed .* costs")
                if isinstance(layer, nn.modules.conv._ConvNd):
                    kwargs["input_size"] = sizes.get(name)
                    new = compress_conv(layer, self.family, progress=progress, **kwargs)
                else:
                    new = compress_linear(layer, self.family, progress=progress, **kwargs)
            dense_ops, ops = new.report.dense_ops.total, new.report.factorized_ops.total
            if ops >= dense_ops:  # it would not save anything: it stays dense, and the table says so
                reason = f"dearer than dense ({ops} operations per sample against {dense_ops})"
                self.kept_dense.append(
                    {"module": name, "type": type(layer).__name__, "reason": reason, "ops": dense_ops}
                )
                continue
            replacements[name] = (layer, keep_training_state(new, layer))  # a frozen layer stays frozen
        if self.kept_dense:
            rank_zero_info(
                "TransformCompression: kept dense: "
                + "; ".join(f"{row['module']} ({row['reason']})" for row in self.kept_dense)
                + ". Lower s or m for them, or leave them out of modules."
            )
        for name, (old, new) in replacements.items():
            parent_name, _, child = name.rpartition(".")
            setattr(pl_module.get_submodule(parent_name), child, new)
            row = {"module": name, "type": type(old).__name__, "epoch": trainer.current_epoch - 1}  # last one done
            self.report.append({**row, **new.report.as_dict()})
        # The optimizers are re-created from configure_optimizers for the new parameters (the codes): their state
        # (Adam moments, schedules) restarts, whether fine-tuning follows in this fit or a later fit resumes from a
        # checkpoint saved now (the dense weights' moments have the codes' shape and would load into them).
        trainer.strategy.setup_optimizers(trainer)
        self.metric_after = self.evaluate(trainer, pl_module)
        self.done, self._compressed_in_fit, self._saved_since = True, True, False
        self.compressed_after_validation = True  # until a validation runs: the logged val_* are the dense model's
        metrics: dict[str, float] = {}
        if self.metric_before is not None and self.metric_after is not None:
            metrics[f"compression/{self.metric_name}_before"] = self.metric_before
            metrics[f"compression/{self.metric_name}_after"] = self.metric_after
        total = lambda r, k: r[f"{k}_additions"] + r[f"{k}_multiplications"] + r[f"{k}_shifts"]  # noqa: E731
        new_rows = self.report[-len(replacements) :] if replacements else []
        for row in new_rows:
            metrics[f"compression/error/{row['module']}"] = float(row["error"])
        metrics["compression/ops_before"] = float(sum(total(r, "dense_ops") for r in new_rows))
        metrics["compression/ops_after"] = float(sum(total(r, "factorized_ops") for r in new_rows))
        return metrics

    def _search(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, names: list[str]
    ) -> dict[str, tuple[nn.Module, nn.Module]]:
        """The budget search on the validation data: ``name -> (dense, compressed)`` of the layers it compressed,
        left in the model as it found them (the caller installs them)."""
        loaders = validation_loaders(trainer, pl_module)
        if not loaders:
            raise ValueError("TransformCompression: a budget is scored on the validation data; the Trainer has none.")
        inputs = []
        for index, loader in enumerate(loaders):
            for batch in loader:
                inputs.append(
                    batch_parts(trainer.strategy.batch_to_device(batch, dataloader_idx=index), self.batch_keys)[0]
                )
        dense = {name: pl_module.get_submodule(name) for name in names}
        layer_inputs = record_layer_inputs(pl_module, names, inputs)
        if self.max_output_error is not None:
            reference = self._outputs(trainer, pl_module, inputs)

            def meets(model: nn.Module) -> tuple[bool, float]:
                error = float(
                    100 * (self._outputs(trainer, model, inputs) - reference).square().sum() / reference.square().sum()
                )
                return error <= self.max_output_error, error
        else:
            before = self.metric_before

            def meets(model: nn.Module) -> tuple[bool, float]:
                figure = self.evaluate(trainer, pl_module)
                ok = figure is not None and before is not None and 100 * (before - figure) <= self.max_accuracy_drop
                return ok, float("nan") if figure is None else figure

        options = {k: v for k, v in self.options.items() if v is not None}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            rows, self.layer_budget, _tried = search_model_compression(
                pl_module,
                layer_inputs,
                dict.fromkeys(names, ""),
                meets,
                family=self.family,
                options=options,
                model_inputs=inputs,
            )
        self.kept_dense += [
            {"module": row.name, "type": row.kind, "reason": row.reason, "ops": row.ops_before.total}
            for row in rows
            if not row.compressed
        ]
        kept = [f"{row.name} ({row.reason})" for row in rows if not row.compressed]
        if kept:
            rank_zero_info(f"TransformCompression: kept dense under the budget: {'; '.join(kept)}.")
        replacements = {}
        for row in rows:
            if row.compressed:
                new = pl_module.get_submodule(row.name)
                replacements[row.name] = (dense[row.name], keep_training_state(new, dense[row.name]))
                parent_name, _, child = row.name.rpartition(".")
                setattr(pl_module.get_submodule(parent_name), child, dense[row.name])  # installed by the caller
        return replacements

    def _outputs(self, trainer: pl.Trainer, pl_module: nn.Module, inputs: list) -> torch.Tensor:
        with eval_mode(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
            outputs = [pl_module(x).detach().double().cpu() for x in inputs]
            # one row per sample, whatever the output's shape: (N,) for a regressor, (N, C, ...) otherwise
            return torch.cat([out.reshape(out.shape[0], -1) for out in outputs])

    def _input_sizes(self, trainer: pl.Trainer, pl_module: pl.LightningModule, names: list[str]) -> dict[str, tuple]:
        """The spatial size of the inputs of the convolutions ``names`` on the first validation batch (what their
        op counts per image assume); empty without validation data or convolutions."""
        convolutions = {n: pl_module.get_submodule(n) for n in names}
        convolutions = {n: m for n, m in convolutions.items() if isinstance(m, nn.modules.conv._ConvNd)}
        loaders = validation_loaders(trainer, pl_module) if convolutions else []
        batch = next((b for loader in loaders for b in loader), None)
        if batch is None:
            return {}
        sizes: dict[str, tuple] = {}

        def record(name: str):
            def hook(_module: nn.Module, args: tuple) -> None:  # returns None: the inputs go on unchanged
                sizes.setdefault(name, tuple(args[0].shape[2:]))

            return hook

        hooks = [module.register_forward_pre_hook(record(name)) for name, module in convolutions.items()]
        try:
            with eval_mode(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
                inputs, _ = batch_parts(trainer.strategy.batch_to_device(batch, dataloader_idx=0), self.batch_keys)
                pl_module(inputs)
        finally:
            for hook in hooks:
                hook.remove()
        return sizes

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float | None:
        """The metric over the validation data, ``None`` when there is no metric or no validation data."""
        if self._metric is None or self.metric_name is None:
            return None
        loaders = validation_loaders(trainer, pl_module)
        if not loaders:
            warnings.warn("TransformCompression: no validation dataloader; the metric is not measured.", stacklevel=3)
            return None
        return evaluate(trainer, pl_module, self._metric, self.metric_name, self.batch_keys, loaders)

    def _print_table(self) -> None:
        print_report(
            self.report, self.metric_name, self.metric_before, self.metric_after, self.metric_finetuned, self.kept_dense
        )

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "report": self.report,
            "kept_dense": self.kept_dense,
            "metric_before": self.metric_before,
            "metric_after": self.metric_after,
            "metric_finetuned": self.metric_finetuned,
            "layer_budget": self.layer_budget,
            "metric_name": self.metric_name,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = bool(state_dict.get("done", False))
        self.report = list(state_dict.get("report", []))
        self.kept_dense = list(state_dict.get("kept_dense", []))
        self.metric_before = state_dict.get("metric_before")
        self.metric_after = state_dict.get("metric_after")
        self.metric_finetuned = state_dict.get("metric_finetuned")
        self.layer_budget = state_dict.get("layer_budget")
        if self.done:  # the report's figures were named in the run that compressed
            self.metric_name = state_dict.get("metric_name", self.metric_name)
