"""The recipes ship inside the package: ``--config NAME`` runs the shipped copy from any directory, a path that exists
always wins, ``lightning-ortho recipes`` lists them, and the repository's ``recipes/`` is the shipped folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ortho.command import main
from lightning_ortho.shipped_recipes import (
    RecipeNotFoundError,
    recipe_folder,
    recipe_names,
    recipe_path,
    recipe_summary,
    resolve_config,
    resolve_config_arguments,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_repository_recipes_are_the_shipped_ones():
    assert (ROOT / "recipes").resolve() == recipe_folder().resolve()
    assert recipe_names() == sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))
    assert "fcnn_digits" in recipe_names() and "compress_cnn_digits" in recipe_names()


def test_every_recipe_has_a_one_line_title():
    for name in recipe_names():
        title = recipe_summary(name)
        lines = recipe_path(name).read_text().splitlines()
        assert lines[0] == f"# {title}" and lines[1] == "#", name  # the title, then the header's own text
        assert 20 <= len(title) <= 110 and title.endswith("."), name


def test_a_name_resolves_to_the_shipped_recipe_and_a_path_that_exists_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a directory without the repository
    shipped = str(recipe_path("fcnn_digits"))
    assert resolve_config("fcnn_digits") == shipped
    assert resolve_config("fcnn_digits.yaml") == shipped
    assert resolve_config("recipes/fcnn_digits.yaml") == shipped  # the README's command, outside the clone
    assert resolve_config("some/other/place.yaml") == "some/other/place.yaml"  # the parser says it does not exist
    own = tmp_path / "fcnn_digits.yaml"
    own.write_text("trainer: {}\n")
    assert resolve_config("fcnn_digits.yaml") == "fcnn_digits.yaml"  # a file of that name here wins
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "fcnn_digits.yaml").write_text("trainer: {}\n")
    assert resolve_config("recipes/fcnn_digits.yaml") == "recipes/fcnn_digits.yaml"
    with pytest.raises(RecipeNotFoundError, match="fcnn_digits, fcnn_mnist"):
        resolve_config("fcnn_digitz")


def test_every_form_of_the_config_option_is_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = str(recipe_path("glow_digits"))
    args = ["fit", "--config", "glow_digits", "--trainer.max_epochs=1"]
    assert resolve_config_arguments(args) == ["fit", "--config", shipped, "--trainer.max_epochs=1"]
    assert resolve_config_arguments(["fit", "--config=glow_digits"]) == ["fit", f"--config={shipped}"]
    assert resolve_config_arguments(["fit", "-c", "glow_digits"]) == ["fit", "-c", shipped]
    # other options are left alone, even where their value is a recipe's name
    assert resolve_config_arguments(["fit", "--data.root", "glow_digits"]) == ["fit", "--data.root", "glow_digits"]


def test_the_recipes_command_lists_every_recipe(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    main(["recipes"])
    out = capsys.readouterr().out
    for name in recipe_names():
        assert name in out and recipe_summary(name) in out


def test_an_unknown_name_ends_in_one_line_and_status_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "fcnn_digitz"])
    assert exit_info.value.code == 2
    assert "Recipe not found." in capsys.readouterr().err


def test_the_console_script_runs_a_recipe_by_name_outside_the_repository(tmp_path):
    script = shutil.which("lightning-ortho", path=str(Path(sys.executable).parent)) or shutil.which("lightning-ortho")
    assert script, "the lightning-ortho console script is not installed (pip install -e .)"
    command = [script, "fit", "--config", "fcnn_digits", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    command += ["--trainer.limit_val_batches=1"]
    env = {**os.environ, "COLUMNS": "120"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation accuracy:" in result.stdout
    # the recipe's relative paths are relative to the directory the command runs in
    assert list((tmp_path / "lightning_logs" / "fcnn_digits").glob("**/checkpoints/*.ckpt"))


def test_a_recipes_data_root_is_taken_from_the_directory_the_command_runs_in(tmp_path):
    """fcnn_mnist's ``root: data`` is ``./data`` of the working directory, wherever the recipe itself lives."""
    from tests.datasets_on_disk import write_mnist

    script = shutil.which("lightning-ortho", path=str(Path(sys.executable).parent)) or shutil.which("lightning-ortho")
    assert script, "the lightning-ortho console script is not installed (pip install -e .)"
    command = [script, "fit", "--config", "fcnn_mnist", "--trainer.fast_dev_run=true"]
    env = {**os.environ, "COLUMNS": "200"}
    empty, with_data = tmp_path / "empty", tmp_path / "with_data"
    empty.mkdir()
    write_mnist(with_data / "data")
    missing = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=empty, env=env)
    assert missing.returncode != 0
    assert f"MNIST was not found in {empty / 'data' / 'MNIST' / 'raw'}" in missing.stderr + missing.stdout
    assert "A relative root is taken from the directory the command runs in" in missing.stderr + missing.stdout
    found = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=with_data, env=env)
    assert found.returncode == 0, found.stderr[-3000:]
    assert "validation accuracy:" in found.stdout
