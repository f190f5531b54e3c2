import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.nn import SVDLinear
from lightning_ortho.transforms.compression import FactorizedLinear, restore_factorized


class UserMLP(pl.LightningModule):
    """A plain user-style module: nothing from this library in it; its validation accuracy is a torchmetrics metric,
    as Lightning's docs write it (TransformCompression scores with a copy of it by default)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.val_acc = MulticlassAccuracy(num_classes=4, average="micro")

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.val_acc(self(batch[0]), batch[1])
        self.log("val_acc", self.val_acc)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def make_data():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(96, 8, generator=generator)
    labels = (x @ torch.randn(8, 4, generator=generator)).argmax(-1)  # a learnable teacher
    train = DataLoader(TensorDataset(x[:64], labels[:64]), batch_size=32)
    val = DataLoader(TensorDataset(x[64:], labels[64:]), batch_size=16)
    return train, val


def accuracy(model, loader):
    """Written independently of the callback: fraction of argmax hits over the whole loader."""
    with torch.no_grad():
        hits = sum(int((model(x).argmax(-1) == y).sum()) for x, y in loader)
    return hits / sum(len(y) for _, y in loader)


class Recorder(pl.Callback):
    """Records the accuracy and a copy of the model at a hook (placed before or after the callback under test)."""

    def __init__(self, hook, loader):
        self.loader, self.records = loader, []
        setattr(self, hook, self._record)

    def _record(self, trainer, pl_module):
        was_training = pl_module.training
        pl_module.eval()
        self.records.append((accuracy(pl_module, self.loader), copy.deepcopy(pl_module.net)))
        pl_module.train(was_training)


class CaptureLogger(pl.loggers.Logger):
    def __init__(self):
        super().__init__()
        self.logged = {}

    @property
    def name(self):
        return "capture"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.logged.update(metrics)

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def dense_error(weight, module):
    codes = torch.where(module.mask, module.codes.detach(), 0).double()
    transform = module.transform(torch.eye(module.in_features, dtype=torch.float64)).T
    return float(100 * (weight.double() - codes @ transform).square().sum() / weight.double().square().sum())


def test_compresses_the_named_layer_at_fit_end(tiny_trainer, capsys):
    train, val = make_data()
    model, logger = UserMLP(), CaptureLogger()
    recorder = Recorder("on_fit_end", val)
    callback = TransformCompression(modules=["net.2"], s=3, m=12)
    tiny_trainer(max_epochs=2, callbacks=[recorder, callback], logger=logger, log_every_n_steps=1).fit(
        model, train, val
    )

    assert isinstance(model.net[2], FactorizedLinear) and isinstance(model.net[0], nn.Linear)
    model.eval()
    before, dense_net = recorder.records[0]
    assert callback.metric_before == pytest.approx(before, abs=1e-12)
    assert callback.metric_after == pytest.approx(accuracy(model, val), abs=1e-12)
    assert logger.logged["compression/val_acc_before"] == callback.metric_before
    assert logger.logged["compression/val_acc_after"] == callback.metric_after
    (row,) = callback.report
    assert (row["module"], row["type"], row["s"], row["blocks"]) == ("net.2", "Linear", 3, 12)
    assert row["error"] == pytest.approx(dense_error(dense_net[2].weight.detach(), model.net[2]), rel=1e-5)
    assert logger.logged["compression/error/net.2"] == row["error"]
    assert logger.logged["compression/ops_before"] == 4 * 16 + 4 * 15
    assert (
        logger.logged["compression/ops_after"]
        == model.net[2].op_count().additions + model.net[2].op_count().multiplications
    )
    assert "TransformCompression" in capsys.readouterr().out  # the rich table


def test_fine_tune_after_at_epoch_trains_only_the_support(tiny_trainer):
    train, val = make_data()
    model = UserMLP()
    # after epoch 0: at the start of epoch 1, once epoch 0's validation and checkpoints are done
    before = Recorder("on_train_epoch_start", val)
    after = Recorder("on_train_epoch_start", val)
    callback = TransformCompression(modules=["net.2"], s=3, at_epoch=0, verbose=False)
    trainer = tiny_trainer(max_epochs=3, callbacks=[before, callback, after])
    trainer.fit(model, train, val)

    assert trainer.callback_metrics["compression/val_acc_before"].item() == pytest.approx(before.records[1][0])
    assert trainer.callback_metrics["compression/val_acc_after"].item() == pytest.approx(after.records[1][0])
    assert isinstance(after.records[0][1][2], nn.Linear)  # not before epoch 0 was done
    layer, compressed = model.net[2], after.records[1][1][2]
    assert isinstance(compressed, FactorizedLinear) and callback.report[0]["epoch"] == 0
    mask = layer.mask
    assert torch.equal(mask, compressed.mask) and bool((layer.codes[~mask] == 0).all())
    assert bool((layer.codes[mask] != compressed.codes[mask]).all())  # the support was fine-tuned
    assert torch.equal(layer.transform.core_index, compressed.transform.core_index)
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert id(layer.codes) in optimized and id(layer.bias) in optimized
    assert optimized == {id(p) for p in model.parameters()}


def test_resuming_after_compression_restores_the_layer_and_does_not_compress_again(tiny_trainer, tmp_path):
    train, val = make_data()
    model = UserMLP()
    first = TransformCompression(modules=["net.2"], s=3, finetune_epochs=1, verbose=False)
    trainer = tiny_trainer(max_epochs=2, callbacks=[first])
    trainer.fit(model, train, val)
    assert first.report[0]["epoch"] == 0  # max_epochs - 1 - finetune_epochs
    path = tmp_path / "compressed.ckpt"
    trainer.save_checkpoint(path)

    fresh = UserMLP()
    assert restore_factorized(fresh, torch.load(path, weights_only=False)["state_dict"]) == ["net.2"]
    second = TransformCompression(modules=["net.2"], s=3, finetune_epochs=1, verbose=False)
    second.evaluate = lambda *args: pytest.fail("the resumed callback compressed again")
    tiny_trainer(max_epochs=3, callbacks=[second]).fit(fresh, train, val, ckpt_path=path)
    assert second.done and second.report == first.report  # restored from the checkpoint, not recompressed
    assert torch.equal(fresh.net[2].mask, model.net[2].mask)
    assert not torch.equal(fresh.net[2].codes, model.net[2].codes)  # and trained on


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.svd = SVDLinear(8, 8, orthogonal="householder")
        self.aux = SVDLinear(8, 8, orthogonal="aux")
        self.attention = nn.MultiheadAttention(8, 2)
        self.head = nn.Linear(8, 4)


def test_default_selection_takes_affine_linear_layers_and_says_what_it_skips():
    model = Mixed()
    with pytest.warns(UserWarning, match=r"skipping aux \(.*not affine.*attention.out_proj \(it belongs to nn.Multi"):
        assert TransformCompression().select(model) == ["svd", "head"]
    with pytest.raises(ValueError, match="cannot compress 'aux'"):
        TransformCompression(modules=["aux"]).select(model)
    with pytest.raises(
        ValueError,
        match=r"no submodule 'heads'. Its Linear and convolution modules are: \['svd', 'aux', 'attention.out_proj', 'head'\]",
    ):
        TransformCompression(modules=["heads"]).select(model)
    with pytest.raises(ValueError, match="s=9 exceeds its 8 input features"):
        TransformCompression(modules=["head"], s=9).select(model)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modules": "head"}, "non-empty list of submodule names"),
        ({"modules": []}, "non-empty list of submodule names"),
        ({"modules": ["head", "head"]}, "lists a name twice"),
        ({"family": "fft"}, "family must be one of"),
        ({"s": 0}, "s must be None or an int >= 1"),
        ({"at_epoch": -1}, "at_epoch must be None or an int >= 0"),
        ({"at_epoch": 1, "finetune_epochs": 2}, "not both"),
        ({"finetune_epochs": -1}, "finetune_epochs must be an int >= 0"),
        ({"family": "m", "m": 4}, "takes q"),
        ({"q": 2}, "takes m"),
        ({"bits": 2}, "family 'shear' only"),
        ({"family": "b4x4", "bits": 2}, "family 'shear' only"),
        ({"family": "b4x4", "q": 2}, "takes m"),
        ({"metric": 3}, "metric must be a torchmetrics.Metric"),
        ({"metric": lambda module, batch: (1, 1)}, "metric must be a torchmetrics.Metric"),
        ({"metric": "accuracy"}, "metric must be a torchmetrics.Metric"),
        ({"metric_name": ""}, "metric_name must be a non-empty string"),
        ({"batch_keys": "xy"}, "batch_keys must be"),
        ({"batch_keys": (0, 1, 2)}, "batch_keys must be"),
    ],
)
def test_bad_arguments_are_refused_in_init(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformCompression(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modules": ["net.5"]}, r"no submodule 'net.5'. Its Linear and convolution modules are: \['net.0', 'net.2'\]"),
        ({"at_epoch": 2}, "at_epoch=2 is never reached with max_epochs=2"),
        ({"finetune_epochs": 2}, "finetune_epochs=2 needs Trainer"),
    ],
)
def test_bad_configuration_fails_before_training(tiny_trainer, kwargs, match):
    train, val = make_data()
    model = UserMLP()
    start = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=match):
        tiny_trainer(max_epochs=2, callbacks=[TransformCompression(**kwargs)]).fit(model, train, val)
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())  # no training step ran


@pytest.mark.parametrize(
    ("progress", "rich_bar", "expected"),
    [(None, False, None), (None, True, False), (True, True, True), (False, False, False)],
)
def test_progress_of_compress_linear_stays_off_under_lightnings_rich_bar(
    tiny_trainer, monkeypatch, progress, rich_bar, expected
):
    from lightning_ortho.callbacks.compression import transform_compression

    seen, original = [], transform_compression.compress_linear

    def recording(*args, **kwargs):
        seen.append(kwargs["progress"])
        return original(*args, **kwargs)

    monkeypatch.setattr(transform_compression, "compress_linear", recording)
    train, val = make_data()
    bar = (
        {"enable_progress_bar": True, "callbacks": [pl.callbacks.RichProgressBar()]} if rich_bar else {"callbacks": []}
    )
    callback = TransformCompression(modules=["net.2"], s=3, m=4, iterations=1, verbose=False, progress=progress)
    bar["callbacks"].append(callback)
    tiny_trainer(max_epochs=1, limit_train_batches=1, **bar).fit(UserMLP(), train, val)
    assert seen == [expected]
