"""The online gradient estimators of lightning_ortho.online side by side: UORO (state and preactivation projections),
KF-RTRL, SnAp-1, SnAp-2, truncated BPTT, exact RTRL and, on a 100-step delay, exact diagonal RTRL of a linear
recurrent unit; the same tasks, the same measurements.

    python -m benchmarks.online_family            # 4 tasks, 24 estimator runs (~16 minutes on one core)
    python -m benchmarks.online_family --quick    # smoke run (seconds; used by the tests)
    python -m benchmarks.online_family --seconds 60 --long-seconds 240 --tasks characters "long copy"

Tasks (data modules of ``lightning_ortho.datamodules``; cross-entropy, 32 streams, one Adam update per step,
gradient norm clipped at 1; ``TanhRNNCell(I, 32)`` with a linear readout):

* **copy**: 2 symbols out of 4, 5 blank steps, a go marker, recall (``CopyTaskDataModule``, episodes aligned to
  10-step chunks, the state reset between them); chance is ln 4 = 1.386 nats per recalled symbol; lr 3e-3.
* **adding**: ``y_t = 0.5 + 0.5 x_{t-5} - 0.25 x_{t-9}`` (``AddingTaskDataModule``, chunks of 32); lr 1e-3.
* **characters**: the standard library's help topics (``CharacterStreamDataModule``, 25-step chunks); lr 1e-3.
* **long copy** (delay 100, 105-step episodes): ``LinearRecurrentUnit(I, 64, r_min=0.9, r_max=0.999)`` (Orvieto
  et al. 2023) trained by exact diagonal RTRL (Zucchet et al. 2023), against the tanh RNN under UORO
  (preactivation) and KF-RTRL; lr 3e-3.

Measurements, for every (task, estimator):

1. **Gradient quality** at the initial parameters and again after training (at the trained parameters), on a probe
   (the first 4 streams of the first training chunk, from a zero state): ``measure_estimator`` of
   ``lightning_ortho.callbacks`` computes the exact gradient ``g`` by backprop through time and ``R`` independent
   draws ``g_r`` of the estimator (one for a deterministic one); reported: the squared bias (unbiased estimate of
   ``||E g_r - g||^2``, with its standard error under "no bias"), the total variance ``tr Cov(g_r)``, both also
   relative to ``||g||^2``, and the alignment ``mean_r cos(g_r, g)`` (Marschall, Cho & Savin 2020).
2. **Cost**: seconds per step (``estimator.step``, the readout's ``dL/dh`` by autograd, ``estimator.gradient``) on 32
   streams, one thread, all the task's estimators interleaved (``_common.interleave``, best round), and the state
   memory per stream (bytes of the hidden state and the estimator's tensors after a chunk, over the streams).
3. **Loss at equal wall time**: ``Trainer.fit`` of ``OnlineRNNModule`` until ``--seconds`` (long copy:
   ``--long-seconds``) of training batches have run (validation excluded: it runs once after fit); reported: the
   validation loss (nats per scored step; characters also bits per character), optimizer steps taken, and a curve
   of the training loss against training seconds.

Claims: "KF-RTRL has lower variance than UORO" (Mujika, Meier & Steger 2018), "SnAp-1 beats UORO at equal wall time
on characters" (Menick et al. 2021), "an LRU trained online with exact diagonal RTRL learns the 100-step delay copy
task that a UORO-trained tanh RNN does not learn here" (Zucchet et al. 2023; learning = validation recall loss
below half of chance), and the sanity check that the exact estimators align with backprop (cosine > 0.999).
Writes benchmarks/results/online_family-HARDWARE.json (+ .png); results table: online_family_render.py.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks._common import (
    benchmark_parser,
    configured,
    interleave,
    parse_args,
    print_claims,
    reject,
    result_path,
    write_result,
)
from benchmarks._reproduce import quiet_trainer, scratch_folder
from benchmarks.online_family_render import LEARNED_FRACTION, claims, plot
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.online_estimator_variance import measure_estimator
from lightning_ortho.datamodules import AddingTaskDataModule, CharacterStreamDataModule, CopyTaskDataModule
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.models.online.estimators import initial_state
from lightning_ortho.models.online.readout import read_chunk
from lightning_ortho.online import LinearRecurrentUnit, TanhRNNCell

HIDDEN, LRU_HIDDEN, STREAMS, PROBE_STREAMS = 32, 64, 32, 4

#: label -> (OnlineRNNModule estimator, estimator_options), for the tanh RNN on the short tasks
TANH_ESTIMATORS = {
    "UORO (state)": ("uoro", {"projection": "state"}),
    "UORO (preactivation)": ("uoro", {"projection": "preactivation"}),
    "KF-RTRL": ("kf_rtrl", {}),
    "SnAp-1": ("snap", {"order": 1}),
    "SnAp-2": ("snap", {"order": 2}),
    "TBPTT k=5": ("tbptt", {"k": 5}),
    "RTRL": ("rtrl", {}),
}
#: label -> (cell kind, estimator, options) on the long copy task
LONG_ESTIMATORS = {
    "LRU, diagonal RTRL": ("lru", "diagonal_rtrl", {}),
    "tanh, UORO (preactivation)": ("tanh", "uoro", {"projection": "preactivation"}),
    "tanh, KF-RTRL": ("tanh", "kf_rtrl", {}),
}


@dataclass
class Task:
    name: str
    data: object  # () -> a StreamDataModule
    lr: float
    estimators: dict = field(default_factory=dict)  # label -> (cell kind, estimator, options)
    long: bool = False


#: --quick: the estimators each task keeps (enough for every claim to be computed)
QUICK = {
    "copy": ("UORO (state)", "KF-RTRL"),
    "adding": ("UORO (state)", "KF-RTRL"),
    "characters": ("UORO (state)", "UORO (preactivation)", "SnAp-1", "RTRL"),
    "long copy": ("LRU, diagonal RTRL", "tanh, UORO (preactivation)"),
}


def tasks(quick: bool) -> list[Task]:
    """The four tasks (``quick``: tiny sizes, the estimators of :data:`QUICK`, a delay of 10 for the long copy)."""
    chunks = 2 if quick else 20
    tanh = {label: ("tanh", e, o) for label, (e, o) in TANH_ESTIMATORS.items()}
    delay = 10 if quick else 100
    found = [
        Task("copy", lambda: CopyTaskDataModule(4, 2, 5, True, STREAMS, 10, chunks, 32, 4), 3e-3, tanh),
        Task(
            "adding", lambda: AddingTaskDataModule(streams=STREAMS, chunks_per_epoch=chunks, val_streams=32), 1e-3, tanh
        ),
        Task(
            "characters",
            lambda: CharacterStreamDataModule(None, STREAMS, 25, chunks, 8, 2 if quick else 20),
            1e-3,
            tanh,
        ),
        Task(
            "long copy",
            lambda: CopyTaskDataModule(4, 2, delay, True, STREAMS, 2 * 2 + delay + 1, 5, 32, 2),
            3e-3,
            LONG_ESTIMATORS,
            long=True,
        ),
    ]
    if quick:
        for task in found:
            task.estimators = {k: v for k, v in task.estimators.items() if k in QUICK[task.name]}
    return found


def build(task: Task, label: str, quick: bool) -> tuple[OnlineRNNModule, pl.LightningDataModule]:
    """The task's data module and a model with the estimator ``label`` (seeded: every estimator of a task starts
    from the same parameters of its cell kind)."""
    kind, estimator, options = task.estimators[label]
    pl.seed_everything(0, verbose=False)
    data = task.data()
    hidden = 8 if quick else HIDDEN
    if kind == "lru":
        cell = LinearRecurrentUnit(data.input_size, 16 if quick else LRU_HIDDEN, r_min=0.9, r_max=0.999)
    else:
        cell = TanhRNNCell(data.input_size, hidden)
    model = OnlineRNNModule(
        cell,
        output_size=data.output_size,
        loss="cross_entropy",
        estimator=estimator,
        estimator_options=options,
        optimizer="adam",
        lr=task.lr,
        seed=0,
        clip_gradient_norm=1.0,
        num_threads=None,
    )
    model.estimator.num_threads = None
    return model, data


def first_chunk(model: OnlineRNNModule, data) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x, y, mask`` of the first training chunk (all streams)."""
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    chunk = read_chunk(batch, input_size=model.cell.input_size, output_size=data.output_size, loss="cross_entropy")
    return chunk.x, chunk.y, chunk.mask


def quality(model: OnlineRNNModule, probe, draws: int) -> dict:
    """Squared bias, variance and mean cosine alignment of the model's estimator against BPTT on ``probe``."""
    x, y, mask = (v[:PROBE_STREAMS] for v in probe)
    m = measure_estimator(model.cell, model.readout, model.estimator, model.loss_name, x, y, mask, draws)
    stats = m.statistics()
    cosines = (m.estimates @ m.exact) / (m.estimates.norm(dim=1) * m.exact.norm()).clamp_min(1e-300)
    return {
        **stats,
        "draws": m.draws,
        "cosine": float(cosines.mean()),
        "cosine_se": float(cosines.std() / math.sqrt(m.draws)) if m.draws > 1 else 0.0,
    }


def stepper(model: OnlineRNNModule, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor):
    """A function of no argument taking one step (step, readout ``dL/dh``, gradient) on the chunk's streams, cycling
    through its steps, and a function giving the state's bytes per stream."""
    estimator, readout = model.estimator, model.readout
    streams, steps = x.shape[:2]
    h0 = torch.zeros(
        streams, model.cell.hidden_size, dtype=torch.cfloat if getattr(model.cell, "complex_state", False) else x.dtype
    )
    box = {"state": initial_state(estimator, h0), "t": 0}

    def step() -> None:
        t = box["t"] % steps
        if t == 0:
            box["state"] = initial_state(estimator, h0)
        h, box["state"] = estimator.step(x[:, t], box["state"])
        h_in = h.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = readout(h_in)
            loss = torch.nn.functional.cross_entropy(logits[mask[:, t]], y[mask[:, t], t], reduction="sum")
            (grad_h,) = torch.autograd.grad(loss, h_in) if bool(mask[:, t].any()) else (torch.zeros_like(h),)
        estimator.gradient(box["state"], grad_h)
        box["t"] += 1

    def state_bytes() -> float:
        state = box["state"]
        tensors = [state.h, *state.tensors.values()]
        return sum(v.numel() * v.element_size() for v in tensors) / streams

    return step, state_bytes


class WallClock(pl.Callback):
    """Stops fit once the training batches have run ``seconds`` (validation and the rest of fit excluded); records
    the training loss against training seconds."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.spent, self.curve, self._start = seconds, 0.0, [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.spent += time.perf_counter() - self._start
        loss = trainer.callback_metrics.get("train_loss")
        if loss is not None:
            self.curve.append((self.spent, trainer.global_step, float(loss)))
        if self.spent >= self.seconds:
            trainer.should_stop = True


def train(model: OnlineRNNModule, data, seconds: float) -> dict:
    """Fit for ``seconds`` of training batches, then validate once; the result row's training fields."""
    clock = WallClock(seconds)
    error = None
    with scratch_folder() as scratch:
        trainer = quiet_trainer(100_000, clock, default_root_dir=scratch, limit_val_batches=0)
        try:
            trainer.fit(model, data)
        except (FloatingPointError, ValueError) as caught:  # the estimator refuses NaN/inf states: diverged
            error = f"{type(caught).__name__}: {str(caught)[:160]}"
        metrics = {}
        if error is None:
            validator = quiet_trainer(1, pl.Callback(), default_root_dir=scratch)
            metrics = validator.validate(model, datamodule=data, verbose=False)[0]
    out = {
        "train_seconds": clock.spent,
        "optimizer_steps": clock.curve[-1][1] if clock.curve else 0,
        "curve": _thin([[round(s, 3), n, round(v, 5)] for s, n, v in clock.curve], 60),
    }
    if error:
        out["diverged"] = error
    for key in ("val_loss", "val_bits"):
        if key in metrics:
            out[key] = float(metrics[key])
    return out


def _thin(points: list, keep: int) -> list:
    if len(points) <= keep:
        return points
    index = sorted({round(i * (len(points) - 1) / (keep - 1)) for i in range(keep)})
    return [points[i] for i in index]


def run_task(task: Task, args) -> list[dict]:
    rows = {label: {"task": task.name, "method": label} for label in task.estimators}
    models = {label: build(task, label, args.quick) for label in task.estimators}
    model0, data0 = next(iter(models.values()))
    probe = first_chunk(model0, data0)
    if task.long:
        for row in rows.values():
            row["chance_loss"], row["delay"] = data0.chance_loss, data0.delay
    # (1) gradient quality at the initial parameters
    for label, (model, _) in models.items():
        rows[label]["initial"] = quality(model, probe, args.draws)
        rows[label]["parameters"] = sum(p.numel() for p in model.cell.parameters())
    # (2) cost: interleaved steps on the chunk's streams
    steppers = {label: stepper(model, *probe) for label, (model, _) in models.items()}
    timing = interleave(
        {label: s for label, (s, _) in steppers.items()},
        rounds=args.rounds or (2 if args.quick else 5),
        min_time=0.005 if args.quick else 0.15,
    )
    for label, (_, state_bytes) in steppers.items():
        rows[label]["ms_per_step"] = 1e3 * timing.best(label)
        rows[label]["ms_per_step_median"] = 1e3 * timing.median(label)
        rows[label]["state_bytes_per_stream"] = state_bytes()
    # (3) training at equal wall time, then the gradient quality at the trained parameters
    seconds = args.long_seconds if task.long else args.seconds
    for label in task.estimators:
        model, data = build(task, label, args.quick)
        rows[label].update(train(model, data, seconds))
        if "diverged" not in rows[label]:
            rows[label]["trained"] = quality(model, probe, args.draws)
        r = rows[label]
        print(
            f"{task.name:10s} {label:28s} cos {r['initial']['cosine']:.3f}  relvar {r['initial']['relative_variance']:.3g}"
            f"  {r['ms_per_step']:.2f} ms/step  {r['state_bytes_per_stream'] / 1024:.1f} KiB/stream"
            f"  val_loss {r.get('val_loss', float('nan')):.4f} after {r['optimizer_steps']} steps",
            flush=True,
        )
    return list(rows.values())


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("online_family", __doc__, threads=1)
    parser.add_argument("--seconds", type=float, default=25.0, help="training seconds per estimator, short tasks")
    parser.add_argument("--long-seconds", type=float, default=120.0, help="training seconds per estimator, long copy")
    parser.add_argument("--draws", type=int, default=100, help="noise draws of a stochastic estimator per probe")
    parser.add_argument("--tasks", nargs="+", default=None, help="subset of: copy adding characters 'long copy'")
    args = parse_args(parser, argv)
    reject(parser, args, device="online_family runs on the CPU only")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available" lines for every fit
    if args.quick:
        args.seconds, args.long_seconds, args.draws = 0.3, 1.0, 8
    started = time.perf_counter()
    rows: list[dict] = []
    for task in tasks(args.quick):
        if args.tasks is None or task.name in args.tasks:
            rows.extend(run_task(task, args))
    setup = {
        "hidden": 8 if args.quick else HIDDEN,
        "lru_hidden": 16 if args.quick else LRU_HIDDEN,
        "streams": STREAMS,
        "probe_streams": PROBE_STREAMS,
        "draws": args.draws,
        "seconds": args.seconds,
        "long_seconds": args.long_seconds,
        "learned_fraction_of_chance": LEARNED_FRACTION,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    found = claims(rows)
    path = write_result("online_family", device, rows, found, args, extra={"setup": setup})
    plot(rows, result_path("online_family", device, args, ".png"))
    print_claims(found)
    return path


if __name__ == "__main__":
    main()
