"""TransformCompression's metric: a torchmetrics Metric chosen and tried before training, so a model it cannot score
(a GRU regressor) fails at the start of fit or is reported by its compression error only, never after the run; its
figures are those of the model before and after compression, also across processes."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError
from torchmetrics.classification import MulticlassAccuracy

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.transforms import FactorizedLinear
from tests.callbacks.test_transform_compression import UserMLP, accuracy, make_data
from tests.conftest import free_port, make_tiny_trainer


class GRURegressor(pl.LightningModule):
    """A user's sequence regressor: (N, T, 3) -> (N,), mean squared error; no metric object, no classes."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.gru(x)[0][:, -1]).squeeze(-1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def sequences():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(48, 5, 3, generator=generator)
    y = x.sum(dim=(1, 2))
    return DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16), DataLoader(TensorDataset(x[32:], y[32:]), 8)


def mse(model, loader):
    """Independent of torchmetrics: the mean of squared errors over every row of the loader."""
    with torch.no_grad():
        errors = torch.cat([(model(x) - y).square() for x, y in loader])
    return float(errors.mean())


class Before(pl.Callback):
    """Placed before the callback under test: a copy of the model as it is when fit ends, before compression."""

    def on_fit_end(self, trainer, pl_module):
        self.model = copy.deepcopy(pl_module).eval()


def compression(**kwargs):
    # m = 2 blocks and s = 2: cheaper than the one-output head's 8 + 7 operations (a dearer one would stay dense)
    return TransformCompression(modules=["head"], s=2, m=2, verbose=False, progress=False, **kwargs)


def test_a_regressor_without_a_metric_is_compressed_and_reported_by_its_error(tmp_path, capsys):
    train, val = sequences()
    model, callback = GRURegressor(), TransformCompression(modules=["head"], s=2, m=2, progress=False)
    trainer = make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback])
    trainer.fit(model, train, val)
    assert isinstance(model.head, FactorizedLinear) and callback.metric_name is None
    assert callback.metric_before is None and callback.metric_after is None
    assert trainer.callback_metrics["compression/error/head"] == pytest.approx(callback.report[0]["error"])
    assert not [key for key in trainer.callback_metrics if key.startswith("compression/val")]
    assert "no metric" in capsys.readouterr().out  # the table says what it reports


@pytest.fixture(params=[False, True], ids=["default", "deterministic"])
def deterministic(request):
    # torchmetrics counts classes without bincount under deterministic algorithms, which takes float labels
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(request.param)
    yield
    torch.use_deterministic_algorithms(before)


def test_a_metric_that_cannot_score_the_model_fails_before_training(tmp_path, deterministic):
    train, val = sequences()
    model = GRURegressor()
    start = copy.deepcopy(model.state_dict())
    callback = compression(metric=MulticlassAccuracy(num_classes=4))
    trainer = make_tiny_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0, callbacks=[callback])
    with pytest.raises(ValueError, match=r"'val_acc' \(MulticlassAccuracy\) cannot score this model.*\(8,\).*Pass"):
        trainer.fit(model, train, val)
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())  # no training step ran
    assert trainer.global_step == 0


def test_a_given_metric_scores_the_model_before_and_after_compression(tmp_path):
    train, val = sequences()
    model, before, given = GRURegressor(), Before(), MeanSquaredError()
    callback = compression(metric=given)
    trainer = make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[before, callback])
    trainer.fit(model, train, val)
    model.eval()
    assert callback.metric_name == "val_mean_squared_error"
    assert callback.metric_before == pytest.approx(mse(before.model, val), rel=1e-5)
    assert callback.metric_after == pytest.approx(mse(model, val), rel=1e-5)  # the compressed model's
    assert abs(callback.metric_after - callback.metric_before) > 1e-3  # a figure of the wrong model shows
    assert trainer.callback_metrics["compression/val_mean_squared_error_after"] == pytest.approx(callback.metric_after)
    assert given.update_count == 0  # the user's instance is copied, not filled


class DeclaresClasses(UserMLP):
    """No metric object, but the number of classes as a hyperparameter."""

    def __init__(self):
        super().__init__()
        del self.val_acc
        self.save_hyperparameters({"num_classes": 4})

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.cross_entropy(self(batch[0]), batch[1]))


def test_auto_takes_the_modules_metric_or_its_num_classes(tmp_path):
    train, val = make_data()
    for model in (UserMLP(), DeclaresClasses()):
        before, callback = Before(), TransformCompression(modules=["net.2"], s=1, m=2, verbose=False)
        make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[before, callback]).fit(model, train, val)
        model.eval()
        assert callback.metric_name == "val_acc", type(model)
        assert callback.metric_before == pytest.approx(accuracy(before.model, val), abs=1e-12)
        assert callback.metric_after == pytest.approx(accuracy(model, val), abs=1e-12)


def test_a_given_metric_needs_validation_data_and_one_number(tmp_path):
    train, val = make_data()
    callback = compression(metric=MulticlassAccuracy(num_classes=4))
    callback.modules = ["net.2"]
    with pytest.raises(ValueError, match="needs validation data.*metric=None"):
        make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(UserMLP(), train)
    callback.metric = MulticlassAccuracy(num_classes=4, average=None)
    with pytest.raises(ValueError, match=r"computes \(4,\), not one number"):
        make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(UserMLP(), train, val)
    automatic = TransformCompression(modules=["net.2"], s=1, m=2, verbose=False, progress=False)
    make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[automatic]).fit(UserMLP(), train)  # no data: no metric
    assert automatic.done and automatic.metric_name is None and automatic.metric_after is None


class SavesFigures(pl.Callback):
    """After the callback under test: each process writes the compression's figures and the full-data accuracy
    of the model it holds (ddp_spawn runs the callbacks in other processes)."""

    def __init__(self, folder, val):
        self.folder, self.val = folder, val

    def on_fit_end(self, trainer, pl_module):
        compression = next(c for c in trainer.callbacks if isinstance(c, TransformCompression))
        x, y = self.val.dataset.tensors
        shard = DataLoader(TensorDataset(x[trainer.global_rank :: 2], y[trainer.global_rank :: 2]), batch_size=8)
        model = pl_module.eval()
        figures = (
            compression.metric_before,
            compression.metric_after,
            accuracy(model, self.val),
            accuracy(model, shard),
        )
        torch.save(figures, self.folder / f"rank{trainer.global_rank}.pt")


@pytest.mark.ddp
def test_under_ddp_the_figures_are_those_of_the_whole_validation_set(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    train, val = make_data()  # 32 validation rows: 16 per process (DistributedSampler, no padding)
    callback = TransformCompression(modules=["net.2"], s=1, m=2, verbose=False, progress=False)
    trainer = make_tiny_trainer(
        tmp_path, max_epochs=1, strategy="ddp_spawn", devices=2, callbacks=[callback, SavesFigures(tmp_path, val)]
    )
    trainer.fit(UserMLP(), train, val)
    figures = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    for before, after, full, _ in figures:
        assert after == pytest.approx(full, abs=1e-12) and before is not None
    assert figures[0][:2] == figures[1][:2]
    assert any(shard != pytest.approx(full) for _, _, full, shard in figures)  # an unreduced figure would show


def test_the_clis_closing_line_and_the_table_give_the_compressed_models_accuracy(tmp_path, capsys):
    from lightning_ortho.cli import run_cli
    from tests.test_cli_compression import QUICK, RECIPE

    args = ["fit", "--config", str(RECIPE), "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}"]
    quick = [a for a in QUICK if "verbose" not in a]  # the table is printed
    cli = run_cli([*args, *quick, "--trainer.callbacks.init_args.finetune_epochs=0"])
    model = cli.model.eval()
    assert isinstance(model.features[0], FactorizedLinear)
    compressed = accuracy(model, cli.datamodule.val_dataloader())  # independent of the callback and torchmetrics
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("validation accuracy:")]
    assert line.startswith(f"validation accuracy: {compressed:.4f} (compressed;"), line
    assert f"-> {compressed:.4f} compressed" in out  # the table's title
