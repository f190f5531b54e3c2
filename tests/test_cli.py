import importlib
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_ortho.cli import main, run_cli
from lightning_ortho.datamodules import DatasetNotFoundError, DigitsDataModule, StreamDataModule
from lightning_ortho.shipped_recipes import recipe_names, recipe_path
from tests.datasets_on_disk import ON_DISK

ROOT = Path(__file__).resolve().parents[1]
#: the shipped copies, those an installed package runs (the repository's recipes/ links to their folder)
RECIPES = [recipe_path(name) for name in recipe_names()]
DIGITS = recipe_path("fcnn_digits")


def fit(recipe: Path, root: Path, *overrides: str):
    """``lightning-ortho fit --config RECIPE OVERRIDES...`` in process, logs under ``root``."""
    return run_cli(["fit", "--config", str(recipe), f"--trainer.default_root_dir={root}", *overrides])


def image_module(recipe: Path) -> tuple[type, str]:
    """The class of the data module that holds a recipe's images (the one wrapped by SequentialImageDataModule,
    if any), read from the recipe itself, and the option prefix of that module's own arguments."""
    config, prefix = yaml.safe_load(recipe.read_text())["data"], "--data."
    if "images" in config.get("init_args", {}):
        config, prefix = config["init_args"]["images"], "--data.init_args.images.init_args."
    module, name = config["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name), prefix


def reads_files(recipe: Path) -> bool:
    return "root" in inspect.signature(image_module(recipe)[0]).parameters


FILE_RECIPES = [r for r in RECIPES if reads_files(r)]
EMBEDDED_RECIPES = [r for r in RECIPES if not reads_files(r)]


def data_overrides(recipe: Path, root: Path) -> list[str]:
    """Write tiny files in the real formats under ``root`` for a recipe that reads files, and point the recipe
    there with the one documented option, ``--data.root``."""
    if not reads_files(recipe):
        return []
    module, prefix = image_module(recipe)
    assert module.__name__ in ON_DISK, f"{recipe.name}: add a writer of tiny {module.__name__} files to ON_DISK"
    disk = ON_DISK[module.__name__]
    disk.write(root)
    return [f"--data.root={root}", *(f"{prefix}{name}={value}" for name, value in disk.options.items())]


def assert_read_from(cli, recipe: Path, root: Path) -> None:
    """The run's data came from ``root``: the data module says so, records it, and holds the tiny files' data."""
    data = cli.datamodule
    images = getattr(data, "images", data)
    assert data.root == images.root == str(root)
    recorded = data.hparams["images"]["init_args"] if data is not images else data.hparams
    assert recorded["root"] == str(root)
    assert len(data.split("test")) == ON_DISK[image_module(recipe)[0].__name__].n_test


def test_recipes_that_read_files_are_found_by_reading_the_recipes():
    classes = {image_module(r)[0].__name__ for r in FILE_RECIPES}
    assert classes == set(ON_DISK)  # every on-disk format is exercised by a recipe, and vice versa
    # the rest read embedded or generated data: the digits, or streams for online training
    embedded = {image_module(r)[0] for r in EMBEDDED_RECIPES}
    assert EMBEDDED_RECIPES and all(c is DigitsDataModule or issubclass(c, StreamDataModule) for c in embedded)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_fast_dev_run_in_process(recipe, tmp_path):
    cli = fit(recipe, tmp_path, "--trainer.fast_dev_run=true", *data_overrides(recipe, tmp_path / "data"))
    assert cli.trainer.state.finished
    metrics = cli.trainer.callback_metrics
    assert any(k.startswith("val_") for k in metrics) and any(k.startswith("train_") for k in metrics)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    if recipe in FILE_RECIPES:
        assert_read_from(cli, recipe, tmp_path / "data")


@pytest.mark.parametrize("recipe", FILE_RECIPES, ids=[r.stem for r in FILE_RECIPES])
def test_a_wrong_data_root_is_the_missing_dataset_error_naming_that_folder(recipe, tmp_path):
    # The long spelling of the option works as well as --data.root.
    wrong = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as info:
        fit(recipe, tmp_path, "--trainer.fast_dev_run=true", f"--data.init_args.root={wrong}")
    folder = ON_DISK[image_module(recipe)[0].__name__].folder
    assert str(wrong / folder) in str(info.value) and "--data.root=DIR" in str(info.value)


@pytest.mark.parametrize("recipe", EMBEDDED_RECIPES, ids=[r.stem for r in EMBEDDED_RECIPES])
def test_data_root_on_a_recipe_with_embedded_data_is_a_clear_error(recipe, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(recipe), f"--data.root={tmp_path}", f"--trainer.default_root_dir={tmp_path}"])
    assert info.value.code == 2
    error = capsys.readouterr().err
    assert "root" in error and "Traceback" not in error


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_states_its_data_location_in_one_header_line(recipe):
    lines = [line for line in recipe.read_text().splitlines() if line.startswith("# Data location:")]
    assert len(lines) == 1, "one '# Data location:' line in the header"
    if recipe in FILE_RECIPES:
        folder = ON_DISK[image_module(recipe)[0].__name__].folder
        assert f"--data.root=DIR reads DIR/{folder}" in lines[0]
        downloads = "download" in inspect.signature(image_module(recipe)[0]).parameters
        assert ("--data.download=true" in lines[0]) == downloads  # offered exactly where the module can download
    else:
        assert "no --data.root" in lines[0]


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


def test_stream_data_sizes_are_linked_into_the_online_model(tmp_path):
    recipe = ROOT / "recipes" / "online_copy.yaml"
    cli = fit(recipe, tmp_path, "--trainer.fast_dev_run=true", "--data.init_args.symbols=6")
    assert cli.model.cell.input_size == 8 and cli.model.output_size == 7  # symbols + 2 inputs, symbols + 1 classes


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
    command += [f"--data.root={tmp_path / 'empty'}", f"--trainer.default_root_dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2
    assert "MNIST was not found" in result.stderr and str(tmp_path / "empty" / "MNIST" / "raw") in result.stderr
    assert "--data.root=DIR" in result.stderr and "--data.download=true" in result.stderr
    assert "init_args" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("recipe", ["fcnn_digits", "rnn_digits", "glow_digits"])
def test_predict_subcommand_predicts_the_test_split(recipe, tmp_path):
    # Issue 9.11: `lightning-ortho predict` was offered but no data module had a predict_dataloader.
    path = ROOT / "recipes" / f"{recipe}.yaml"
    args = ["predict", "--config", str(path), f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    cli = run_cli([*args, "--trainer.limit_predict_batches=2"])
    predictions = cli.trainer.predict_loop.predictions
    data = cli.datamodule
    batch = data.batch_size
    assert len(predictions) == 2
    expected = (batch, 10) if recipe != "glow_digits" else (batch,)
    assert all(p.shape == expected and torch.isfinite(p).all() for p in predictions)
    test_inputs = next(iter(data.test_dataloader()))[0]
    with torch.no_grad():
        reference = cli.model(test_inputs) if recipe != "glow_digits" else None
    if reference is not None:
        torch.testing.assert_close(predictions[0], reference)  # the test split, in order


SHORT_NAMES = """
import io, sys
from contextlib import redirect_stdout
from lightning_ortho.cli import run_cli
import lightning_ortho.callbacks as callbacks

names = [c.__name__ for c in callbacks.import_all()]
recipes = sys.argv[1:]
# every callback once, every recipe once: pairs taken round-robin over the longer list
for i in range(max(len(names), len(recipes))):
    name, recipe = names[i % len(names)], recipes[i % len(recipes)]
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            run_cli(["fit", "--config", recipe, f"--trainer.callbacks+={name}", "--print_config"])
    except SystemExit as error:
        assert error.code in (0, None), (name, recipe, error.code)
    assert f".{name}\\n" in out.getvalue(), (name, recipe, out.getvalue()[-2000:])
    print("resolved", name, recipe)
"""


def test_every_public_callback_resolves_by_its_short_name_from_every_recipe(tmp_path):
    # A fresh interpreter: jsonargparse resolves a short name only among the Callback subclasses imported, which
    # other tests of this process may already have imported. No recipe imports most callbacks itself.
    env = {**os.environ, "COLUMNS": "200"}
    command = [sys.executable, "-c", SHORT_NAMES, *map(str, RECIPES)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("resolved")]
    import lightning_ortho.callbacks as callbacks
    from lightning_ortho._lightning import Callback

    # every public callback name is its class's own name (an alias could not be named on the command line)
    public = {n for n in callbacks.__all__ if isinstance(getattr(callbacks, n), type)}
    public = {n for n in public if issubclass(getattr(callbacks, n), Callback)}
    assert {c.__name__ for c in callbacks.import_all()} == public
    assert {name for name, _ in resolved} == public
    assert {recipe for _, recipe in resolved} == set(map(str, RECIPES))
    assert {"OrthogonalityMonitor", "PredictionWriter", "TransformCompression"} <= {name for name, _ in resolved}


def test_a_short_callback_name_runs_in_a_fit(tmp_path):
    cli = fit(DIGITS, tmp_path, "--trainer.fast_dev_run=true", "--trainer.callbacks+=OrthogonalityMonitor")
    assert [type(c).__name__ for c in cli.trainer.callbacks].count("OrthogonalityMonitor") == 1
