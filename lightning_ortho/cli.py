"""The ``lightning-ortho`` command: LightningCLI over every model and data module of the package.

lightning-ortho fit --config recipes/fcnn_digits.yaml
lightning-ortho fit --config recipes/fcnn_digits.yaml --model.init_args.orthogonal=cayley
lightning-ortho fit --config recipes/fcnn_digits.yaml --trainer.callbacks+=OrthogonalityMonitor
lightning-ortho predict --config recipes/fcnn_digits.yaml --ckpt_path=PATH   (writes predictions.pt, see PredictionWriter)

``test``, ``validate`` and ``predict`` without ``--ckpt_path`` score the model as its configuration initialises it
(untrained): the command warns, and the figures it prints say so. A ``--ckpt_path`` of another model class than the
configuration's is refused before anything is built (:class:`CheckpointMismatchError`).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import torch

# Importing registers the subclasses that `class_path: ...` may name by their short names too. The callbacks
# package is lazy (Lightning imports it on every Trainer), so its modules are imported explicitly: jsonargparse
# resolves `--trainer.callbacks+=OrthogonalityMonitor` only among the Callback subclasses already imported.
import lightning_ortho.callbacks
import lightning_ortho.datamodules  # noqa: F401
import lightning_ortho.models  # noqa: F401
from lightning_ortho._lightning import every_package, pl, rank_zero_only, rank_zero_warn
from lightning_ortho.callbacks.prediction_writer import PredictionWriter

lightning_ortho.callbacks.import_all()

_cli = importlib.import_module(f"{pl.__name__}.cli")
LightningArgumentParser, LightningCLI = _cli.LightningArgumentParser, _cli.LightningCLI
ProgressBar, RichModelSummary, RichProgressBar = (
    pl.callbacks.ProgressBar,
    pl.callbacks.RichModelSummary,
    pl.callbacks.RichProgressBar,
)


#: What the printed figures of ``test``, ``validate`` and ``predict`` carry when no checkpoint was loaded.
UNTRAINED = "untrained weights: no --ckpt_path checkpoint was loaded"


class CheckpointMismatchError(ValueError):
    """``--ckpt_path`` names a checkpoint saved from another model class than the one the configuration builds."""


class LightningOrthoCLI(LightningCLI):
    """LightningCLI with the data module's sizes linked into the model and a closing summary; ``predict`` writes
    its outputs with a :class:`~lightning_ortho.callbacks.PredictionWriter` (added unless the configuration has a
    ``BasePredictionWriter`` already).

    ``--ckpt_path`` must hold a checkpoint of the configuration's model class (else
    :class:`CheckpointMismatchError`, raised before the trainer, model or data are built). ``test``, ``validate``
    and ``predict`` without it warn that the weights are the untrained ones the configuration initialises, and the
    figures the command prints end with that note (:data:`UNTRAINED`): scoring an untrained model is a legitimate
    baseline (chance level), as in ``Trainer.test(model)``, but never one to mistake for the trained model's.
    """

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # Checked here, before LightningCLI applies the checkpoint's saved options (a public hook: it runs whatever
        # the private method that restores them is called in a Lightning release).
        super().parse_arguments(parser, args)
        self._check_checkpoint_class()

    def _check_checkpoint_class(self) -> None:
        """Refuse a ``--ckpt_path`` saved from another model class than the configuration's ``model.class_path``.

        LightningCLI feeds the class saved in the checkpoint back into the configuration: a checkpoint of another
        model would replace the configured model class (and then fail on the data's batches) or fail to parse
        against the configured options. A checkpoint without a saved class (not written through LightningCLI) or
        a configuration without a model class (the checkpoint then chooses it) is not checked.

        Raises:
            CheckpointMismatchError: the two classes differ (the message names both).
        """
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        ckpt_path = config.get("ckpt_path")
        model = config.get("model")
        given = model.get("class_path") if model is not None and hasattr(model, "get") else None
        if not ckpt_path or not given or not Path(ckpt_path).is_file():
            return
        saved = _saved_class_path(ckpt_path)
        if saved is None or _resolve_class(saved) == _resolve_class(given):
            return
        saved_name, given_name = saved.rpartition(".")[2], given.rpartition(".")[2]
        beside = Path(ckpt_path).resolve().parent.parent / "config.yaml"
        where = f" (the run that saved it kept its configuration: --config {beside})" if beside.is_file() else ""
        raise CheckpointMismatchError(
            f"--ckpt_path {ckpt_path} is a checkpoint of {saved_name} ({saved}), but the configuration builds "
            f"{given_name} ({given}): its weights and saved options belong to another model. Give the configuration "
            f"the checkpoint was trained with{where}, or a checkpoint of {given_name}."
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        # Stream data modules (online training) state their sizes; a link whose source or target is missing is skipped.
        parser.link_arguments("data.input_size", "model.init_args.cell.init_args.input_size", apply_on="instantiate")
        parser.link_arguments("data.output_size", "model.init_args.output_size", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        # LightningCLI (its private _parse_ckpt_path, in both Lightning packages) applies a checkpoint's saved
        # hyperparameters over the command line and the config: say which model options given there the checkpoint
        # replaced, rather than train silently with other values. Where a Lightning release renames the method,
        # this override is simply not called.
        given = self._model_options()
        super()._parse_ckpt_path()
        restored = self._model_options()
        replaced = {
            key: (value, restored[key])
            for key, value in given.items()
            # None: not given (link targets such as the data's sizes are filled in later)
            if value is not None and key in restored and restored[key] != value
        }
        if replaced:
            changes = ", ".join(f"{key}={old!r} -> {new!r}" for key, (old, new) in sorted(replaced.items()))
            rank_zero_warn(
                f"lightning-ortho: --ckpt_path restores the model's options saved in the checkpoint, which replace "
                f"the ones given on the command line or in the config: {changes}. To train the checkpoint's weights "
                "with other options, build the model with them and load only the weights (torch.load(path)"
                "['state_dict'] into model.load_state_dict), then fit without --ckpt_path.",
                category=UserWarning,
            )

    def _model_options(self) -> dict[str, Any]:
        """The model's options in the parsed config, by name (nested ones, such as a cell's, by dotted name):
        numbers, strings, booleans, None and dicts or lists of them (``estimator_options``)."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        model = config.get("model")
        init_args = model.get("init_args") if model is not None and hasattr(model, "get") else None
        if init_args is None:
            return {}
        plain = (int, float, str, bool, type(None), dict, list, tuple)
        return {key: value for key, value in dict(init_args).items() if isinstance(value, plain)}

    def before_instantiate_classes(self) -> None:
        # With --ckpt_path, LightningCLI feeds the checkpoint's saved hyperparameters back as the model's
        # `dict_kwargs`. They were dumped with the link targets above, which a model without those arguments (Glow,
        # the fast transform: no in_features or num_classes) never received and would now refuse: drop the keys the
        # model's constructor does not take.
        config = self.config[self.subcommand] if self.subcommand else self.config
        model = config.get("model")
        extra = model.get("dict_kwargs") if model is not None and hasattr(model, "get") else None
        if not extra or not model.get("class_path"):
            return
        module_name, _, class_name = model.class_path.rpartition(".")
        parameters = inspect.signature(getattr(importlib.import_module(module_name), class_name)).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return
        model.dict_kwargs = {key: value for key, value in extra.items() if key in parameters}

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        # The rich progress bar is a default, not a requirement: drop it when the user turns bars off.
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        if config.get("trainer", {}).get("enable_progress_bar") is False:
            callbacks = [c for c in self.trainer_defaults.get("callbacks", []) if not isinstance(c, ProgressBar)]
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": callbacks}
        if self.subcommand == "predict":
            given = config.get("trainer", {}).get("callbacks") or []
            given = given if isinstance(given, list) else [given]
            if not any(isinstance(c, every_package("callbacks.BasePredictionWriter")) for c in given):
                callbacks = [*self.trainer_defaults.get("callbacks", []), PredictionWriter()]
                self.trainer_defaults = {**self.trainer_defaults, "callbacks": callbacks}
        return super().instantiate_trainer(**kwargs)

    def before_validate(self) -> None:
        self._warn_if_untrained("validate")

    def before_test(self) -> None:
        self._warn_if_untrained("test")

    def before_predict(self) -> None:
        self._warn_if_untrained("predict")

    def _warn_if_untrained(self, stage: str) -> None:
        """Warn that ``stage`` runs on the weights the configuration initialises when no ``--ckpt_path`` is given,
        naming the newest checkpoint under the run's root folder (if any) to pass instead."""
        if self._get(self.config, "ckpt_path") is not None:
            return
        root = Path(self.trainer.default_root_dir)
        newest = _newest_checkpoint(root)
        found = f"; the newest under {root} is {newest}" if newest else f"; none was found under {root}: fit first"
        rank_zero_warn(
            f"lightning-ortho {stage}: no --ckpt_path was given, so the model runs with the weights its configuration "
            "initialises (untrained), and the figures printed are not a trained model's. Give --ckpt_path=PATH, a "
            f"checkpoint that `lightning-ortho fit` saved{found} (--ckpt_path=best and last name checkpoints of "
            f"the current run, which a separate `{stage}` command does not have).",
            category=UserWarning,
        )

    def _untrained(self, stage: str) -> bool:
        """``stage`` (test, validate, predict) ran without loading a checkpoint (Lightning records the one it
        loaded in ``trainer.ckpt_path``; ``--ckpt_path=last`` with no last checkpoint loads none)."""
        return stage != "fit" and self.trainer.ckpt_path is None

    def after_fit(self) -> None:
        self._print_summary("fit")

    def after_validate(self) -> None:
        self._print_summary("validate")

    def after_test(self) -> None:
        self._print_summary("test")

    @rank_zero_only
    def after_predict(self) -> None:
        # The writer's own line (logged during the pass) cannot know where the weights came from: repeat its
        # figures with the note when no checkpoint was loaded.
        if not self._untrained("predict"):
            return
        from rich.console import Console

        kind = every_package("callbacks.BasePredictionWriter")
        summaries = [getattr(c, "summary", None) for c in self.trainer.callbacks if isinstance(c, kind)]
        figures = "; ".join(s for s in summaries if s) or "predictions written"
        line = f"lightning-ortho predict ({UNTRAINED}): {figures}"
        Console().print(line, soft_wrap=True, highlight=False, markup=False)

    @rank_zero_only
    def _print_summary(self, stage: str) -> None:
        from rich.table import Table

        from lightning_ortho.callbacks._console import wide_console

        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if v.numel() == 1}
        if not metrics:
            return
        untrained = self._untrained(stage)
        note = f" ({UNTRAINED})" if untrained else ""
        table = Table(title=f"lightning-ortho {stage}: final metrics")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name in sorted(metrics):
            table.add_row(name, f"{metrics[name]:.4f}")
        console = wide_console(table)
        console.print(table)
        # soft_wrap: one line however narrow the terminal (scripts read it)
        lines = []
        if "val_acc" in metrics:
            lines.append(f"validation accuracy: {self._final_accuracy(stage, metrics)}")
        if "val_bpd" in metrics:
            lines.append(f"validation bits/dim: {metrics['val_bpd']:.4f}")
        if "test_acc" in metrics:
            lines.append(f"test accuracy: {metrics['test_acc']:.4f}")
        if untrained and not lines:
            lines.append(f"lightning-ortho {stage}: the metrics above are of {UNTRAINED}")
        else:
            lines = [line + note for line in lines]
        for line in lines:
            console.print(line, soft_wrap=True)

    def _final_accuracy(self, stage: str, metrics: dict[str, float]) -> str:
        """``val_acc`` of the model the run ends with: a TransformCompression after the fit's last validation (at
        its end, by default) leaves ``val_acc`` describing the dense model, so the compressed figure comes first."""
        dense, kind = metrics["val_acc"], lightning_ortho.callbacks.TransformCompression
        late = [c for c in self.trainer.callbacks if isinstance(c, kind) and c.compressed_after_validation]
        if stage != "fit" or not late:
            return f"{dense:.4f}"
        callback = late[0]
        if callback.metric_name == "val_acc" and callback.metric_after is not None:
            # both figures from the callback: the same batches (it runs every validation batch), before and after
            before = dense if callback.metric_before is None else callback.metric_before
            return f"{callback.metric_after:.4f} (compressed; {before:.4f} before compression)"
        if callback.metric_name is None:
            return (
                f"{dense:.4f} of the dense model, before the layers were compressed at the end of fit (the compressed "
                "model was not scored: give TransformCompression a metric)"
            )
        after = "not measured" if callback.metric_after is None else f"{callback.metric_after:.4f}"
        return (
            f"{dense:.4f} of the dense model, before the layers were compressed at the end of fit (the compressed "
            f"model's {callback.metric_name}: {after})"
        )


def _saved_class_path(ckpt_path: str) -> str | None:
    """The model class LightningCLI saved in a checkpoint's hyperparameters (``_class_path``), or ``None`` when it
    saved none or the file does not load (LightningCLI then reports it). Memory-mapped where the format allows, so
    the weights are not read."""
    for mmap in (True, False):
        try:
            checkpoint = torch.load(ckpt_path, weights_only=True, map_location="cpu", mmap=mmap)
        except Exception:
            continue
        hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
        saved = hparams.get("_class_path") if isinstance(hparams, dict) else None
        return saved if isinstance(saved, str) else None
    return None


def _resolve_class(class_path: str) -> object:
    """The class a dotted path names (``lightning_ortho.models.X`` and its defining module's path are the same
    class); the path itself when it does not import."""
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return class_path


def _newest_checkpoint(root: Path) -> Path | None:
    """The most recently written ``.ckpt`` where ``fit`` puts them under ``root``: ``root/*/version_*/checkpoints``
    (with a logger) or ``root/checkpoints`` (without). Bounded patterns: ``root`` may be a large working directory."""
    try:
        found = [*root.glob("*/version_*/checkpoints/*.ckpt"), *root.glob("checkpoints/*.ckpt")]
        return max(found, key=lambda path: path.stat().st_mtime) if found else None
    except OSError:
        return None


def run_cli(args: list[str] | None = None) -> LightningOrthoCLI:
    """Build and run the CLI; ``args`` replaces ``sys.argv[1:]``. Returns the CLI (trainer, model, datamodule)."""
    return LightningOrthoCLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults={"callbacks": [RichProgressBar(leave=True), RichModelSummary(max_depth=2)]},
        save_config_kwargs={"overwrite": True},
        args=args,
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lightning-ortho`` console script.

    A missing dataset, a data option that the data module cannot honour (``--data.root`` on a recipe with
    embedded data), an optional dependency that is not installed (the message names the extra), or a
    ``--ckpt_path`` of another model class than the configuration's ends the command with its message and exit
    status 2, not a traceback.
    """
    try:
        run_cli(args)
    except Exception as error:
        found = _user_error(error)
        if found is None:
            raise
        from rich.console import Console
        from rich.markup import escape

        title, message = found
        # escape: messages hold brackets that are not markup (pip install "lightning-ortho[vision]")
        Console(stderr=True).print(
            f"[bold red]{title}[/bold red] {escape(str(message))}", highlight=False, soft_wrap=True
        )
        raise SystemExit(2) from None


def _user_error(error: BaseException) -> tuple[str, BaseException] | None:
    """``(title, error)`` for the data errors a user fixes on the command line, found along the ``__cause__``
    chain (jsonargparse re-raises errors of the data module's constructor ``from`` them); ``None`` otherwise."""
    from lightning_ortho._extras import MissingExtraError
    from lightning_ortho.datamodules import DataOptionError, DatasetFormatError, DatasetNotFoundError

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatasetNotFoundError):
            return "Dataset not found.", current
        if isinstance(current, DatasetFormatError):
            return "Dataset file damaged.", current
        if isinstance(current, DataOptionError):
            return "Data option not accepted.", current
        if isinstance(current, MissingExtraError):
            return "Optional dependency missing.", current
        if isinstance(current, CheckpointMismatchError):
            return "Checkpoint of another model.", current
        current = current.__cause__
    return None


if __name__ == "__main__":
    main()
