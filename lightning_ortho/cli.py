"""The ``lightning-ortho`` command: LightningCLI over every model and data module of the package.

lightning-ortho fit --config recipes/fcnn_digits.yaml
lightning-ortho fit --config recipes/fcnn_digits.yaml --model.init_args.orthogonal=cayley
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ProgressBar, RichModelSummary, RichProgressBar
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI
from pytorch_lightning.utilities import rank_zero_only

# Importing registers the subclasses that `class_path: ...` may name by their short names too.
import lightning_ortho.callbacks  # noqa: F401
import lightning_ortho.datamodules  # noqa: F401
import lightning_ortho.models  # noqa: F401


class OrthoCLI(LightningCLI):
    """LightningCLI with the data module's sizes linked into the model and a closing summary."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        # The rich progress bar is a default, not a requirement: drop it when the user turns bars off.
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        if config.get("trainer", {}).get("enable_progress_bar") is False:
            callbacks = [c for c in self.trainer_defaults.get("callbacks", []) if not isinstance(c, ProgressBar)]
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
        from rich.console import Console
        from rich.table import Table

        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if v.numel() == 1}
        if not metrics:
            return
        table = Table(title=f"lightning-ortho {stage}: final metrics")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name in sorted(metrics):
            table.add_row(name, f"{metrics[name]:.4f}")
        console = Console()
        console.print(table)
        if "val_acc" in metrics:
            console.print(f"validation accuracy: {metrics['val_acc']:.4f}")
        if "val_bpd" in metrics:
            console.print(f"validation bits/dim: {metrics['val_bpd']:.4f}")


def run_cli(args: list[str] | None = None) -> OrthoCLI:
    """Build and run the CLI; ``args`` replaces ``sys.argv[1:]``. Returns the CLI (trainer, model, datamodule)."""
    return OrthoCLI(
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

    A missing dataset ends the command with its message and exit status 2, not a traceback.
    """
    from lightning_ortho.datamodules import DatasetNotFoundError

    try:
        run_cli(args)
    except DatasetNotFoundError as error:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]Dataset not found.[/bold red] {error}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
