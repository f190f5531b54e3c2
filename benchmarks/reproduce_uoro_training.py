"""Online training with UORO against truncated BPTT and exact RTRL, through ``OnlineRNNModule`` and ``Trainer.fit``.

    python -m benchmarks.reproduce_uoro_training            # three tasks, one seed (~35 minutes on one core)
    python -m benchmarks.reproduce_uoro_training --quick    # smoke run
    python -m benchmarks.reproduce_uoro_training --tasks influence adding

Tasks (data modules of ``lightning_ortho.datamodules``):

* **influence balancing** (Tallec & Ollivier 2017, section 6): ``InfluenceBalancingCell`` (23 units, 10 positive
  influences, one parameter theta, readout = the first unit, target 1), one stream, SGD lr 1e-5, an update
  every step, 10,000 steps. The optimum is theta = -1/6. Truncations shorter than the long negative influences
  see the wrong sign of the gradient. Claim (paper): UORO converges where truncated BPTT with small k diverges.
* **adding** (Marschall et al. 2020): ``y_t = 0.5 + 0.5 x_{t-5} - 0.25 x_{t-9}``, a tanh RNN (H = 32) with a
  linear readout, 32 streams, Adam lr 1e-3, an update every step; validation cross-entropy against the task's floors
  (0.662 nats predicting the mean, 0.519 using x_{t-5} only, 0.455 the entropy of the target).
* **characters** (the standard library's ``pydoc_data.topics``): a tanh RNN (H = 32) over 103 characters, 32
  streams, Adam lr 1e-3 (gradient norm clipped at 1), an update every step, each estimator for the same
  wall time (180 s); validation bits per character.

Writes benchmarks/results/reproduce_uoro_training-HARDWARE.json and .png.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from benchmarks._common import (
    benchmark_parser,
    configured,
    parse_args,
    print_claims,
    pyplot,
    reject,
    result_path,
    write_result,
)
from benchmarks._reproduce import quiet_trainer, scratch_folder
from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import (
    AddingTaskDataModule,
    CharacterStreamDataModule,
    InfluenceBalancingDataModule,
)
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import InfluenceBalancingCell, TanhRNNCell

THETA_OPTIMUM = -1.0 / 6.0


class Recorder(pl.Callback):
    """After every validation: the epoch, cumulative training seconds (validation excluded), the validation
    loss (and bits), the epoch's mean training loss and, for one-parameter cells, the parameter."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.train_seconds = 0.0
        self._start = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.train_seconds += time.perf_counter() - self._start

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        row = {"epoch": trainer.current_epoch + 1, "train_seconds": self.train_seconds}
        for key in ("val_loss", "val_bits", "train_loss"):
            if key in metrics:
                row[key] = float(metrics[key])
        theta = getattr(pl_module.cell, "theta", None)
        if theta is not None:
            row["theta"] = float(theta)
        self.rows.append(row)
        self._start = time.perf_counter()


def fit(build, epochs: int, max_time: str | None = None) -> tuple[list[dict], str | None]:
    """Fit one run; the recorded rows and, when training blew up, the error that stopped it."""
    pl.seed_everything(0, verbose=False)
    model, data = build()
    recorder = Recorder()
    with scratch_folder() as scratch:
        trainer = quiet_trainer(epochs, recorder, max_time=max_time, default_root_dir=scratch)
        try:
            trainer.fit(model, data)
        except (FloatingPointError, ValueError) as error:  # the estimator refuses NaN/inf states: training diverged
            return recorder.rows, f"{type(error).__name__}: {str(error)[:160]}"
    return recorder.rows, None


def influence_runs(quick: bool) -> dict:
    steps_per_epoch, epochs = (100, 2) if quick else (1000, 10)
    estimators = {
        "UORO": ("uoro", {}),
        "RTRL": ("rtrl", {}),
        **{f"TBPTT k={k}": ("tbptt", {"k": k}) for k in ((1, 10) if quick else (1, 10, 30, 50))},
    }

    def build(estimator, options):
        data = InfluenceBalancingDataModule(
            streams=1, chunk_length=10, chunks_per_epoch=steps_per_epoch // 10, val_streams=1, val_chunks=10
        )
        model = OnlineRNNModule(
            InfluenceBalancingCell(23, 10, theta=0.0),
            output_size=1,
            loss="mse",
            readout="units",
            estimator=estimator,
            estimator_options=options,
            optimizer="sgd",
            lr=1e-5,
        )
        return model, data

    return {name: fit(lambda e=e, o=o: build(e, o), epochs) for name, (e, o) in estimators.items()}


def adding_runs(quick: bool) -> dict:
    chunks, epochs = (4, 1) if quick else (50, 10)
    hidden = 8 if quick else 32
    estimators = {
        "UORO (state)": ("uoro", {}),
        "UORO (preactivation)": ("uoro", {"projection": "preactivation"}),
        "UORO (none, no spatial noise)": ("uoro", {"projection": "none"}),
        "RTRL": ("rtrl", {}),
        "TBPTT k=1": ("tbptt", {"k": 1}),
        "TBPTT k=10": ("tbptt", {"k": 10}),
    }

    def build(estimator, options):
        data = AddingTaskDataModule(streams=32, chunk_length=32, chunks_per_epoch=chunks, val_streams=32, val_chunks=8)
        model = OnlineRNNModule(
            TanhRNNCell(1, hidden),
            output_size=2,
            loss="cross_entropy",
            estimator=estimator,
            estimator_options=options,
            optimizer="adam",
            lr=1e-3,
        )
        return model, data

    return {name: fit(lambda e=e, o=o: build(e, o), epochs) for name, (e, o) in estimators.items()}


def character_runs(quick: bool, seconds: int) -> dict:
    hidden = 8 if quick else 32
    estimators = {
        "UORO (state)": ("uoro", {}),
        "UORO (preactivation)": ("uoro", {"projection": "preactivation"}),
        "UORO (none, no spatial noise)": ("uoro", {"projection": "none"}),
        "RTRL": ("rtrl", {}),
        "TBPTT k=5": ("tbptt", {"k": 5}),
    }

    def build(estimator, options):
        data = CharacterStreamDataModule(
            streams=32,
            chunk_length=25,
            chunks_per_epoch=4 if quick else 40,
            val_streams=8,
            val_chunks=4 if quick else 20,
        )
        model = OnlineRNNModule(
            TanhRNNCell(data.input_size, hidden),
            output_size=data.output_size,
            loss="cross_entropy",
            estimator=estimator,
            estimator_options=options,
            optimizer="adam",
            lr=1e-3,
            clip_gradient_norm=1.0,
        )
        return model, data

    budget = time.strftime("00:%H:%M:%S", time.gmtime(seconds))
    return {name: fit(lambda e=e, o=o: build(e, o), 1000, max_time=budget) for name, (e, o) in estimators.items()}


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("reproduce_uoro_training", __doc__)
    parser.add_argument(
        "--tasks",
        nargs="+",
        choices=["influence", "adding", "characters"],
        default=["influence", "adding", "characters"],
    )
    parser.add_argument("--seconds", type=int, default=180, help="wall time per estimator on the character task")
    args = parse_args(parser, argv)
    reject(
        parser, args, rounds="reproduce_uoro_training trains", device="reproduce_uoro_training trains on the CPU only"
    )
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    if args.quick:
        args.seconds = 5
    rows: list[dict] = []
    runners = {
        "influence": lambda: influence_runs(args.quick),
        "adding": lambda: adding_runs(args.quick),
        "characters": lambda: character_runs(args.quick, args.seconds),
    }
    for task in args.tasks:
        for method, (curve, error) in runners[task]().items():
            for row in curve:
                rows.append({"task": task, "method": method, **row})
            if error:
                rows.append({"task": task, "method": method, "diverged": error, "epoch": len(curve) + 1})
            last = curve[-1] if curve else {}
            print(
                f"{task:10s} {method:32s} {'DIVERGED ' if error else ''}{ {k: round(v, 4) for k, v in last.items()} }",
                flush=True,
            )
    setup = {"tasks": args.tasks, "character_seconds": args.seconds, "seeds": 1}
    path = write_result(
        "reproduce_uoro_training",
        device,
        rows,
        claims(rows),
        args,
        extra={"setup": setup},
    )
    plot(rows, result_path("reproduce_uoro_training", device, args, ".png"))
    print_claims(claims(rows))
    return path


def _last(rows: list[dict], task: str, method: str) -> dict:
    mine = [r for r in rows if r["task"] == task and r["method"] == method]
    return mine[-1] if mine else {}


def claims(rows: list[dict]) -> list[dict]:
    out = []
    tasks = {r["task"] for r in rows}
    if "influence" in tasks:
        uoro = _last(rows, "influence", "UORO")
        gap = abs(uoro.get("theta", math.inf) - THETA_OPTIMUM)
        out.append(
            {
                "claim": "influence balancing: UORO converges (final abs(theta + 1/6) < 0.01)",
                "figure": round(gap, 4),
                "holds": gap < 0.01,
            }
        )
        short = [
            m
            for m in {r["method"] for r in rows if r["task"] == "influence"}
            if m.startswith("TBPTT k=") and int(m.split("=")[1]) <= 10
        ]
        # theta starts at 0, 1/6 from the optimum: a run that ends farther away moved the wrong way.
        away = [
            m
            for m in short
            if "diverged" in _last(rows, "influence", m)
            or abs(_last(rows, "influence", m).get("theta", 0.0) - THETA_OPTIMUM) > abs(THETA_OPTIMUM)
        ]
        out.append(
            {
                "claim": "influence balancing: truncated BPTT with k <= 10 moves away from the optimum (runs whose"
                " theta ends farther from -1/6 than its start 0, or blew up, of those run)",
                "figure": f"{len(away)} of {len(short)}",
                "holds": bool(short) and len(away) == len(short),
            }
        )
    if "adding" in tasks:
        floor = AddingTaskDataModule().loss_floors()["lag_t1_only"]
        for method in ("RTRL", "UORO (state)", "UORO (none, no spatial noise)"):
            loss = _last(rows, "adding", method).get("val_loss", math.inf)
            out.append(
                {
                    "claim": f"adding: {method} uses both lags (validation loss below the x_t-5-only floor {floor:.3f})",
                    "figure": round(loss, 4),
                    "holds": loss < floor,
                }
            )
    if "characters" in tasks:
        bits = {
            m: _last(rows, "characters", m).get("val_bits", math.inf)
            for m in {r["method"] for r in rows if r["task"] == "characters"}
        }
        best = min(bits, key=bits.get)
        uoro = min((m for m in bits if m.startswith("UORO")), key=bits.get)
        out.append(
            {
                "claim": f"characters at equal wall time: the best UORO ({uoro}) is the best estimator (bits/char"
                f" above the best, {best})",
                "figure": round(bits[uoro] - bits[best], 4),
                "holds": uoro == best,
            }
        )
    return out


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        key = "theta" if task == "influence" else ("val_bits" if task == "characters" else "val_loss")
        for method in dict.fromkeys(r["method"] for r in rows if r["task"] == task):
            mine = [r for r in rows if r["task"] == task and r["method"] == method and key in r]
            x = [r["train_seconds"] if task == "characters" else r["epoch"] for r in mine]
            ax.plot(x, [r[key] for r in mine], marker="o", ms=3, label=method)
        if task == "influence":
            ax.axhline(THETA_OPTIMUM, color="grey", lw=0.8)
            ax.set_yscale("symlog", linthresh=0.1)
        ax.set_xlabel("training seconds" if task == "characters" else "epoch")
        ax.set_ylabel(
            {"theta": "theta (optimum -1/6)", "val_bits": "validation bits/char", "val_loss": "validation loss (nats)"}[
                key
            ]
        )
        ax.set_title(task)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
