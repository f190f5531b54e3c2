"""The ``lightning-ortho`` command: LightningCLI over every model and data module of the package.

lightning-ortho fit --config recipes/fcnn_digits.yaml
lightning-ortho fit --config recipes/fcnn_digits.yaml --model.init_args.orthogonal=cayley
lightning-ortho fit --config recipes/fcnn_digits.yaml --trainer.callbacks+=OrthogonalityMonitor
lightning-ortho predict --config recipes/fcnn_digits.yaml --ckpt_path=PATH   (writes predictions.pt, see PredictionWriter)
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

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


class LightningOrthoCLI(LightningCLI):
    """LightningCLI with the data module's sizes linked into the model and a closing summary; ``predict`` writes
    its outputs with a :class:`~lightning_ortho.callbacks.PredictionWriter` (added unless the configuration has a
    ``BasePredictionWriter`` already)."""

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

    def after_fit(self) -> None:
        self._print_summary("fit")

    def after_validate(self) -> None:
        self._print_summary("validate")

    def after_test(self) -> None:
        self._print_summary("test")

    @rank_zero_only
    def _print_summary(self, stage: str) -> None:
        from rich.table import Table

        from lightning_ortho.callbacks._console import wide_console

        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if v.numel() == 1}
        if not metrics:
            return
        table = Table(title=f"lightning-ortho {stage}: final metrics")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name in sorted(metrics):
            table.add_row(name, f"{metrics[name]:.4f}")
        console = wide_console(table)
        console.print(table)
        if "val_acc" in metrics:
            # soft_wrap: one line however narrow the terminal (scripts read it)
            console.print(f"validation accuracy: {self._final_accuracy(stage, metrics)}", soft_wrap=True)
        if "val_bpd" in metrics:
            console.print(f"validation bits/dim: {metrics['val_bpd']:.4f}", soft_wrap=True)

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
    embedded data), or an optional dependency that is not installed (the message names the extra) ends the command
    with its message and exit status 2, not a traceback.
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
        current = current.__cause__
    return None


if __name__ == "__main__":
    main()
