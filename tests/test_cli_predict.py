"""`lightning-ortho predict` writes predictions.pt for every recipe family, with a summary against the labels."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_ortho.callbacks import PredictionWriter, prediction_writer
from lightning_ortho.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]


def predict(recipe: str, root: Path, *overrides: str, batches: int = 2):
    """``lightning-ortho predict --config recipes/RECIPE.yaml`` in process, no logger: the run directory is ``root``."""
    args = ["predict", "--config", str(ROOT / "recipes" / f"{recipe}.yaml"), f"--trainer.default_root_dir={root}"]
    return run_cli([*args, "--trainer.logger=false", f"--trainer.limit_predict_batches={batches}", *overrides])


def writers(cli) -> list:
    return [c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter)]


def test_the_writer_is_a_callback_of_both_packages_and_lightnings_prediction_writer():
    from lightning_ortho._lightning import Callback, pl

    writer = PredictionWriter()
    assert isinstance(writer, Callback) and isinstance(writer, pl.callbacks.BasePredictionWriter)


@pytest.mark.parametrize("recipe", ["fcnn_digits", "rnn_digits"])
def test_classifiers_write_logits_predicted_classes_and_targets_with_their_accuracy(recipe, tmp_path, monkeypatch):
    logged = []
    monkeypatch.setattr(prediction_writer, "rank_zero_info", logged.append)
    cli = predict(recipe, tmp_path)
    record = torch.load(tmp_path / "predictions.pt")
    assert set(record) == {"logits", "predicted", "targets"}
    # independent reference: the model on the first two test batches, in order, and their labels
    loader = iter(cli.datamodule.test_dataloader())
    batches = [next(loader), next(loader)]
    with torch.no_grad():
        logits = torch.cat([cli.model(x) for x, _ in batches])
    labels = torch.cat([y for _, y in batches])
    torch.testing.assert_close(record["logits"], logits)
    assert torch.equal(record["predicted"], logits.argmax(1)) and torch.equal(record["targets"], labels)
    correct = int((logits.argmax(1) == labels).sum())
    expected = f"accuracy {correct / len(labels):.4f} ({correct} of {len(labels)} labelled samples)"
    assert writers(cli)[0].summary == f"{tmp_path / 'predictions.pt'}: {expected}"
    assert logged == [f"PredictionWriter: wrote {tmp_path / 'predictions.pt'}: {expected}"]  # the path, printed


def test_glow_writes_bits_per_dim_of_each_image(tmp_path):
    cli = predict("glow_digits", tmp_path, batches=1)
    record = torch.load(tmp_path / "predictions.pt")
    images, labels = next(iter(cli.datamodule.test_dataloader()))
    assert record["bits_per_dim"].shape == (len(images),) and torch.isfinite(record["bits_per_dim"]).all()
    assert torch.equal(record["labels"], labels)
    # the dequantisation noise differs between draws, the per-image figure barely: a fresh draw of the model
    with torch.no_grad():
        again = cli.model.eval().glow.bits_per_dim(images, cli.model.hparams.num_levels)
    torch.testing.assert_close(record["bits_per_dim"], again, atol=0.05, rtol=0)
    mean = float(record["bits_per_dim"].double().mean())
    assert writers(cli)[0].summary.endswith(f"mean bits/dim {mean:.4f} over {len(images)} images")


def test_the_fast_transform_writes_codes_and_reconstruction_errors(tmp_path):
    # Before any update the transform is the identity: codes are T_s(Y), the s largest entries of each patch, so the
    # error of a row is the sum of squares of its n - s smallest-magnitude entries (reference from the patches).
    cli = predict("transform_patches", tmp_path, batches=1)
    record = torch.load(tmp_path / "predictions.pt")
    patches = next(iter(cli.datamodule.test_dataloader()))[0].flatten(1).double()
    s = cli.model.hparams.s
    smallest = patches.abs().sort(1).values[:, : patches.shape[1] - s]
    assert record["codes"].shape == patches.shape
    assert ((record["codes"] != 0).sum(1) <= s).all()
    torch.testing.assert_close(record["squared_error"], smallest.square().sum(1))
    torch.testing.assert_close(record["squared_norm"], patches.square().sum(1))
    error = 100 * float(smallest.square().sum() / patches.square().sum())
    assert f"error {error:.2f} %" in writers(cli)[0].summary


def test_online_predictions_are_the_per_step_outputs_on_the_held_out_streams(tmp_path):
    cli = predict("online_adding", tmp_path)
    record = torch.load(tmp_path / "predictions.pt")
    data = cli.datamodule
    chunks = [data.batch("test", k) for k in range(2)]
    x = torch.cat([c["x"] for c in chunks], 1)
    # reference: the cell and readout written out, one step after another from a zero state
    h, outputs = torch.zeros(len(x), cli.model.cell.hidden_size), []
    with torch.no_grad():
        for t in range(x.shape[1]):
            h = cli.model.cell(x[:, t], h)
            outputs.append(cli.model.readout.linear(h))
    torch.testing.assert_close(record["outputs"], torch.stack(outputs, 1))
    assert torch.equal(record["targets"], torch.cat([c["y"] for c in chunks], 1))
    mask = torch.cat([c["mask"] for c in chunks], 1)
    assert torch.equal(record["mask"], mask)
    target = record["targets"][mask]
    loss = float(-(target * F.log_softmax(record["outputs"][mask].double(), -1)).sum(-1).mean())
    assert f"loss {loss:.4f}" in writers(cli)[0].summary


def test_the_cli_adds_no_second_writer_to_one_given_by_short_name(tmp_path):
    out = tmp_path / "elsewhere"
    cli = predict(
        "fcnn_digits", tmp_path, "--trainer.callbacks+=PredictionWriter", f"--trainer.callbacks.dirpath={out}"
    )
    assert len(writers(cli)) == 1 and (out / "predictions.pt").is_file()
    assert not (tmp_path / "predictions.pt").exists()


def test_a_writer_refuses_a_path_as_file_name():
    with pytest.raises(ValueError, match="file name ending in .pt"):
        PredictionWriter(filename="out/predictions.npy")


def test_the_fast_transform_tests_its_error_on_the_held_out_patches(tmp_path):
    tested = run_cli(
        [
            "test",
            "--config",
            str(ROOT / "recipes" / "transform_patches.yaml"),
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.limit_test_batches=1",
        ]
    )
    patches = next(iter(tested.datamodule.test_dataloader()))[0].flatten(1).double()
    smallest = patches.abs().sort(1).values[:, : patches.shape[1] - tested.model.hparams.s]  # D = I: T_s(Y)
    error = 100 * smallest.square().sum() / patches.square().sum()
    torch.testing.assert_close(tested.trainer.callback_metrics["test_error"], error.float())


@pytest.mark.ddp
def test_under_ddp_each_process_writes_its_rows_with_their_dataset_index(tmp_path):
    from lightning_ortho.datamodules import DigitsDataModule
    from lightning_ortho.models import OrthogonalClassifier
    from tests.conftest import make_tiny_trainer

    model, data = OrthogonalClassifier(depth=1), DigitsDataModule(batch_size=32)
    writer = PredictionWriter(dirpath=str(tmp_path / "out"))
    trainer = make_tiny_trainer(tmp_path, strategy="ddp_spawn", devices=2, callbacks=[writer])
    trainer.predict(model, datamodule=data, return_predictions=False)
    parts = [torch.load(tmp_path / "out" / f"predictions-rank{r}.pt") for r in range(2)]
    index = torch.cat([p["index"] for p in parts])
    test_set = data.split("test")
    assert sorted(index.tolist()) == list(range(len(test_set)))  # every test sample once, none padded in
    inputs, labels = test_set[:]
    with torch.no_grad():
        reference = model(inputs)
    for part in parts:
        torch.testing.assert_close(part["logits"], reference[part["index"]])
        assert torch.equal(part["targets"], labels[part["index"]])
