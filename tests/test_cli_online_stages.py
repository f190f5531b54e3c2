"""`lightning-ortho test` and `predict` on the online recipes: the cell run forward over held-out streams."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_ortho.callbacks import PredictionWriter
from lightning_ortho.cli import run_cli
from lightning_ortho.datamodules import AddingTaskDataModule, CharacterStreamDataModule, CopyTaskDataModule

ROOT = Path(__file__).resolve().parents[1]
ONLINE = sorted((ROOT / "recipes").glob("online_*.yaml"))


def run(subcommand: str, recipe: Path, root: Path, batches: int = 2):
    args = [subcommand, "--config", str(recipe), f"--trainer.default_root_dir={root}", "--trainer.logger=false"]
    return run_cli([*args, f"--trainer.limit_{subcommand}_batches={batches}", "--trainer.enable_progress_bar=false"])


@pytest.mark.parametrize("recipe", ONLINE, ids=[r.stem for r in ONLINE])
def test_test_and_predict_run_on_every_online_recipe(recipe, tmp_path):
    tested = run("test", recipe, tmp_path / "test")
    loss = float(tested.trainer.callback_metrics["test_loss"])
    assert math.isfinite(loss)
    predicted = run("predict", recipe, tmp_path / "predict")
    record = torch.load(tmp_path / "predict" / "predictions.pt")
    data, model = predicted.datamodule, predicted.model
    assert record["outputs"].shape == (data.val_streams, 2 * data.chunk_length, model.output_size)
    assert record["mask"].shape == record["outputs"].shape[:2]
    # the same chunks of the same streams from the same weights (seed 0): predict's summary is test's loss
    writer = next(c for c in predicted.trainer.callbacks if isinstance(c, PredictionWriter))
    assert f"loss {loss:.4f}" in writer.summary


def test_test_loss_is_the_masked_cross_entropy_of_the_cell_run_forward(tmp_path):
    cli = run("test", ROOT / "recipes" / "online_copy.yaml", tmp_path)
    data, model = cli.datamodule, cli.model
    chunks = [data.batch("test", k) for k in range(2)]
    x, y = torch.cat([c["x"] for c in chunks], 1), torch.cat([c["y"] for c in chunks], 1)
    mask = torch.cat([c["mask"] for c in chunks], 1)
    h, logits, T = torch.zeros(len(x), model.cell.hidden_size), [], data.chunk_length
    with torch.no_grad():  # reference: the recurrence written out from a zero state, zeroed where a chunk resets
        for t in range(x.shape[1]):
            if t % T == 0:
                h = torch.where(chunks[t // T]["reset"][:, None], 0.0, h)
            h = model.cell(x[:, t], h)
            logits.append(model.readout.linear(h))
    expected = F.cross_entropy(torch.stack(logits, 1)[mask], y[mask])
    torch.testing.assert_close(cli.trainer.callback_metrics["test_loss"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cli.trainer.callback_metrics["test_bits"], expected / math.log(2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("module", [AddingTaskDataModule, CopyTaskDataModule])
def test_generated_tasks_test_on_streams_of_their_own(module):
    data = module(streams=4, val_streams=4)
    test, val, train = (data.batch(split, 1)["x"] for split in ("test", "val", "train"))
    assert not torch.equal(test, val) and not torch.equal(test, train)
    assert torch.equal(next(iter(data.test_dataloader()))["x"], data.batch("test", 0)["x"])
    assert torch.equal(next(iter(data.predict_dataloader()))["x"], data.batch("test", 0)["x"])


def test_the_text_module_tests_on_its_held_out_text():
    data = CharacterStreamDataModule(streams=4, val_streams=2, chunk_length=8)
    assert torch.equal(data.batch("test", 3)["y"], data.batch("val", 3)["y"])
