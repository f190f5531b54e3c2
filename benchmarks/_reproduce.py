"""Shared machinery of the reproduction scripts: train with Lightning, record validation error per epoch
and cumulative training time, aggregate over seeds, plot like the paper's Figures 3 and 4."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import pyplot
from lightning_ortho._lightning import pl


class EpochRecorder(pl.Callback):
    """Validation error (%) after each training epoch and the cumulative training wall time (validation excluded);
    also the training loss of the first ``first_steps`` optimizer steps (how training starts)."""

    def __init__(self, first_steps: int = 20) -> None:
        self.rows: list[dict] = []
        self.first_losses: list[float] = []
        self.first_steps = first_steps
        self._train_seconds = 0.0
        self._start = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if len(self.first_losses) < self.first_steps and outputs is not None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.first_losses.append(float(loss))

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        # Lightning validates at the end of the training epoch, before on_train_epoch_end: stop the clock here.
        if not trainer.sanity_checking:
            self._last_epoch_seconds = time.perf_counter() - self._start
            self._train_seconds += self._last_epoch_seconds

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        metrics = trainer.callback_metrics
        if trainer.sanity_checking or not ({"val_acc", "val_bpd"} & set(metrics)):
            return
        row = {
            "epoch": trainer.current_epoch + 1,
            "train_seconds": self._train_seconds,
            "epoch_seconds": getattr(self, "_last_epoch_seconds", float("nan")),
        }
        if "val_acc" in metrics:
            row["val_error"] = 100.0 * (1.0 - float(metrics["val_acc"]))
            row["val_loss"] = float(metrics["val_loss"])
        if "val_bpd" in metrics:
            row["val_bpd"] = float(metrics["val_bpd"])
        self.rows.append(row)


def scratch_folder() -> tempfile.TemporaryDirectory:
    """Where a run's outputs (logs, image grids of callbacks) go: a temporary folder, never the working tree, removed
    when the ``with`` block ends."""
    return tempfile.TemporaryDirectory(prefix="lightning-ortho-bench-")


def quiet_trainer(epochs: int, recorder: pl.Callback, **trainer_kwargs) -> pl.Trainer:
    """A one-process CPU Trainer for a timed run: no logger, checkpoints, progress bar, summary or sanity check;
    ``recorder`` is its callback."""
    return pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[recorder],
        **trainer_kwargs,
    )


def train_once(
    build: Callable[[], tuple[pl.LightningModule, pl.LightningDataModule]],
    seed: int,
    epochs: int,
    return_model: bool = False,
    **trainer_kwargs,
):
    """Seed, build (model, data), fit for ``epochs``; the per-epoch rows of :class:`EpochRecorder`
    (and the trained model and data module with ``return_model=True``)."""
    pl.seed_everything(seed, verbose=False)
    model, data = build()
    recorder = EpochRecorder()
    with scratch_folder() as scratch:
        trainer_kwargs.setdefault("default_root_dir", scratch)
        quiet_trainer(epochs, recorder, **trainer_kwargs).fit(model, data)
    if recorder.first_losses and recorder.rows:
        recorder.rows[0]["first_step_losses"] = [round(v, 4) for v in recorder.first_losses]
    return (recorder.rows, model, data) if return_model else recorder.rows


def aggregate(rows: list[dict], key: str = "method", metric: str = "val_error") -> dict[str, list[dict]]:
    """Mean and (population) standard deviation of ``metric`` over seeds, per method and epoch.

    Returns ``{method: [{"epoch", "seeds", "metric", "mean", "std", "train_seconds_mean", "epoch_seconds_mean"},
    ...]}`` with ``"metric"`` the name of the row field averaged (``"val_error"`` in %, ``"val_bpd"``). A result
    file's curves are recomputed from its rows with ``aggregate(data["rows"], metric=...)``.
    """
    out: dict[str, list[dict]] = {}
    for method in sorted({r[key] for r in rows}):
        mine = [r for r in rows if r[key] == method]
        curve = []
        for epoch in sorted({r["epoch"] for r in mine}):
            at = [r for r in mine if r["epoch"] == epoch]
            values = [r[metric] for r in at]
            seconds = [r["train_seconds"] for r in at]
            curve.append(
                {
                    "epoch": epoch,
                    "seeds": len(at),
                    "metric": metric,
                    "mean": statistics.fmean(values),
                    "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
                    "train_seconds_mean": statistics.fmean(seconds),
                    "epoch_seconds_mean": statistics.fmean(r["epoch_seconds"] for r in at),
                }
            )
        out[method] = curve
    return out


def final_means(curves: dict[str, list[dict]], metric: str) -> dict[str, float]:
    """The last epoch's mean of every curve; raises ``ValueError`` if a curve averages another metric."""
    wrong = sorted(m for m, c in curves.items() if c[-1].get("metric") != metric)
    if wrong:
        raise ValueError(f"curves {wrong} do not average {metric!r}: recompute them with aggregate(rows, metric=...)")
    return {m: c[-1]["mean"] for m, c in curves.items()}


def plot_curves(
    curves: dict[str, list[dict]],
    path: Path,
    title: str,
    time_axis: bool = True,
    ylabel: str = "validation error (%)",
    log_y: bool = True,
) -> None:
    plt = pyplot()
    if plt is None:
        return
    import matplotlib.ticker

    panels = 2 if time_axis else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    for method, curve in curves.items():
        mean = [c["mean"] for c in curve]
        std = [c["std"] for c in curve]
        low = [m - s for m, s in zip(mean, std, strict=True)]
        high = [m + s for m, s in zip(mean, std, strict=True)]
        xs = [[c["epoch"] for c in curve]] + ([[c["train_seconds_mean"] for c in curve]] if time_axis else [])
        for ax, x in zip(axes[0], xs, strict=True):
            ax.plot(x, mean, marker=".", label=method)
            ax.fill_between(x, low, high, alpha=0.2)
    axes[0][0].set(xlabel="epoch", ylabel=ylabel, title=title)
    if time_axis:
        axes[0][1].set(xlabel="training time (s)", ylabel=ylabel, xscale="log", title=title + " (time)")
    for ax in axes[0]:
        if log_y:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
        # A log time axis spanning a few decades labels its minor ticks too, and they collide: major only.
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
