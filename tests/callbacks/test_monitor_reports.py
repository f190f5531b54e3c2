"""What a monitor leaves besides its logged values: the end-of-fit table (as wide as its keys, off with
``verbose=False``), the PNG (off by default; in the logger's directory, in TensorBoard as a figure, never under
``fast_dev_run``; ``plot=True`` without matplotlib is an error naming the extra), and its values in the progress bar
and in ``trainer.callback_metrics`` for ``pl.callbacks.ModelCheckpoint(monitor=...)``."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._extras import MissingExtraError
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor

LONG = "a_submodule_whose_name_is_long_enough_to_push_the_table_past_eighty_columns"


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.add_module(LONG, orthogonal(nn.Linear(4, 4)))
        self.head = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.head(getattr(self, LONG)(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)


def fit(root, monitor, **kwargs):
    defaults = dict(
        accelerator="cpu",
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    trainer = pl.Trainer(**{**defaults, **kwargs, "callbacks": [monitor, *kwargs.get("callbacks", [])]})
    trainer.fit(Net(), loader())
    return trainer


def test_plot_without_matplotlib_is_an_error_at_construction_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r'pip install "lightning-ortho\[plots\]"'):
        OrthogonalityMonitor(plot=True)
    assert OrthogonalityMonitor().plot is False  # the default needs no matplotlib


def test_no_png_by_default_and_with_plot_one_in_the_loggers_directory(tmp_path):
    logger = pl.loggers.CSVLogger(tmp_path / "off", name="run")
    fit(tmp_path / "off", OrthogonalityMonitor(every_n_steps=2), logger=logger)
    assert not list((tmp_path / "off").rglob("*.png"))
    logger = pl.loggers.CSVLogger(tmp_path / "on", name="run")
    fit(tmp_path / "on", OrthogonalityMonitor(every_n_steps=2, plot=True), logger=logger)
    assert [p.relative_to(tmp_path) for p in (tmp_path / "on").rglob("*.png")] == [
        (tmp_path / "on" / "run" / "version_0" / "OrthogonalityMonitor.png").relative_to(tmp_path)
    ]


def test_no_png_under_fast_dev_run(tmp_path):
    monitor = OrthogonalityMonitor(plot=True)
    fit(tmp_path, monitor, fast_dev_run=True)
    assert monitor.history and not list(tmp_path.rglob("*.png"))


class TensorBoardLogger(pl.loggers.Logger):
    """TensorBoard's logger as the monitors see it (its class name and ``experiment.add_figure``; tensorboard is
    not a dependency of the tests)."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root, self.figures = root, []

    name, version = "tb", 0
    save_dir = property(lambda self: str(self.root))
    experiment = property(lambda self: self)

    def add_figure(self, tag, figure, global_step=None, close=True):
        self.figures.append((tag, global_step, type(figure).__name__))

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_the_figure_goes_to_tensorboard(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb")
    fit(tmp_path, OrthogonalityMonitor(every_n_steps=2, plot=True), logger=logger)
    # at the step of the last logged values (steps 2 and 4 are logged at the loggers' steps 1 and 3)
    assert logger.figures == [("orthogonality/history", 3, "Figure")]
    assert (tmp_path / "tb" / "OrthogonalityMonitor.png").is_file()


def test_plotting_leaves_the_users_backend_alone_and_draws_against_the_logged_steps(tmp_path):
    import matplotlib

    from lightning_ortho.callbacks.monitors.report import history_figure

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a user's choice (a notebook's inline backend, say)
    try:
        monitor = OrthogonalityMonitor(every_n_steps=2, plot=True)
        fit(tmp_path, monitor, logger=pl.loggers.CSVLogger(tmp_path, name="run"))
        assert matplotlib.get_backend() == "svg"  # before: switched to Agg for the rest of the process
    finally:
        matplotlib.use(before)
    assert (tmp_path / "run" / "version_0" / "OrthogonalityMonitor.png").is_file()
    figure = history_figure(monitor.history, monitor.prefix)
    assert list(figure.axes[0].lines[0].get_xdata()) == [r["log_step"] for r in monitor.history] == [1, 3]
    assert "logged step" in figure.axes[-1].get_xlabel()


def test_the_table_is_as_wide_as_its_keys_and_verbose_false_prints_none(tmp_path, capsys):
    fit(tmp_path, OrthogonalityMonitor(every_n_steps=2), logger=False)
    out = capsys.readouterr().out
    key = f"orthogonality/{LONG}/weight/orthogonality_spectral"
    assert len(key) > 80 and key in out  # one line, not cut at 80 columns
    fit(tmp_path, OrthogonalityMonitor(every_n_steps=2, verbose=False), logger=False)
    assert "orthogonality_spectral" not in capsys.readouterr().out


def test_values_reach_the_progress_bar_only_when_asked_and_model_checkpoint_can_monitor_them(tmp_path):
    key = f"orthogonality/{LONG}/weight/orthogonality_fro"
    trainer = fit(tmp_path, OrthogonalityMonitor(every_n_steps=2), logger=False)
    assert key in trainer.callback_metrics and key not in trainer.progress_bar_metrics
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor=key, mode="min", save_top_k=1)
    monitor = OrthogonalityMonitor(every_n_steps=2, prog_bar=True)
    trainer = fit(tmp_path, monitor, logger=False, max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True)
    assert trainer.progress_bar_metrics[key] == monitor.history[-1]["values"][key]
    # saved at each epoch end with the value measured at that epoch's last step (steps 4 and 8)
    at_epoch_ends = [r["values"][key] for r in monitor.history if r["step"] in (4, 8)]
    assert float(checkpoint.best_model_score) == pytest.approx(min(at_epoch_ends), rel=1e-6)
