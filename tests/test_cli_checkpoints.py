"""Every recipe family goes on from its checkpoint through the command: ``test``, ``predict`` and a resumed ``fit``
with ``--ckpt_path`` (LightningCLI feeds the checkpoint's hyperparameters back, which must not include the sizes the
command links into models that do not take them), and ``predict`` writes its file under ``fast_dev_run``."""

import copy
import warnings
from pathlib import Path

import pytest
import torch

from lightning_ortho.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
SHORT = ["--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1"]


def command(subcommand: str, recipe: str, root: Path, *overrides: str):
    args = [subcommand, "--config", str(ROOT / "recipes" / f"{recipe}.yaml"), f"--trainer.default_root_dir={root}"]
    return run_cli([*args, *QUIET, *overrides])


@pytest.mark.parametrize("recipe", ["fcnn_digits", "glow_digits", "transform_patches"])
def test_test_predict_and_a_resumed_fit_start_from_the_checkpoint(recipe, tmp_path):
    fit = command("fit", recipe, tmp_path, "--trainer.max_epochs=1", *SHORT)
    (checkpoint,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    weights = copy.deepcopy(fit.model.state_dict())
    ckpt = f"--ckpt_path={checkpoint}"
    tested = command("test", recipe, tmp_path, ckpt, "--trainer.limit_test_batches=1")
    state = tested.model.state_dict()  # the checkpoint's model, not a fresh one
    assert state.keys() == weights.keys()
    for key, value in weights.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key
    assert tested.trainer.callback_metrics, "test logged nothing"
    predicted = command("predict", recipe, tmp_path, ckpt, "--trainer.limit_predict_batches=1")
    assert list(Path(predicted.trainer.log_dir).glob("predictions.pt"))
    resumed = command("fit", recipe, tmp_path, ckpt, "--trainer.max_epochs=2", *SHORT)
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.global_step > fit.trainer.global_step


@pytest.mark.parametrize("recipe", ["fcnn_digits", "online_copy"])
def test_predict_under_fast_dev_run_writes_to_the_root_folder(recipe, tmp_path):
    command("predict", recipe, tmp_path, "--trainer.fast_dev_run=1")
    assert (tmp_path / "predictions.pt").is_file()


def test_a_resumed_fit_says_which_given_model_options_the_checkpoint_replaces(tmp_path):
    """LightningCLI applies the checkpoint's hyperparameters over the command line: an option given there that the
    checkpoint replaces is named in a warning, not dropped in silence; an unchanged resume warns nothing."""
    command("fit", "fcnn_digits", tmp_path, "--trainer.max_epochs=1", *SHORT)
    (checkpoint,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    ckpt = f"--ckpt_path={checkpoint}"
    with pytest.warns(UserWarning, match=r"replace the ones given on the command line or in the config: lr=0\.5 ->"):
        resumed = command(
            "fit", "fcnn_digits", tmp_path, ckpt, "--model.init_args.lr=0.5", "--trainer.max_epochs=2", *SHORT
        )
    assert resumed.model.hparams.lr != 0.5  # the checkpoint's, as the warning says
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        command("fit", "fcnn_digits", tmp_path, ckpt, "--trainer.max_epochs=2", *SHORT)
    assert not [w for w in caught if "restores the model's options" in str(w.message)]


def test_the_resume_warning_names_replaced_nested_and_dict_options(tmp_path):
    short = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    command("fit", "online_copy", tmp_path, "--trainer.max_epochs=1", *short)
    (checkpoint,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    given = [
        "--model.init_args.estimator_options={projection: state}",
        "--model.init_args.cell.init_args.hidden_size=8",
    ]
    with pytest.warns(UserWarning, match=r"hidden_size=8 -> 64, estimator_options=\{'projection': 'state'\} ->"):
        command("fit", "online_copy", tmp_path, f"--ckpt_path={checkpoint}", *given, "--trainer.max_epochs=2", *short)
