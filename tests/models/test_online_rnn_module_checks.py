"""OnlineRNNModule: resumes that change the model, and validation with nothing to score, are never silent."""

import math
import warnings

import pytest
import torch

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import AddingTaskDataModule
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import TanhRNNCell
from lightning_ortho.online.losses import masked_loss_sum
from tests.models.test_online_rnn_module import TinyStreams, model, trainer


def checkpointed(tmp_path, estimator="tbptt", update_every=4):
    """A checkpoint after one epoch of 3 chunks x 5 steps with an update every 4 steps: 3 updates, 3 steps pending."""
    pl.seed_everything(0)
    first = model(estimator, update_every=update_every)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit = trainer(tmp_path / "first", max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint])
    fit.fit(first, TinyStreams(streams=3, steps=5, chunks_per_epoch=3))
    assert first.global_step == 3 and first.carry.window_steps == 3
    return first, checkpoint.last_model_path


def test_resume_with_a_smaller_update_every_closes_the_passed_window_and_keeps_updating(tmp_path):
    first, path = checkpointed(tmp_path)
    resumed = model("tbptt", update_every=2)
    data = TinyStreams(streams=3, steps=5, chunks_per_epoch=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path / "resumed", max_epochs=2).fit(resumed, data, ckpt_path=path)
    # 15 more steps: the first closes the 4-step window, the other 14 make 7 windows of 2
    assert resumed.global_step == 3 + 1 + 7
    assert resumed.carry.window_steps == 0 and resumed.carry.pending is None
    moved = max((a - b).abs().max() for a, b in zip(resumed.parameters(), first.parameters(), strict=True))
    assert moved > 1e-4
    said = [str(w.message) for w in caught if "update window" in str(w.message)]
    assert len(said) == 1 and "holds 3 steps but update_every=2: the first update after resuming applies" in said[0]
    assert "the gradient of 4 steps" in said[0]


@pytest.mark.parametrize("saved, resumed", [("rtrl", "tbptt"), ("tbptt", "uoro"), ("uoro", "rtrl")])
def test_resume_into_another_estimator_is_a_clear_error(saved, resumed, tmp_path):
    _, path = checkpointed(tmp_path, saved)
    match = (
        rf"estimator state does not fit this model's estimator \(estimator='{resumed}'\): .*belongs to a '{saved}'"
        rf" estimator.* Resume with the estimator, estimator_options and cell the checkpoint was trained with"
        rf" \(estimator='{saved}'\)"
    )
    with pytest.raises(ValueError, match=match):
        trainer(tmp_path / "resumed", max_epochs=2).fit(model(resumed), TinyStreams(streams=3), ckpt_path=path)


def test_validation_with_nothing_to_score_warns_that_val_loss_is_nan(tmp_path):
    # Chunks of 5 steps and one validation chunk: AddingTask masks the first max(t1, t2) = 9 steps of a stream.
    data = AddingTaskDataModule(streams=2, chunk_length=5, chunks_per_epoch=3, val_streams=2, val_chunks=1)
    module = OnlineRNNModule(TanhRNNCell(1, 4), 2, estimator="rtrl", update_every=5)
    fit = trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match=r"validation scored no entry.*val_loss is NaN for this pass"):
        fit.fit(module, data)
    assert math.isnan(float(fit.callback_metrics["val_loss"]))
    assert math.isfinite(float(fit.callback_metrics["train_loss"]))  # training itself scored steps 10..15


def test_validation_with_nothing_to_score_is_announced_before_early_stopping_stops_on_it(tmp_path):
    data = AddingTaskDataModule(streams=2, chunk_length=5, chunks_per_epoch=2, val_streams=2, val_chunks=1)
    module = OnlineRNNModule(TanhRNNCell(1, 4), 2, estimator="rtrl", update_every=5)
    stop = pl.callbacks.EarlyStopping(monitor="val_loss")  # check_finite: a NaN score stops training
    fit = trainer(tmp_path, max_epochs=5, callbacks=[stop])
    with pytest.warns(UserWarning, match="validation scored no entry"):
        fit.fit(module, data)
    assert fit.current_epoch == 1 and stop.stopped_epoch == 0


def test_a_callback_reads_this_passs_val_loss_in_on_validation_epoch_end(tmp_path):
    # Lightning runs the callbacks' on_validation_epoch_end before the module's: metrics logged there would be
    # missing (first pass) or stale for a user's callback.
    seen: list[float] = []

    class Reader(pl.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):  # noqa: ANN001
            if not trainer.sanity_checking:
                seen.append(float(trainer.callback_metrics["val_loss"]))

    data = AddingTaskDataModule(streams=2, chunk_length=10, chunks_per_epoch=2, val_streams=2, val_chunks=2)
    module = OnlineRNNModule(TanhRNNCell(1, 4), 2, estimator="rtrl", update_every=5)
    fit = trainer(tmp_path, max_epochs=2, callbacks=[Reader()])
    fit.fit(module, data)
    assert len(seen) == 2 and all(math.isfinite(value) for value in seen)
    assert seen[-1] == float(fit.callback_metrics["val_loss"])  # the pass's own value, not the previous one


def test_validation_with_some_entries_scored_logs_their_mean(tmp_path):
    # Two validation chunks of 5 steps: only the second one's last step (t = 9) is scored in each stream.
    data = AddingTaskDataModule(streams=2, chunk_length=5, chunks_per_epoch=1, val_streams=2, val_chunks=2)
    module = OnlineRNNModule(TanhRNNCell(1, 4), 2, estimator="rtrl")
    metrics = trainer(tmp_path).validate(module, data, verbose=False)[0]
    batches = [data.batch("val", k) for k in range(2)]
    x, y, mask = (torch.cat([b[key] for b in batches], 1) for key in ("x", "y", "mask"))
    assert int(mask.sum()) == 2 and bool(mask[:, 9].all())
    with torch.no_grad():
        outputs, _ = module(x)
        total = float(masked_loss_sum(outputs[:, 9], y[:, 9], mask[:, 9], "cross_entropy"))
    assert metrics["val_loss"] == pytest.approx(total / 2, rel=1e-5)
    assert metrics["val_bits"] == pytest.approx(total / 2 / math.log(2), rel=1e-5)
