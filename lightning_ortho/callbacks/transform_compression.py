"""Compress a trained model's dense layers into "fast transform x sparse codes" during or after ``fit``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lightning_ortho._lightning import Callback, pl, rank_zero_info
from lightning_ortho.callbacks._compression_report import Metric, accuracy_metric, evaluate_metric, print_report
from lightning_ortho.models.factorized_checkpoint import save_compressed_checkpoint
from lightning_ortho.nn import SVDLinear
from lightning_ortho.transforms.compression import (
    FAMILIES,
    FactorizedLinear,
    NotAffineError,
    affine_parts,
    compress_linear,
)
from lightning_ortho.transforms.factorized_linear import keep_training_state, restore_factorized_on_load

RichProgressBar = pl.callbacks.RichProgressBar


def _check_optional_int(value: object, name: str, low: int) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        raise ValueError(f"TransformCompression: {name} must be None or an int >= {low}, got {value!r}.")


class TransformCompression(Callback):
    """Replaces dense layers by :class:`~lightning_ortho.transforms.FactorizedLinear` ``C (D^T x) + b`` learned
    with :func:`~lightning_ortho.transforms.compression.compress_linear` (``W ~ C D^T`` in the Frobenius norm).

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
    mode restored afterwards through its ``train(mode)``, no gradients, the trainer's precision context) with
    ``metric``; the totals are summed across processes. Logged: ``compression/<metric_name>_before``, ``.._after``,
    ``compression/error/<module>`` (percent), ``compression/ops_before`` and ``compression/ops_after`` (additions +
    multiplications + shifts, bias excluded); in ``trainer.callback_metrics`` and the loggers (``pl_module.log`` in
    the epoch of compression; at ``on_fit_end`` written to both directly). ``report`` keeps one dict per layer (its
    ``"epoch"``: the last training epoch completed before the compression); a rich table is printed at the end.
    ``compressed_after_validation`` is ``True`` while the last validation of the run came before the compression
    (always after compression at ``on_fit_end``): the logged validation metrics, e.g. ``val_acc``, then describe
    the dense model, and ``compression/<metric_name>_after`` the compressed one.

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
            ``nn.Linear`` and :class:`~lightning_ortho.nn.SVDLinear`, skipping (with a warning at the start of fit)
            layers that are not affine (``SVDLinear(orthogonal="aux")``), have fewer than 2 inputs (odd for family
            ``"m"``) or belong to ``nn.MultiheadAttention``. Either way, a layer whose weights are all zero (unused)
            or not finite when its turn comes stays dense, with a warning.
        family, s, m, q, bits, iterations: as :func:`compress_linear` (defaults per layer).
        at_epoch, finetune_epochs: when to compress (above); give at most one.
        metric: ``metric(pl_module, batch) -> (total, count)``; the logged value is ``sum(total) / sum(count)``.
            Default :func:`accuracy_metric`. metric_name: its name in the logs (default ``"val_acc"``).
        verbose: print the rich table at the end of ``fit`` (rank zero).
        progress: :func:`compress_linear`'s progress bar of each layer: ``None`` (auto) draws it on an interactive
            terminal unless the Trainer shows a ``RichProgressBar`` (two live displays would garble each other;
            a compression estimated to take over a minute still warns), ``True`` always, ``False`` never.

    Under ``fast_dev_run`` the layers are compressed at the end of fit, without fine-tuning (with a warning).

    Raises:
        ValueError: invalid arguments (in ``__init__``); at ``fit`` start: a named module does not exist or is not
            compressible (the message lists the model's Linear modules), no module to compress, ``at_epoch`` or
            ``finetune_epochs`` do not fit ``max_epochs``, or fine-tuning under more than one process.
        RuntimeError: ``metric`` fails on the first validation batch of ``fit`` (it is tried there, usually in the
            sanity check, rather than first at compression time).
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
        metric: Metric | None = None,
        metric_name: str = "val_acc",
        verbose: bool = True,
        progress: bool | None = None,
    ) -> None:
        if isinstance(modules, str) or (
            modules is not None
            and (not isinstance(modules, Sequence) or not modules or not all(isinstance(n, str) and n for n in modules))
        ):
            raise ValueError(
                "TransformCompression: modules must be None (every Linear/SVDLinear) or a non-empty list of submodule "
                f"names such as ['head', 'features.0'], got {modules!r}."
            )
        if modules is not None and len(set(modules)) != len(modules):
            raise ValueError(f"TransformCompression: modules lists a name twice: {list(modules)}.")
        if family not in FAMILIES:
            raise ValueError(f"TransformCompression: family must be one of {FAMILIES}, got {family!r}.")
        for name, value in (
            ("s", s),
            ("m", m),
            ("q", q),
            ("bits", bits),
            ("iterations", iterations),
            ("at_epoch", at_epoch),
        ):
            _check_optional_int(value, name, 0 if name == "at_epoch" else 1)
        if family == "m" and (m is not None or bits is not None):
            raise ValueError("TransformCompression: family 'm' takes q (stages), not m or bits.")
        if family != "m" and q is not None:
            raise ValueError(
                f"TransformCompression: q is the stages of family 'm'; family {family!r} takes m (blocks)."
            )
        if family == "b" and bits is not None:
            raise ValueError("TransformCompression: bits (SOPOT terms) applies to family 'shear' only.")
        if not isinstance(finetune_epochs, int) or isinstance(finetune_epochs, bool) or finetune_epochs < 0:
            raise ValueError(f"TransformCompression: finetune_epochs must be an int >= 0, got {finetune_epochs!r}.")
        if at_epoch is not None and finetune_epochs:
            raise ValueError(
                "TransformCompression: give at_epoch (compress after that epoch) or finetune_epochs (compress before "
                "the last N epochs), not both."
            )
        if metric is not None and not callable(metric):
            raise ValueError("TransformCompression: metric must be callable as metric(pl_module, batch).")
        if not isinstance(metric_name, str) or not metric_name:
            raise ValueError(f"TransformCompression: metric_name must be a non-empty string, got {metric_name!r}.")
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"TransformCompression: progress must be True, False or None (auto), got {progress!r}.")
        self.progress = progress
        self.modules = None if modules is None else list(modules)
        self.family, self.at_epoch, self.finetune_epochs, self.verbose = family, at_epoch, finetune_epochs, verbose
        self.options = {"s": s, "m": m, "q": q, "bits": bits, "iterations": iterations}
        self.metric, self.metric_name = metric or accuracy_metric, metric_name
        self.report: list[dict[str, Any]] = []
        self.metric_before: float | None = None
        self.metric_after: float | None = None
        self.done = False
        self.compressed_checkpoint: str | None = None
        self.compressed_after_validation = False
        self._epoch: int | None = None
        self._compressed_in_fit = self._saved_since = self._metric_checked = False

    # ------------------------------------------------------------------------------------------------ selection
    @staticmethod
    def linear_modules(model: nn.Module) -> list[str]:
        """Names of the outermost ``nn.Linear`` / ``SVDLinear`` / ``FactorizedLinear`` modules of ``model``."""
        names: list[str] = []
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear | SVDLinear | FactorizedLinear) and name:
                if not any(name.startswith(f"{outer}.") for outer in names):
                    names.append(name)
        return names

    def _problem(self, module: nn.Module, parent: nn.Module | None, weights: bool) -> tuple[str | None, str | None]:
        """``(structural, weights)``: why ``module`` cannot be compressed whatever its values (known before
        training), and, with ``weights``, why its current values cannot be (all zero, NaN/inf); ``None`` when fine."""
        if isinstance(parent, nn.MultiheadAttention):
            return "it belongs to nn.MultiheadAttention, which reads its weight directly instead of calling it", None
        try:
            weight, bias = affine_parts(module)
        except (TypeError, NotAffineError) as error:
            return str(error), None
        n = weight.shape[1]
        if n < 2 or (self.family == "m" and n % 2):
            need = ">= 2, even" if self.family == "m" else ">= 2"
            return f"its {n} input features do not suit family {self.family!r} (needs {need})", None
        if self.options["s"] is not None and self.options["s"] > n:
            return f"s={self.options['s']} exceeds its {n} input features", None
        if not weights:
            return None, None
        if not bool(torch.isfinite(weight).all()) or (bias is not None and not bool(torch.isfinite(bias).all())):
            return None, "its weight or bias holds NaN or inf"
        if not bool((weight != 0).any()):
            return None, "its weight is all zeros (an unused or zero-initialised layer: nothing to compress)"
        return None, None

    def select(self, model: nn.Module, *, warn: bool = True, weights: bool = True) -> list[str]:
        """Names of the modules this callback will replace in ``model`` (see ``modules``).

        Args:
            model: the model as it is now.
            warn: warn about the layers that automatic selection (``modules=None``) skips because of their kind or
                shape (at the start of ``fit``: known before training).
            weights: also skip, always with a warning, the layers whose current weights cannot be compressed (all
                zero, NaN/inf): they stay dense. At compression time only, since training changes them.

        Raises:
            ValueError: a named module is missing or not compressible whatever its weights, or nothing is left to
                compress (unless only the weights' values left nothing).
        """
        available = self.linear_modules(model)
        chosen, skipped, kept_dense = [], [], []
        for name in self.modules if self.modules is not None else available:
            try:
                module = model.get_submodule(name)
            except AttributeError:
                raise ValueError(
                    f"TransformCompression: the model has no submodule {name!r}. Its Linear modules are: {available}."
                ) from None
            if isinstance(module, FactorizedLinear):
                continue  # already compressed (a resumed run)
            parent = model.get_submodule(name.rpartition(".")[0])
            problem, values = self._problem(module, parent, weights)
            if problem is None and values is None:
                chosen.append(name)
            elif problem is None:
                kept_dense.append(f"{name} ({values})")
            elif self.modules is not None:
                raise ValueError(f"TransformCompression: cannot compress {name!r}: {problem}.")
            else:
                skipped.append(f"{name} ({problem})")
        if skipped and warn:
            warnings.warn(f"TransformCompression: skipping {'; '.join(skipped)}.", stacklevel=2)
        if kept_dense:
            warnings.warn(
                f"TransformCompression: not compressing {'; '.join(kept_dense)}; these layers stay dense.", stacklevel=2
            )
        compressed = any(isinstance(model.get_submodule(n), FactorizedLinear) for n in available)
        if not chosen and not kept_dense and not compressed:
            raise ValueError(f"TransformCompression: no module to compress. The model's Linear modules: {available}.")
        return chosen

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Runs before the Trainer restores a ckpt_path: the model then rebuilds the compressed layers it loads.
        restore_factorized_on_load(pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._compressed_in_fit = self._saved_since = self._metric_checked = False
        if self.done:
            return
        # Fail (named modules) or warn (automatic selection) now, before training, about what no training changes.
        self.select(pl_module, warn=True, weights=False)
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
        if self._epoch is not None and trainer.world_size > 1:
            raise ValueError(
                "TransformCompression: fine-tuning after compression (at_epoch / finetune_epochs) needs a single "
                "process; under DDP use at_epoch=None (compress at the end of fit)."
            )

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        # The metric first runs at compression time, often the end of fit: try it on the first validation batch
        # (usually the sanity check, before training) so that a metric unfit for these batches fails early.
        if self._metric_checked or self.done or trainer.state.fn != "fit":
            return
        self._metric_checked = True
        try:
            with torch.no_grad():
                total, count = self.metric(pl_module, batch)
            float(total), float(count)
        except Exception as error:
            raise RuntimeError(
                f"TransformCompression: the metric {self.metric_name!r} failed on a validation batch "
                f"({type(error).__name__}: {error}); it must return (total, count) for a batch, e.g. the default "
                f"accuracy_metric needs batches (inputs, labels, ...) and logits from pl_module(inputs). Pass "
                f"metric=... that fits your batches."
            ) from error

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
        if self._compressed_in_fit and not self._saved_since and trainer.checkpoint_callbacks:
            if not trainer.fast_dev_run:  # a smoke run writes no checkpoint
                self._save_compressed(trainer)
        if self.verbose and self.report:
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
        for name in names:  # compress all first, then replace: an error leaves the model untouched
            kwargs = {k: v for k, v in self.options.items() if v is not None}
            layer = pl_module.get_submodule(name)
            new = compress_linear(layer, self.family, progress=progress, **kwargs)
            replacements[name] = keep_training_state(new, layer)  # a frozen layer stays frozen, its mode kept
        for name, new in replacements.items():
            parent_name, _, child = name.rpartition(".")
            old = pl_module.get_submodule(name)
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

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float | None:
        """``metric`` over the validation data (:func:`evaluate_metric`), or ``None`` with a warning."""
        return evaluate_metric(trainer, pl_module, self.metric)

    def _print_table(self) -> None:
        print_report(self.report, self.metric_name, self.metric_before, self.metric_after)

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "report": self.report,
            "metric_before": self.metric_before,
            "metric_after": self.metric_after,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = bool(state_dict.get("done", False))
        self.report = list(state_dict.get("report", []))
        self.metric_before = state_dict.get("metric_before")
        self.metric_after = state_dict.get("metric_after")
