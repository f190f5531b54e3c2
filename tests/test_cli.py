import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_ortho.cli import run_cli
from tests.datasets_on_disk import write_cifar10, write_mnist

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
DIGITS = ROOT / "recipes" / "fcnn_digits.yaml"


def fit(recipe: Path, root: Path, *overrides: str):
    """``lightning-ortho fit --config RECIPE OVERRIDES...`` in process, logs under ``root``."""
    return run_cli(["fit", "--config", str(recipe), f"--trainer.default_root_dir={root}", *overrides])


def data_overrides(recipe: Path, root: Path) -> list[str]:
    """Point a recipe's MNIST/CIFAR-10 data module (possibly nested) at tiny files in the real formats."""
    config = yaml.safe_load(recipe.read_text())["data"]
    key = "--data.init_args"
    if config["class_path"].endswith("SequentialImageDataModule"):
        config, key = config["init_args"]["images"], key + ".images.init_args"
    name = config["class_path"].rsplit(".", 1)[-1]
    if name == "MNISTDataModule":
        write_mnist(root)
        return [f"{key}.root={root}"]
    if name == "CIFAR10DataModule":
        write_cifar10(root)
        return [f"{key}.root={root}", f"{key}.verify_checksums=false"]
    return []


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_fast_dev_run_in_process(recipe, tmp_path):
    cli = fit(recipe, tmp_path, "--trainer.fast_dev_run=true", *data_overrides(recipe, tmp_path / "data"))
    assert cli.trainer.state.finished
    metrics = cli.trainer.callback_metrics
    assert any(k.startswith("val_") for k in metrics) and any(k.startswith("train_") for k in metrics)
    assert all(torch.isfinite(v).all() for v in metrics.values())


def test_console_script_runs_recipe_and_prints_accuracy(tmp_path):
    script = shutil.which("lightning-ortho", path=str(Path(sys.executable).parent)) or shutil.which("lightning-ortho")
    assert script, "the lightning-ortho console script is not installed (pip install -e .)"
    command = [script, "fit", "--config", str(DIGITS), "--trainer.fast_dev_run=true"]
    command += ["--model.init_args.orthogonal=householder", f"--trainer.default_root_dir={tmp_path}"]
    env = {**os.environ, "COLUMNS": "120"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation accuracy:" in result.stdout


def test_progress_bar_can_be_turned_off(tmp_path):
    cli = fit(DIGITS, tmp_path, "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false")
    assert cli.trainer.progress_bar_callback is None


def test_data_sizes_are_linked_into_the_model(tmp_path):
    cli = fit(DIGITS, tmp_path, "--trainer.fast_dev_run=true", "--data.init_args.image_size=12")
    assert cli.model.hparams.in_features == 144


def test_demo_recipe_reaches_the_readme_accuracy(tmp_path):
    # README: `make demo` ends with validation accuracy 0.974 (8 epochs, seed 0); allow BLAS-level drift.
    cli = fit(
        DIGITS,
        tmp_path,
        "--trainer.enable_progress_bar=false",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
    )
    assert float(cli.trainer.callback_metrics["val_acc"]) >= 0.95


def test_missing_dataset_ends_the_command_with_one_clear_message(tmp_path):
    script = shutil.which("lightning-ortho", path=str(Path(sys.executable).parent)) or shutil.which("lightning-ortho")
    command = [script, "fit", "--config", str(ROOT / "recipes" / "rnn_pixel_mnist.yaml")]
    command += [
        f"--data.init_args.images.init_args.root={tmp_path / 'empty'}",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2
    assert "MNIST was not found" in result.stderr and str(tmp_path / "empty" / "MNIST" / "raw") in result.stderr
    assert "images.init_args.download=true" in result.stderr and "Traceback" not in result.stderr
