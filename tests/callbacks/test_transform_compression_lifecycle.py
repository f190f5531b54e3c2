"""TransformCompression around the rest of a fit: checkpoints written before compression load into the compressed
model, a compression after the last checkpoint is saved too, frozen layers stay frozen, unusable layers are reported
before training or kept dense instead of failing after it."""

import warnings

import pytest
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.transforms import FactorizedLinear
from tests.callbacks.test_transform_compression import UserMLP, make_data
from tests.callbacks.test_transform_compression_checkpoints import UserMLPThatRestores
from tests.conftest import make_tiny_trainer


def outputs_of(model, inputs):
    with torch.no_grad():
        return model.eval()(inputs)


def compression(**kwargs):
    return TransformCompression(modules=["net.0", "net.2"], s=3, m=12, verbose=False, progress=False, **kwargs)


def test_a_checkpoint_saved_before_compression_loads_into_the_compressed_model(tmp_path):
    train, val = make_data()
    model, folder = UserMLP(), tmp_path / "checkpoints"
    every_epoch = pl.callbacks.ModelCheckpoint(
        dirpath=folder, filename="{epoch}", monitor="val_acc", mode="max", save_top_k=-1
    )
    trainer = make_tiny_trainer(
        tmp_path, max_epochs=3, callbacks=[compression(finetune_epochs=1), every_epoch], enable_checkpointing=True
    )
    trainer.fit(model, train, val)  # compressed at the end of epoch 1: epoch 0's checkpoint holds the dense layers
    dense_state = torch.load(folder / "epoch=0.ckpt", weights_only=True)["state_dict"]
    assert "net.0.weight" in dense_state and isinstance(model.net[0], FactorizedLinear)
    trainer.validate(model, val, ckpt_path=folder / "epoch=0.ckpt", verbose=False)  # the "best" epoch, say
    assert type(model.net[0]) is nn.Linear and type(model.net[2]) is nn.Linear
    reference = UserMLP()
    reference.load_state_dict(dense_state)
    inputs = next(iter(val))[0]
    assert torch.equal(outputs_of(model, inputs), outputs_of(reference, inputs))
    trainer.validate(model, val, ckpt_path=folder / "epoch=2.ckpt", verbose=False)  # and back to compressed
    assert isinstance(model.net[0], FactorizedLinear) and isinstance(model.net[2], FactorizedLinear)


def test_compression_after_the_last_checkpoint_is_saved_next_to_it_and_never_over_another(tmp_path):
    train, val = make_data()
    folder = tmp_path / "checkpoints"
    for name in ["compressed.ckpt", "compressed-v1.ckpt"]:
        model, callback = UserMLP(), compression()  # default: compress at the end of fit, after every checkpoint
        checkpoints = pl.callbacks.ModelCheckpoint(dirpath=folder, save_last=True)
        trainer = make_tiny_trainer(
            tmp_path, max_epochs=1, callbacks=[callback, checkpoints], enable_checkpointing=True
        )
        trainer.fit(model, train, val)
        assert (folder / name).exists()
        assert callback.compressed_checkpoint == str(folder / name)
    assert "net.0.weight" in torch.load(folder / "last.ckpt", weights_only=True)["state_dict"]  # dense: written before
    loaded = UserMLPThatRestores.load_from_checkpoint(folder / "compressed-v1.ckpt")
    assert isinstance(loaded.net[0], FactorizedLinear) and isinstance(loaded.net[2], FactorizedLinear)
    inputs = next(iter(val))[0]
    assert torch.equal(outputs_of(loaded, inputs), outputs_of(model, inputs))


def test_no_extra_checkpoint_when_one_was_saved_after_compression_or_none_is_kept(tmp_path):
    train, val = make_data()
    # compressed after epoch 0, epoch 1 fine-tuned and checkpointed: that checkpoint holds the compressed model
    callback, folder = compression(finetune_epochs=1), tmp_path / "checkpoints"
    trainer = make_tiny_trainer(
        tmp_path,
        max_epochs=2,
        callbacks=[callback, pl.callbacks.ModelCheckpoint(dirpath=folder)],
        enable_checkpointing=True,
    )
    trainer.fit(UserMLP(), train, val)
    assert callback.compressed_checkpoint is None and not list(folder.glob("compressed*"))
    callback = compression()
    make_tiny_trainer(tmp_path / "none", max_epochs=1, callbacks=[callback]).fit(UserMLP(), train, val)
    assert callback.compressed_checkpoint is None and not list((tmp_path / "none").rglob("*.ckpt"))


class Snapshot(pl.Callback):
    """The codes of ``net.0`` right after compression (placed after the callback)."""

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            self.codes = pl_module.net[0].codes.detach().clone()


def test_a_layer_the_user_froze_stays_frozen_through_fine_tuning(tmp_path):
    train, val = make_data()
    model, snapshot = UserMLP(), Snapshot()
    model.net[0].requires_grad_(False)
    make_tiny_trainer(tmp_path, max_epochs=2, callbacks=[compression(finetune_epochs=1), snapshot]).fit(
        model, train, val
    )
    frozen, trained = model.net[0], model.net[2]
    assert isinstance(frozen, FactorizedLinear) and isinstance(trained, FactorizedLinear)
    assert not frozen.codes.requires_grad and not frozen.bias.requires_grad
    assert torch.equal(frozen.codes, snapshot.codes)  # the fine-tuning epoch did not move it
    assert trained.codes.requires_grad


class WithSpareLayers(UserMLP):
    """Two layers the forward pass never uses: a zero-initialised one and one with a single input."""

    def __init__(self):
        super().__init__()
        self.spare = nn.Linear(4, 4)
        nn.init.zeros_(self.spare.weight)
        self.narrow = nn.Linear(1, 4)


class FirstBatch(pl.Callback):
    """The warnings raised before the first training batch."""

    def __init__(self, caught):
        self.caught, self.before = caught, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.before is None:
            self.before = [str(w.message) for w in self.caught]


def test_automatic_selection_reports_unsuitable_layers_before_training_and_keeps_zero_layers_dense(tmp_path):
    train, val = make_data()
    model = WithSpareLayers()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = FirstBatch(caught)
        callback = TransformCompression(s=1, m=4, verbose=False, progress=False)
        make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback, first]).fit(model, train, val)
    assert any("skipping narrow (its 1 input features" in m for m in first.before), first.before
    assert isinstance(model.net[0], FactorizedLinear) and isinstance(model.net[2], FactorizedLinear)
    assert type(model.spare) is nn.Linear and type(model.narrow) is nn.Linear
    messages = [str(w.message) for w in caught]
    assert any("not compressing spare (its weight is all zeros" in m and "stay dense" in m for m in messages)
    assert [row["module"] for row in callback.report] == ["net.0", "net.2"]


def test_named_layers_that_are_all_zero_when_compressed_stay_dense_with_a_warning(tmp_path):
    train, val = make_data()
    model = WithSpareLayers()
    callback = TransformCompression(modules=["spare"], s=1, m=4, verbose=False, progress=False)
    with pytest.warns(UserWarning, match="not compressing spare"):
        make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(model, train, val)
    assert type(model.spare) is nn.Linear and callback.done and callback.report == []


class DictBatches(UserMLP):
    """Validation batches are dicts: inputs and labels are not at (0, 1)."""

    def validation_step(self, batch, batch_idx):
        self.val_acc(self(batch["x"]), batch["y"])
        self.log("val_acc", self.val_acc)


def dict_batches():
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    return torch.utils.data.DataLoader([{"x": a, "y": b} for a, b in zip(x, y, strict=True)], batch_size=8)


def test_batches_the_metric_cannot_read_fail_before_training_and_batch_keys_reads_them(tmp_path):
    train, _ = make_data()
    model = DictBatches()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    given = compression(metric=MulticlassAccuracy(num_classes=4, average="micro"))
    trainer = make_tiny_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0, callbacks=[given])
    with pytest.raises(ValueError, match=r"a dict with keys \['x', 'y'\].*batch_keys=\(0, 1\).*pass batch_keys="):
        trainer.fit(model, train, dict_batches())
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())  # no training step ran

    callback = compression(batch_keys=("x", "y"))  # the module's own val_acc, reading the dicts
    make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(model, train, dict_batches())
    assert callback.metric_name == "val_acc" and callback.metric_after is not None
