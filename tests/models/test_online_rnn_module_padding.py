"""OnlineRNNModule: float targets where the mask is false are padding and may hold anything (NaN, inf): training
and validation go exactly as with zeros there."""

import math

import pytest
import torch

from lightning_ortho._lightning import pl
from tests.models.test_online_rnn_module import TinyStreams, model, trainer


class _Padded(TinyStreams):
    """TinyStreams whose float targets hold ``padding`` wherever the mask is false (training and validation)."""

    def __init__(self, padding, **kwargs):
        super().__init__(**kwargs)
        self.padding = padding

    def chunk(self, split, k, streams=None):
        batch = super().chunk(split, k, streams)
        y = batch["y"].clone()
        y[~batch["mask"]] = self.padding
        return {**batch, "y": y}


def _fit(root, padding, loss, soft):
    pl.seed_everything(0)
    module = model("tbptt", loss=loss, lr=0.05)
    data = _Padded(padding, streams=3, steps=5, chunks_per_epoch=2, val_streams=3, loss=loss, soft=soft)
    fit = trainer(root, max_epochs=2, limit_val_batches=2)
    fit.fit(module, data)
    return module, {key: float(fit.callback_metrics[key]) for key in ("train_loss", "val_loss")}


@pytest.mark.parametrize("loss, soft", [("mse", False), ("cross_entropy", True)], ids=["mse", "soft-ce"])
@pytest.mark.parametrize("padding", [math.nan, math.inf], ids=["nan", "inf"])
def test_nan_or_inf_padding_trains_and_validates_exactly_as_zero_padding(padding, loss, soft, tmp_path):
    module, metrics = _fit(tmp_path / "padded", padding, loss, soft)
    reference, expected = _fit(tmp_path / "zeros", 0.0, loss, soft)
    assert all(math.isfinite(v) for v in metrics.values()) and metrics == expected
    for (name, a), b in zip(module.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b), name
