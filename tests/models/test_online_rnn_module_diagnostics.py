"""OnlineRNNModule: warnings that fire when (and where) something is wrong, and errors that name the real cause."""

import math
import warnings

import pytest
import torch
from lightning_utilities.core.rank_zero import rank_zero_only

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import AddingTaskDataModule
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import TanhRNNCell
from tests.models.test_online_rnn_module import TinyStreams, model, trainer

NOTHING_SCORED = "validation scored no entry"


def _fit_recording(fit, module, data, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit.fit(module, data, **kwargs)
    return [str(w.message) for w in caught]


def test_the_sanity_check_does_not_warn_when_its_chunks_lie_in_the_warm_up(tmp_path):
    # Chunks of one step: the sanity check's 2 validation chunks lie in AddingTask's warm-up of max(t1, t2) >= 9
    # steps, but the full pass of 16 chunks scores steps 9..15; the default Trainer runs the sanity check.
    data = AddingTaskDataModule(streams=2, chunk_length=1, chunks_per_epoch=2, val_streams=2, val_chunks=16)
    module = OnlineRNNModule(TanhRNNCell(1, 4), 2, estimator="rtrl")
    fit = trainer(tmp_path, max_epochs=1, num_sanity_val_steps=2)
    said = _fit_recording(fit, module, data)
    assert not any(NOTHING_SCORED in s for s in said)
    assert not any(bool(data.batch("val", k)["mask"].any()) for k in range(2))  # the sanity check scored nothing
    assert math.isfinite(float(fit.callback_metrics["val_loss"]))


class _ValidateAsRank(pl.Callback):
    """Make the process look like rank ``rank`` of a distributed run while it validates (``rank_zero_only.rank``)."""

    def __init__(self, rank):
        self.rank, self.saved = rank, None

    def on_validation_epoch_start(self, trainer, pl_module):
        self.saved, rank_zero_only.rank = rank_zero_only.rank, self.rank

    def on_validation_end(self, trainer, pl_module):
        rank_zero_only.rank = self.saved


@pytest.mark.parametrize("rank, expected", [(0, 1), (1, 0)])
def test_nothing_scored_is_warned_once_per_pass_by_rank_zero_only(rank, expected, tmp_path):
    # Every process computes the same count over all processes; only rank zero says so (not once per process).
    data = AddingTaskDataModule(streams=2, chunk_length=5, chunks_per_epoch=1, val_streams=2, val_chunks=1)
    module = OnlineRNNModule(TanhRNNCell(1, 4), 2, estimator="rtrl", update_every=5)
    fit = trainer(tmp_path, max_epochs=1, callbacks=[_ValidateAsRank(rank)])
    said = _fit_recording(fit, module, data)
    assert sum(NOTHING_SCORED in s for s in said) == expected
    assert math.isnan(float(fit.callback_metrics["val_loss"]))  # announced by rank zero's warning


def _fit_mse(tmp_path, module, **data_kwargs):
    data = TinyStreams(streams=3, steps=5, chunks_per_epoch=3, loss="mse", **data_kwargs)
    trainer(tmp_path, max_epochs=3, limit_val_batches=0).fit(module, data)


def test_a_diverging_readout_is_named_instead_of_blaming_the_data(tmp_path):
    # SGD with lr=1e4 on MSE: the readout's weights grow until 0.5 ||o - y||^2 overflows float32.
    pl.seed_everything(0)
    module = model("rtrl", optimizer="sgd", lr=1e4, loss="mse")
    with pytest.raises(FloatingPointError, match=r"dL/dh .* holds NaN/inf at update \d+: .*readout\.linear") as info:
        _fit_mse(tmp_path, module)
    assert "lower the learning rate (lr=10000)" in str(info.value) and "check the data" not in str(info.value)


def test_finite_parameters_whose_loss_overflows_are_named_with_their_size(tmp_path):
    module = model("tbptt", optimizer="sgd", lr=1e-3, loss="mse")
    with torch.no_grad():
        module.readout.linear.weight.fill_(1e20)  # |o| ~ 1e20: 0.5 |o - y|^2 passes float32's 3.4e38
    match = (
        r"every parameter is finite, but the readout's outputs reach .* and the loss or its gradient overflowed"
        r" torch.float32: the largest parameters are readout\.linear\.weight \(max \|entry\| 1e\+20\)"
    )
    with pytest.raises(FloatingPointError, match=match):
        _fit_mse(tmp_path, module)


@pytest.mark.parametrize("estimator", ["rtrl", "tbptt", "uoro"])
def test_nan_readout_parameters_are_named(estimator, tmp_path):
    module = model(estimator, loss="mse")
    with torch.no_grad():
        module.readout.linear.bias[1] = float("nan")
    with pytest.raises(FloatingPointError, match=r"the parameters \['readout\.linear\.bias'\] hold NaN/inf"):
        _fit_mse(tmp_path, module)


def test_nan_targets_at_scored_entries_are_named(tmp_path):
    class NanTargets(TinyStreams):
        def chunk(self, split, k, streams=None):
            batch = super().chunk(split, k, streams)
            batch["y"][0, 2, 1] = float("nan")
            batch["mask"][0, 2] = True
            return batch

    module = model("rtrl", loss="mse")
    data = NanTargets(streams=3, steps=5, chunks_per_epoch=1, loss="mse")
    with pytest.raises(ValueError, match=r"batch\['y'\] holds NaN/inf at scored \(masked\) entries"):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, data)


class _Ignored(TinyStreams):
    """TinyStreams whose stream 0 and entry (1, 2) are not scored: class -100 (``ignore``) or a false mask."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def chunk(self, split, k, streams=None):
        batch = super().chunk(split, k, streams)
        rows, cols = [0] * self.steps + [1], list(range(self.steps)) + [2]
        if self.how == "ignore":
            batch["y"][rows, cols] = -100
            batch["mask"][rows, cols] = True
        else:
            batch["mask"][rows, cols] = False
        return batch


def test_class_minus_100_is_ignored_like_a_false_mask(tmp_path):
    # The conventional PyTorch "ignore" label: out of the loss, its gradient and the count of the mean.
    results = {}
    for how in ("ignore", "mask"):
        pl.seed_everything(0)
        module = model("rtrl", lr=0.05)
        fit = trainer(tmp_path / how, max_epochs=1, limit_val_batches=2)
        fit.fit(module, _Ignored(how, streams=3, steps=5, chunks_per_epoch=2, val_streams=3))
        results[how] = (module, {key: float(fit.callback_metrics[key]) for key in ("train_loss", "val_loss")})
    (ignored, metrics), (masked, reference) = results["ignore"], results["mask"]
    assert metrics == pytest.approx(reference, rel=1e-6)
    for a, b in zip(ignored.parameters(), masked.parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shift, shown", [(10, r"\[10, 11, 12, 13\]"), (-5, r"\[-5, -4, -3, -2\]")])
def test_scored_classes_out_of_range_are_a_clear_error(shift, shown, tmp_path):
    class Shifted(TinyStreams):
        def chunk(self, split, k, streams=None):
            batch = super().chunk(split, k, streams)
            return {**batch, "y": torch.arange(4).repeat(3, 2)[:, :5] + shift}

    match = rf"batch\['y'\] holds the class indices {shown} at scored .* output_size=4 classes \(0 \.\. 3\)"
    with pytest.raises(ValueError, match=match):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(model("rtrl"), Shifted(streams=3, steps=5))


def test_out_of_range_classes_where_the_mask_is_false_are_padding(tmp_path):
    class Padded(TinyStreams):
        def chunk(self, split, k, streams=None):
            batch = super().chunk(split, k, streams)
            batch["y"][:, -1], batch["mask"][:, -1] = 99, False
            return batch

    module = model("rtrl")
    trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, Padded(streams=3, steps=5, chunks_per_epoch=1))
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_a_batch_without_streams_says_so(tmp_path):
    class Empty(TinyStreams):
        def chunk(self, split, k, streams=None):
            batch = super().chunk(split, k, streams)
            return {key: (v[:0] if key != "chunk" else v) for key, v in batch.items()}

    with pytest.raises(ValueError, match=r"the batch has no streams: batch\['x'\] is \(0, 5, 3\)"):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(model("rtrl"), Empty(streams=3))


@pytest.mark.parametrize("k, window", [(3, None), (5, "fills up"), (2, "keeps 2")])
def test_resuming_with_another_truncation_k_warns_once(k, window, tmp_path):
    from tests.models.test_online_rnn_module_checks import checkpointed

    _, path = checkpointed(tmp_path, "tbptt")  # k=3, after 15 steps
    resumed = model("tbptt", update_every=4, estimator_options={"k": k})
    data = TinyStreams(streams=3, steps=5, chunks_per_epoch=3)
    said = _fit_recording(trainer(tmp_path / "resumed", max_epochs=2), resumed, data, ckpt_path=path)
    options = [s for s in said if "the checkpoint was trained with" in s]
    windows = [s for s in said if "saved window" in s]
    if window is None:
        assert options == [] and windows == []
    else:
        assert len(options) == 1 and len(windows) == 1 and window in windows[0]
        assert f"estimator_options={{'k': 3}}, this model has estimator_options={{'k': {k}}}" in options[0]
    assert resumed.carry.state.tensors["inputs"].shape[1] == k  # the window is k's after the resumed steps
