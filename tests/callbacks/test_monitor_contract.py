"""The contract every monitor keeps, run over every ``Monitor`` subclass the package ships (found by
``Monitor.__subclasses__()`` after importing every callback module, so a new monitor is covered as soon as it has a
case here): it measures every ``every_n_steps`` optimizer steps and after the last step of a fit however the fit
ends; a resume from a checkpoint continues its history and steps exactly; its statistics reduce across two
processes as one process computes them on the union of the probes; its values land at the steps of the model's
``self.log`` values; a watched module in eval mode is measured and left in its mode."""

from __future__ import annotations

import csv
import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import DataLoader, TensorDataset

import lightning_ortho.callbacks
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks._monitor import Measurement, Monitor
from lightning_ortho.callbacks._monitor_values import reduce_measurement
from lightning_ortho.callbacks.gradient_variance import GradientNoiseMonitor, OnlineEstimatorVarianceMonitor
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.nn import AuxiliaryReflection
from lightning_ortho.nn.eval_mode import eval_mode
from lightning_ortho.online import TanhRNNCell
from tests.models.test_online_rnn_module import TinyStreams

D = 4
BATCHES = 7  # training batches an epoch


def shipped_monitors() -> list[type]:
    """Every Monitor subclass in lightning_ortho (each callback module imported first)."""
    for info in pkgutil.iter_modules(lightning_ortho.callbacks.__path__):
        importlib.import_module(f"lightning_ortho.callbacks.{info.name}")
    found, stack = set(), [Monitor]
    while stack:
        for cls in stack.pop().__subclasses__():
            stack.append(cls)
            if cls.__module__.startswith("lightning_ortho."):
                found.add(cls)
    return sorted(found, key=lambda cls: cls.__name__)


# ---------------------------------------------------------------------------------------------- the models
class Logged:
    """The model side of the contract: ``self.log`` of the loss on every step, the global step the batch started
    at (to find the batch a measurement followed), a chosen submodule put in eval mode at each epoch start, and a
    stop requested after ``stop_after`` batches (a fit that ends before its last batch)."""

    frozen: str
    stop_after: int | None = None

    def on_train_epoch_start(self) -> None:
        self.get_submodule(self.frozen).eval()

    def log_step(self, loss: torch.Tensor | None, batch_idx: int) -> None:
        if loss is not None:  # (the online module logs its own)
            self.log("train_loss", loss.detach().float(), on_step=True, on_epoch=False, batch_size=1)
        self.log("started_at", float(self.global_step), on_step=True, on_epoch=False, batch_size=1)
        if self.stop_after is not None and batch_idx + 1 >= self.stop_after:
            self.trainer.should_stop = True


class Everything(Logged, pl.LightningModule):
    """Something every monitor of any model can measure: an orthogonal map, an invertible reflection (closed-form
    log-determinant, Newton inverse), a BatchNorm and a head."""

    def __init__(self, frozen: str) -> None:
        super().__init__()
        self.frozen = frozen
        self.ortho = orthogonal(nn.Linear(D, D))
        self.reflection = AuxiliaryReflection(D, invertible=True)
        self.norm = nn.BatchNorm1d(D)
        self.head = nn.Linear(D, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.head(self.norm(self.reflection(self.ortho(x)))), y)
        self.log_step(loss, batch_idx)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Online(Logged, OnlineRNNModule):
    """An online RNN (manual optimisation: one optimizer step per time step, 5 per batch) whose inputs also pass a
    BatchNorm."""

    def __init__(self, frozen: str) -> None:
        super().__init__(TanhRNNCell(3, 5), 4, estimator="uoro", lr=0.01)
        self.frozen, self.norm = frozen, nn.BatchNorm1d(3)

    def training_step(self, batch, batch_idx):
        self.norm(batch["x"][:, 0])
        self.log_step(None, batch_idx)  # before the batch's optimizer steps
        super().training_step(batch, batch_idx)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    rows = 4 * BATCHES
    return DataLoader(TensorDataset(torch.randn(rows, D, generator=g), torch.randn(rows, 1, generator=g)), 4)


def every_step_and_the_last(every: int, first: int, last: int) -> list[int]:
    """The steps after which a monitor measures in a fit that ran steps ``first .. last - 1``."""
    return [s for s in range(first + 1, last + 1) if s % every == 0 or s == last]


@dataclass
class Case:
    """How to run one monitor class: its monitor (given ``every_n_steps``), the model and data, the submodule put in
    eval mode (and watched, by name, where the monitor takes names), optimizer steps per batch, and the steps it
    measures after in a fit of steps ``first .. last - 1``."""

    monitor: Callable[[int], Monitor]
    model: Callable[[str], pl.LightningModule]
    data: Callable[[], object]
    frozen: str
    every: int
    steps_per_batch: int = 1
    named: bool = True
    expected: Callable[[int, int, int], list[int]] = every_step_and_the_last


def every_step_only(every: int, first: int, last: int) -> list[int]:
    """GradientNoiseMonitor measures when a window (the last steps of each interval) closes: not after a last step
    inside an interval, whose window is incomplete."""
    return [s for s in range(first + 1, last + 1) if s % every == 0]


CASES = {
    "OrthogonalityMonitor": Case(
        lambda every: OrthogonalityMonitor(modules=["ortho"], every_n_steps=every), Everything, loader, "ortho", 3
    ),
    "JacobianDeterminantMonitor": Case(
        lambda every: JacobianDeterminantMonitor(modules=["reflection"], every_n_steps=every, probe_size=4),
        Everything,
        loader,
        "reflection",
        3,
    ),
    "InvertibilityMonitor": Case(
        lambda every: InvertibilityMonitor(modules=["reflection"], every_n_steps=every, probe_size=4),
        Everything,
        loader,
        "reflection",
        3,
    ),
    "GradientNoiseMonitor": Case(
        lambda every: GradientNoiseMonitor(modules=["norm"], every_n_steps=every, window_steps=2),
        Everything,
        loader,
        "norm",
        3,
        expected=every_step_only,
    ),
    "OnlineEstimatorVarianceMonitor": Case(
        lambda every: OnlineEstimatorVarianceMonitor(every_n_steps=every, draws=2, probe_streams=2),
        Online,
        lambda: TinyStreams(streams=4, steps=5, chunks_per_epoch=BATCHES),
        "norm",
        5,
        steps_per_batch=5,
        named=False,
    ),
}
MONITORS = shipped_monitors()


def run(case: Case, root: Path, callbacks=(), stop_after=None, epochs=1, ckpt_path=None, every=None, monitor=None):
    pl.seed_everything(0, verbose=False)
    # float64 from construction: Lightning loads a checkpoint into the parameters before "64-true" converts them,
    # so a float32 model would round the checkpoint's float64 values (by ~1e-8) and no resume could be exact.
    model = case.model(case.frozen).double()
    model.stop_after = stop_after
    monitor = monitor or case.monitor(every or case.every)
    trainer = pl.Trainer(
        accelerator="cpu",
        precision="64-true",  # float64 throughout, so that a resumed fit can equal the uninterrupted one exactly
        max_epochs=epochs,
        logger=pl.loggers.CSVLogger(root, name="run", version=0),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=root,
        callbacks=[*callbacks, monitor],
    )
    trainer.fit(model, case.data(), ckpt_path=ckpt_path)
    return trainer, model, monitor


def csv_rows(trainer: pl.Trainer) -> list[dict[str, str]]:
    with open(trainer.logger.experiment.metrics_file_path) as handle:
        return list(csv.DictReader(handle))


def test_every_shipped_monitor_has_a_case():
    assert {cls.__name__ for cls in MONITORS} == set(CASES), "add a Case for the new monitor"


@pytest.fixture(params=MONITORS, ids=lambda cls: cls.__name__)
def case(request) -> Case:
    return CASES[request.param.__name__]


# ------------------------------------------------------------------------------------------------ the contract
@pytest.mark.filterwarnings("ignore:.*measured nothing", "ignore:.*never measured")
def test_measures_every_n_steps_and_after_the_last_step_however_the_fit_ends(case, tmp_path):
    per = case.steps_per_batch
    trainer, _, monitor = run(case, tmp_path / "full")
    assert trainer.global_step == BATCHES * per
    assert [r["step"] for r in monitor.history] == case.expected(case.every, 0, BATCHES * per)
    trainer, _, monitor = run(case, tmp_path / "stopped", stop_after=5)  # should_stop after the 5th batch
    assert trainer.global_step == 5 * per
    assert [r["step"] for r in monitor.history] == case.expected(case.every, 0, 5 * per)


def test_logged_steps_are_the_steps_of_the_models_self_log_values(case, tmp_path):
    # a fit that stops early: its last value is logged after the loop, at the last batch's step
    trainer, _, monitor = run(case, tmp_path, stop_after=5)
    rows = csv_rows(trainer)
    # each batch's step in the loggers, by the global step after its optimizer steps
    batch_step = {round(float(r["started_at"])) + case.steps_per_batch: int(r["step"]) for r in rows if r["started_at"]}
    prefix = f"{monitor.prefix}/"
    logged = [(int(r["step"]), k) for r in rows for k, v in r.items() if k.startswith(prefix) and v != ""]
    assert monitor.history and logged
    for record in monitor.history:
        assert record["log_step"] == batch_step[record["step"]], record  # the batch it was measured after
        assert {k for s, k in logged if s == record["log_step"]} == set(record["values"])
    assert sorted({s for s, _ in logged}) == [r["log_step"] for r in monitor.history]
    for key, value in monitor.history[-1]["values"].items():  # and the trainer has them, for checkpoints
        assert float(trainer.callback_metrics[key]) == pytest.approx(value, rel=1e-6), key
        assert not math.isnan(value), key  # nothing undefined is logged


@pytest.mark.filterwarnings("ignore:.*dataloader is not resumable", "ignore:.*measured nothing")
def test_a_resume_from_a_checkpoint_continues_the_history_and_steps_exactly(case, tmp_path):
    _, _, straight = run(case, tmp_path / "straight", epochs=2)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    _, _, first = run(case, tmp_path / "first", callbacks=[checkpoint], epochs=1)
    _, _, resumed = run(case, tmp_path / "resumed", epochs=2, ckpt_path=checkpoint.last_model_path)
    # The resumed fit's history is the first fit's (which measured its own last step, 7) and then what the
    # uninterrupted fit measured after that step, at the same steps.
    after = [r for r in straight.history if r["step"] > first.history[-1]["step"]]
    assert first.history and after and resumed.history[: len(first.history)] == first.history
    assert [(r["step"], r["log_step"]) for r in resumed.history[len(first.history) :]] == [
        (r["step"], r["log_step"]) for r in after
    ]
    for mine, reference in zip(resumed.history[len(first.history) :], after, strict=True):
        assert mine["values"].keys() == reference["values"].keys()
        for key, value in reference["values"].items():
            assert mine["values"][key] == value, (mine["step"], key)


class TwoProcesses:
    """``reduce_measurement`` as process zero of two sees it: ``strategy.reduce`` combines its tensor with the one
    process one sends (found by running process one's reduction against a recorder)."""

    def __init__(self, other: Measurement) -> None:
        self.world_size, sent = 2, []
        recorder = SimpleNamespace(root_device=torch.device("cpu"), reduce=lambda t, reduce_op: sent.append(t) or t)
        reduce_measurement(SimpleNamespace(world_size=2, strategy=recorder), other)
        ops = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}
        self.strategy = SimpleNamespace(
            root_device=torch.device("cpu"), reduce=lambda t, reduce_op: ops[reduce_op](t, sent[0])
        )


def test_two_processes_reduce_to_the_statistics_of_the_union_of_their_probes(case, tmp_path):
    captured = []
    monitor = case.monitor(case.every)
    measure = monitor.measure

    def capture(name, module, probe):
        captured.append((name, module, probe, measure(name, module, probe)))
        return captured[-1][-1]

    monitor.measure = capture
    _, model, monitor = run(case, tmp_path, monitor=monitor)
    name, module, probe, whole = captured[-1]
    if monitor.needs_probe():  # each process has its own probe: half of it
        with eval_mode(model):
            whole = measure(name, module, probe)
            halves = measure(name, module, probe[:2]), measure(name, module, probe[2:])
    else:  # every process reads the same parameters or all-reduced gradients
        halves = whole, whole
    assert whole and halves[0].keys() == halves[1].keys() == whole.keys()  # the same reductions on each process
    single = SimpleNamespace(world_size=1)
    for key, measurement in whole.items():
        reduced = reduce_measurement(TwoProcesses(halves[1][key]), halves[0][key])
        expected = reduce_measurement(single, measurement)
        if expected is None:
            assert reduced is None, key
        else:
            assert reduced == pytest.approx(expected, rel=1e-9, abs=1e-12), key


def test_a_watched_module_in_eval_mode_is_measured_and_left_in_its_mode(case, tmp_path):
    _, model, monitor = run(case, tmp_path)
    frozen = model.get_submodule(case.frozen)
    assert not frozen.training  # left in the mode the model put it in
    assert all(m.training for n, m in model.named_modules() if n and not n.startswith(case.frozen))
    keys = set(monitor.history[-1]["values"])
    if case.named:
        assert keys and all(key.startswith(f"{monitor.prefix}/{case.frozen}/") for key in keys)
    else:
        assert keys
    if isinstance(frozen, nn.BatchNorm1d):
        assert int(frozen.num_batches_tracked) == 0  # its statistics never moved, measurements included
