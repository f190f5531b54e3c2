"""The contract every monitor keeps, run over every ``Monitor`` subclass the package ships (found by
``Monitor.__subclasses__()`` after importing every callback module, so a new monitor is covered as soon as it has a
case here): it measures at the end of the first batch at or past each multiple of ``every_n_steps`` and after the
last batch of a fit however the fit ends, with one optimizer step a batch, several (manual optimisation, where
``every_n_steps`` does not divide them) and gradient accumulation; nothing it logs, in its whole history and in the
loggers, is NaN or infinite (a watched group without gradient included); a resume from a checkpoint (for
GradientNoiseMonitor, one holding a partly filled window) continues its history and steps exactly; its statistics
reduce across processes as one process computes them on the union of the probes (simulated for each monitor, and
a real two-process DDP run); its values land at the steps of the model's ``self.log`` values; a watched module in
eval mode is measured and left in its mode."""

from __future__ import annotations

import copy
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
from lightning_ortho.callbacks.gradient_variance import (
    GradientNoiseMonitor,
    GradientVarianceMonitor,
    OnlineEstimatorVarianceMonitor,
)
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.callbacks.monitors.base import Measurement, Monitor
from lightning_ortho.callbacks.monitors.values import reduce_measurement
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.nn import AuxiliaryReflection
from lightning_ortho.nn.eval_mode import eval_mode
from lightning_ortho.online import TanhRNNCell
from tests.conftest import free_port, make_tiny_trainer
from tests.models.test_online_rnn_module import TinyStreams

D = 4
BATCHES = 8  # training batches an epoch


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
    """The model side of the contract: ``self.log`` of the loss and of the batch's index on every batch (to find
    the loggers' step of the batch a measurement followed), a chosen submodule put in eval mode at each epoch start,
    and a stop requested after ``stop_after`` batches (a fit that ends before its last batch)."""

    frozen: str
    stop_after: int | None = None

    def on_train_epoch_start(self) -> None:
        self.get_submodule(self.frozen).eval()

    def log_step(self, loss: torch.Tensor | None, batch_idx: int) -> None:
        if loss is not None:  # (the online module logs its own)
            self.log("train_loss", loss.detach().float(), on_step=True, on_epoch=False, batch_size=1)
        self.log("batch", float(batch_idx), on_step=True, on_epoch=False, batch_size=1)
        if self.stop_after is not None and batch_idx + 1 >= self.stop_after:
            self.trainer.should_stop = True


class Everything(Logged, pl.LightningModule):
    """Something every monitor of any model can measure: an orthogonal map, an invertible reflection (closed-form
    log-determinant, Newton inverse), a BatchNorm and a head; and a gated-off branch whose gradient is exactly zero
    (a monitor of gradients must not log 0/0 for it)."""

    def __init__(self, frozen: str) -> None:
        super().__init__()
        self.frozen = frozen
        self.ortho = orthogonal(nn.Linear(D, D))
        self.reflection = AuxiliaryReflection(D, invertible=True)
        self.norm = nn.BatchNorm1d(D)
        self.head = nn.Linear(D, 1)
        self.gated = nn.Linear(D, 1)

    def loss(self, x, y):
        return F.mse_loss(self.head(self.norm(self.reflection(self.ortho(x)))) + 0.0 * self.gated(x), y)

    def training_step(self, batch, batch_idx):
        loss = self.loss(*batch)
        self.log_step(loss, batch_idx)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class TwoStepsABatch(Everything):
    """Manual optimisation with two optimizer steps a batch (one per half), as an online model takes several."""

    def __init__(self, frozen: str) -> None:
        super().__init__(frozen)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizer = self.optimizers()
        for rows in (slice(0, 2), slice(2, 4)):
            loss = self.loss(x[rows], y[rows])
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        self.log_step(loss, batch_idx)


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


class BatchEnds(pl.Callback):
    """The test's own record of the global step at the end of every training batch, by batch index."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps[batch_idx] = trainer.global_step


def first_batch_at_or_past_each_multiple(ends: list[int], every: int, first: int, last_batch: bool) -> list[int]:
    """The batches after which the rule measures, from the global steps at the ends of a fit's batches (the fit
    started at step ``first``): each batch whose steps reach or pass a multiple of ``every``, and (with
    ``last_batch``) the fit's last batch if it stepped past the last measurement."""
    batches, before = [], first
    for b, s in enumerate(ends):
        if s // every > before // every:
            batches.append(b)
        before = s
    last = len(ends) - 1
    if last_batch and ends and ends[-1] > first and (not batches or ends[batches[-1]] != ends[-1]):
        batches.append(last)
    return batches


@dataclass
class Case:
    """How to run one monitor class: its monitor (given ``every_n_steps``), the model and data, the submodule put in
    eval mode (and watched, by name, where the monitor takes names), optimizer steps per batch, whether it also
    measures after the last batch of a fit, and the layouts it runs in besides its own (``"two_steps"``: manual
    optimisation with two steps a batch; ``"accumulate"``: gradient accumulation over two batches)."""

    monitor: Callable[[int], Monitor]
    model: Callable[[str], pl.LightningModule]
    data: Callable[[], object]
    frozen: str
    every: int
    steps_per_batch: int = 1
    named: bool = True
    last_batch: bool = True
    layouts: tuple[str, ...] = ("one_step", "two_steps", "accumulate")


LAYOUTS = {"one_step": {}, "two_steps": {"model": TwoStepsABatch}, "accumulate": {"accumulate_grad_batches": 2}}


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
    # A window is measured where it closes: not after a last batch inside an interval (its window is incomplete).
    # (and the same monitor under its second name: a subclass, so that configs can name it)
    **{
        cls.__name__: Case(
            lambda every, cls=cls: cls(modules=["norm", "gated"], every_n_steps=every, window_steps=2),
            Everything,
            loader,
            "norm",
            3,
            last_batch=False,
        )
        for cls in (GradientNoiseMonitor, GradientVarianceMonitor)
    },
    # 5 optimizer steps a batch (one per time step), every_n_steps=3 does not divide them; manual optimisation
    # only (Lightning has no accumulation for it)
    "OnlineEstimatorVarianceMonitor": Case(
        lambda every: OnlineEstimatorVarianceMonitor(every_n_steps=every, draws=2, probe_streams=2),
        Online,
        lambda: TinyStreams(streams=4, steps=5, chunks_per_epoch=BATCHES),
        "norm",
        3,
        steps_per_batch=5,
        named=False,
        layouts=("one_step",),
    ),
}
MONITORS = shipped_monitors()


def run(
    case: Case,
    root: Path,
    callbacks=(),
    stop_after=None,
    epochs=1,
    ckpt_path=None,
    every=None,
    monitor=None,
    layout="one_step",
):
    pl.seed_everything(0, verbose=False)
    options = dict(LAYOUTS[layout])
    # float64 from construction: Lightning loads a checkpoint into the parameters before "64-true" converts them,
    # so a float32 model would round the checkpoint's float64 values (by ~1e-8) and no resume could be exact.
    model = options.pop("model", case.model)(case.frozen).double()
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
        **options,
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
def steps_per_batch(case: Case, layout: str) -> list[int]:
    """Global steps at the ends of the batches of one epoch, as the layout steps the optimizer (reasoned, to check
    the recorded ones against)."""
    if layout == "accumulate":  # a step every second batch, and at the epoch's last batch
        return [(b + 1) // 2 if b + 1 < BATCHES else (BATCHES + 1) // 2 for b in range(BATCHES)]
    per = 2 if layout == "two_steps" else case.steps_per_batch
    return [per * (b + 1) for b in range(BATCHES)]


@pytest.fixture(params=list(LAYOUTS))
def layout(request, case) -> str:
    if request.param not in case.layouts:
        pytest.skip(f"{request.param} does not apply to this model")
    return request.param


@pytest.mark.filterwarnings("ignore:.*measured nothing", "ignore:.*never measured")
@pytest.mark.parametrize("stop_after", [None, 5], ids=["full", "stopped"])
def test_measures_at_the_first_batch_at_or_past_each_multiple_and_the_last_one_logging_the_models_steps(
    case, layout, stop_after, tmp_path
):
    ends = BatchEnds()
    trainer, _, monitor = run(case, tmp_path, callbacks=[ends], stop_after=stop_after, layout=layout)
    batch_ends = [ends.steps[b] for b in sorted(ends.steps)]
    assert batch_ends == steps_per_batch(case, layout)[: stop_after or BATCHES]
    assert trainer.global_step == batch_ends[-1]
    measured_after = first_batch_at_or_past_each_multiple(batch_ends, case.every, 0, case.last_batch)
    expected = [batch_ends[b] for b in measured_after]
    assert [r["step"] for r in monitor.history] == expected
    assert 0 not in expected
    # Logged at the loggers' step of the batch each was measured after (the model's self.log of its index).
    rows = csv_rows(trainer)
    logger_step = {round(float(r["batch"])): int(r["step"]) for r in rows if r.get("batch")}
    # The loggers' step of a batch counts the batches before it that stepped (Lightning does not log the values of
    # a batch that only accumulates, so the last batch of a stopped accumulation fit has no row: its step is that).
    stepped_before = [
        sum(batch_ends[i] > (batch_ends[i - 1] if i else 0) for i in range(b)) for b in range(len(batch_ends))
    ]
    assert all(stepped_before[b] == step for b, step in logger_step.items()), (logger_step, stepped_before)
    prefix = f"{monitor.prefix}/"
    logged = [(int(r["step"]), k, float(v)) for r in rows for k, v in r.items() if k.startswith(prefix) and v != ""]
    assert bool(logged) == bool(expected)  # (a stopped accumulation fit closes no window of GradientNoiseMonitor)
    for record, batch in zip(monitor.history, measured_after, strict=True):
        assert record["log_step"] == stepped_before[batch], record
        assert {k for s, k, _ in logged if s == record["log_step"]} == set(record["values"])
    assert sorted({s for s, _, _ in logged}) == [r["log_step"] for r in monitor.history]
    # Nothing undefined or infinite, over the whole history and everything the loggers got.
    for record in monitor.history:
        assert record["values"] and all(math.isfinite(v) for v in record["values"].values()), record
    assert all(math.isfinite(value) for _, _, value in logged), [x for x in logged if not math.isfinite(x[2])]
    for key, value in (monitor.history[-1]["values"] if monitor.history else {}).items():  # and the trainer's
        assert float(trainer.callback_metrics[key]) == pytest.approx(value, rel=1e-6), key


@pytest.mark.filterwarnings("ignore:.*dataloader is not resumable", "ignore:.*measured nothing")
def test_a_resume_from_a_checkpoint_continues_the_history_and_steps_exactly(case, tmp_path):
    _, _, straight = run(case, tmp_path / "straight", epochs=2)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    _, _, first = run(case, tmp_path / "first", callbacks=[checkpoint], epochs=1)
    if isinstance(first, GradientNoiseMonitor):  # the checkpoint (step 8) holds a partly filled window: step 7 of 7-8
        assert first._steps == 1 and first.window_steps == 2
    _, _, resumed = run(case, tmp_path / "resumed", epochs=2, ckpt_path=checkpoint.last_model_path)
    # The resumed fit's history is the first fit's (which measured its own last step, 8) and then what the
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

    if not monitor.needs_probe():
        pytest.skip("no probe rows to split between simulated processes (see the real two-process run below)")
    monitor.measure = capture
    _, model, monitor = run(case, tmp_path, monitor=monitor)
    name, module, probe, whole = captured[-1]
    with eval_mode(model):  # each process has its own probe: half of it
        whole = measure(name, module, probe)
        halves = measure(name, module, probe[:2]), measure(name, module, probe[2:])
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


class Reflections(pl.LightningModule):
    """An unconstrained auxiliary reflection (its det J changes sign between rows) and a head: picklable for
    ``ddp_spawn`` (no torch parametrization)."""

    def __init__(self) -> None:
        super().__init__()
        self.free = AuxiliaryReflection(D)
        with torch.no_grad():
            self.free.weight.copy_(3 * torch.randn(D, D, generator=torch.Generator().manual_seed(3)))
        self.head = nn.Linear(D, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.head(self.free(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def brute_force_log_det(module: nn.Module, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sign, log|det J|)`` per row from autograd Jacobians in float64 (the test's own reference)."""
    module = copy.deepcopy(module).double().eval()
    pairs = [torch.linalg.slogdet(torch.autograd.functional.jacobian(lambda t: module(t[None])[0], r)) for r in rows]
    return torch.stack([s for s, _ in pairs]), torch.stack([v for _, v in pairs])


@pytest.mark.ddp
def test_a_real_two_process_run_logs_the_statistics_of_the_union_of_the_probes(tmp_path, monkeypatch):
    """ddp_spawn on two CPU processes, one step, 4 rows each (rank 0 the even rows, rank 1 the odd ones): each
    process measures its own probe, the "mean" (weighted by rows), "min" and "max" reductions give what one process
    computes on all 8 rows, and the two processes' own values differ (so the reduction is really tested)."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    pl.seed_everything(0, verbose=False)
    model = Reflections()
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(8, D, generator=g), torch.randn(8, 1, generator=g)), batch_size=4)
    monitor = JacobianDeterminantMonitor(modules=["free"], every_n_steps=1, probe_size=4, verbose=False)
    trainer = make_tiny_trainer(
        tmp_path, precision="64-true", max_steps=1, strategy="ddp_spawn", devices=2, callbacks=[monitor]
    )
    trainer.fit(model, data)  # the parameters after the step come back to this process
    x = data.dataset.tensors[0].double()
    sign, log_det = brute_force_log_det(model.free, x)
    per_process = [float(log_det[rank::2].mean()) for rank in (0, 1)]
    assert abs(per_process[0] - per_process[1]) > 1e-3
    metrics = trainer.callback_metrics
    expected = {
        "log_abs_det_mean": float(log_det.mean()),
        "log_abs_det_min": float(log_det.min()),
        "log_abs_det_max": float(log_det.max()),
        "negative_fraction": float((sign <= 0).double().mean()),
    }
    for key, value in expected.items():
        assert float(metrics[f"jacobian/free/{key}"]) == pytest.approx(value, rel=1e-6, abs=1e-12), key
