"""What ``--ckpt_path`` the command is given, or not: ``test``, ``validate`` and ``predict`` without it score the
untrained weights the configuration initialises and say so (a warning naming ``--ckpt_path``, and the printed
figures carry the note); a checkpoint of another model class than the configuration's is refused before anything is
built, naming both classes."""

import warnings
from pathlib import Path

import pytest

from lightning_ortho.cli import UNTRAINED, CheckpointMismatchError, main, run_cli

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
CLASSES = {"fcnn_digits": "OrthogonalClassifier", "online_copy": "OnlineRNNModule"}


def args(subcommand: str, recipe: str, root: Path, *overrides: str) -> list[str]:
    config = ["--config", str(ROOT / "recipes" / f"{recipe}.yaml"), f"--trainer.default_root_dir={root}"]
    return [subcommand, *config, *QUIET, *overrides]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One checkpoint of each recipe's model, from a fit of one batch."""
    found = {}
    for recipe in CLASSES:
        root = tmp_path_factory.mktemp(recipe)
        short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]
        run_cli(args("fit", recipe, root, *short))
        (found[recipe],) = (root / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    return found


def untrained_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "no --ckpt_path was given" in str(w.message)]


@pytest.mark.parametrize("subcommand", ["test", "validate", "predict"])
def test_without_a_checkpoint_the_command_warns_and_its_figures_say_untrained(subcommand, checkpoints, capsys):
    root = checkpoints["fcnn_digits"].parents[3]  # the fit's root folder: the warning finds its checkpoint there
    limit = f"--trainer.limit_{'val' if subcommand == 'validate' else subcommand}_batches=1"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(args(subcommand, "fcnn_digits", root, "--trainer.logger=false", limit))
    (message,) = untrained_warnings(caught)
    assert f"lightning-ortho {subcommand}:" in message and "untrained" in message
    assert "--ckpt_path=PATH" in message and "--ckpt_path=best and last" in message
    assert str(checkpoints["fcnn_digits"]) in message  # the newest checkpoint under the root, named
    printed = capsys.readouterr().out
    accuracy = {"test": "test accuracy: ", "validate": "validation accuracy: ", "predict": "accuracy "}[subcommand]
    (line,) = [line for line in printed.splitlines() if accuracy in line]
    assert UNTRAINED in line, printed[-2000:]


@pytest.mark.parametrize("subcommand", ["test", "predict"])
def test_with_a_checkpoint_neither_warning_nor_note(subcommand, checkpoints, tmp_path, capsys):
    limit = f"--trainer.limit_{subcommand}_batches=1"
    ckpt = f"--ckpt_path={checkpoints['fcnn_digits']}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(args(subcommand, "fcnn_digits", tmp_path, "--trainer.logger=false", limit, ckpt))
    assert not untrained_warnings(caught)
    printed = capsys.readouterr().out
    assert UNTRAINED not in printed
    if subcommand == "test":
        assert "test accuracy: " in printed


def test_the_warning_says_when_no_checkpoint_is_under_the_root(tmp_path):
    with pytest.warns(UserWarning, match=f"none was found under {tmp_path}: fit first"):
        run_cli(args("test", "online_copy", tmp_path, "--trainer.logger=false", "--trainer.limit_test_batches=1"))


@pytest.mark.parametrize(("recipe", "other"), [("fcnn_digits", "online_copy"), ("online_copy", "fcnn_digits")])
@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_a_checkpoint_of_another_model_is_refused_up_front_naming_both_classes(
    recipe, other, subcommand, checkpoints, tmp_path, capsys
):
    command = args(subcommand, recipe, tmp_path / "run", f"--ckpt_path={checkpoints[other]}")
    with pytest.raises(CheckpointMismatchError) as info:
        run_cli(command)
    message = str(info.value)
    assert f"a checkpoint of {CLASSES[other]} (lightning_ortho.models.{CLASSES[other]})" in message
    assert f"the configuration builds {CLASSES[recipe]} (lightning_ortho.models.{CLASSES[recipe]})" in message
    # the run that saved the checkpoint kept its configuration beside it: offered as the one to use
    assert f"--config {checkpoints[other].parents[1] / 'config.yaml'}" in message
    assert not (tmp_path / "run").exists()  # refused before the trainer (which makes the run folder) was built
    # the command ends with the message and exit status 2, not a traceback
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Checkpoint of another model." in error and "Traceback" not in error
    assert CLASSES[other] in error and CLASSES[recipe] in error


def test_a_checkpoint_of_the_same_model_is_accepted(checkpoints, tmp_path):
    ckpt = f"--ckpt_path={checkpoints['online_copy']}"
    quick = ["--trainer.logger=false", "--trainer.limit_test_batches=1"]
    cli = run_cli(args("test", "online_copy", tmp_path, ckpt, *quick))
    assert type(cli.model).__name__ == "OnlineRNNModule" and cli.trainer.ckpt_path == str(checkpoints["online_copy"])
