"""``lightning-ortho fit`` with TransformCompression: the closing "validation accuracy" line describes the model the
run ends with, also when the layers were compressed after the fit's last validation (at its end, by default)."""

import re
from pathlib import Path

import pytest

from lightning_ortho.callbacks import TransformCompression
from lightning_ortho.cli import run_cli

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "compress_fcnn_digits.yaml"
QUICK = [
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=2",
    "--model.init_args.depth=1",
    "--trainer.callbacks.init_args.m=16",
    "--trainer.callbacks.init_args.s=1",
    "--trainer.callbacks.init_args.verbose=false",
]


def final_line(capsys) -> str:
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("validation accuracy:")]
    return line


def test_compressed_at_the_end_of_fit_the_accuracy_line_is_the_compressed_models(tmp_path, capsys):
    args = ["fit", "--config", str(RECIPE), "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}"]
    cli = run_cli([*args, *QUICK, "--trainer.callbacks.init_args.finetune_epochs=0"])
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, TransformCompression)]
    assert callback.metric_after != callback.metric_before  # s=1: the figures differ, so a wrong one shows
    line = final_line(capsys)
    before, after = callback.metric_before, callback.metric_after  # both over every validation batch
    expected = f"validation accuracy: {after:.4f} (compressed; {before:.4f} before compression)"
    assert line == expected
    # and the table lists the compression's figures, read from trainer.callback_metrics
    assert float(cli.trainer.callback_metrics["compression/val_acc_after"]) == pytest.approx(after, rel=1e-6)


def test_compressed_during_fit_and_validated_after_the_line_is_the_last_validation(tmp_path, capsys):
    args = ["fit", "--config", str(RECIPE), "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}"]
    cli = run_cli([*args, *QUICK, "--trainer.callbacks.init_args.finetune_epochs=1"])
    line = final_line(capsys)
    assert re.fullmatch(r"validation accuracy: \d\.\d{4}", line), line
    assert line == f"validation accuracy: {float(cli.trainer.callback_metrics['val_acc']):.4f}"


def test_compressed_at_the_end_of_fit_without_a_metric_the_line_says_the_compressed_model_was_not_scored(
    tmp_path, capsys
):
    args = ["fit", "--config", str(RECIPE), "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}"]
    cli = run_cli(
        [*args, *QUICK, "--trainer.callbacks.init_args.finetune_epochs=0", "--trainer.callbacks.init_args.metric=null"]
    )
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, TransformCompression)]
    assert callback.metric_name is None and callback.metric_after is None
    dense = float(cli.trainer.callback_metrics["val_acc"])
    assert final_line(capsys) == (
        f"validation accuracy: {dense:.4f} of the dense model, before the layers were compressed at the end of fit "
        "(the compressed model was not scored: give TransformCompression a metric)"
    )
