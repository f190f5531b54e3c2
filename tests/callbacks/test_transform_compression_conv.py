"""TransformCompression on a user's CNN: convolutions are compressed by default where they qualify, with op counts
per image of the size the validation batches give, and a checkpoint of the compressed model loads into a freshly
built one."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.transforms import FactorizedConv, FactorizedLinear
from lightning_ortho.transforms.factorized_linear import restore_factorized


class UserCNN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),  # one input channel: stays dense
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8),  # depthwise: stays dense
            nn.Conv2d(8, 12, 3, stride=2),
            nn.ReLU(),
        )
        self.head = nn.Linear(12 * 3 * 3, 4)
        self.val_acc = MulticlassAccuracy(num_classes=4, average="micro")

    def forward(self, x):
        return self.head(self.features(x).flatten(1))

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.val_acc(self(batch[0]), batch[1])
        self.log("val_acc", self.val_acc)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 8, 8, generator=generator)
    y = (x.flatten(1) @ torch.randn(64, 4, generator=generator)).argmax(-1)
    return DataLoader(TensorDataset(x[:48], y[:48]), batch_size=16), DataLoader(TensorDataset(x[48:], y[48:]), 16)


def test_a_cnn_gets_its_qualifying_convolutions_compressed_and_reloads(tmp_path):
    torch.manual_seed(1)
    model, (train, val) = UserCNN(), _data()
    callback = TransformCompression(s=2, verbose=False)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train, val)
    skipped = " ".join(str(w.message) for w in caught if "skipping" in str(w.message))
    assert "features.0 (it has 1 input channel" in skipped and "features.2 (it has groups=8 (depthwise)" in skipped
    assert isinstance(model.features[3], FactorizedConv) and isinstance(model.head, FactorizedLinear)
    assert isinstance(model.features[0], nn.Conv2d) and isinstance(model.features[2], nn.Conv2d)
    rows = {row["module"]: row for row in callback.report}
    assert rows["features.3"]["type"] == "Conv2d" and rows["features.3"]["input_size"] == (8, 8)
    # per image of 8 x 8: a 3 x 3 output of 12 channels over 8 * 9 inputs each
    assert rows["features.3"]["dense_ops_multiplications"] == 9 * 12 * 8 * 9
    # the checkpoint of the compressed model loads into a freshly built one
    path = tmp_path / "compressed.pt"
    torch.save(model.state_dict(), path)
    fresh = UserCNN()
    state = torch.load(path)
    restore_factorized(fresh, state)
    fresh.load_state_dict(state)
    x = next(iter(val))[0]
    model.eval(), fresh.eval()
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def test_naming_a_depthwise_convolution_says_why_it_cannot_be_compressed():
    with pytest.raises(ValueError, match=r"cannot compress 'features.2': it has groups=8 \(depthwise\)"):
        TransformCompression(modules=["features.2"]).select(UserCNN())


def test_a_budget_keeps_the_drop_and_the_metric_after_fine_tuning_is_measured(tmp_path):
    torch.manual_seed(2)
    model, (train, val) = UserCNN(), _data()
    callback = TransformCompression(max_accuracy_drop=5.0, finetune_epochs=1, verbose=False)
    trainer = pl.Trainer(
        max_epochs=4,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train, val)
    assert callback.layer_budget is not None
    assert 100 * (callback.metric_before - callback.metric_after) <= 5.0
    compressed = {row["module"] for row in callback.report}
    assert compressed and compressed <= {"features.3", "head"}
    # measured at the end of fit, after the fine-tuning epoch, by hand too
    model.eval()
    with torch.no_grad():
        hits = sum(int((model(x).argmax(-1) == y).sum()) for x, y in val)
    assert callback.metric_finetuned == pytest.approx(hits / 16)
    assert trainer.callback_metrics["compression/val_acc_finetuned"] == pytest.approx(hits / 16)


def test_a_budget_and_s_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        TransformCompression(s=2, max_accuracy_drop=1.0)
    with pytest.raises(ValueError, match="not both"):
        TransformCompression(max_accuracy_drop=1.0, max_output_error=2.0)
