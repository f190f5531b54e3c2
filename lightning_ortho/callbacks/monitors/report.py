"""A monitor's report at the end of fit: a rich table of each statistic's last, smallest and largest value (with the
monitor's notes under it), and a PNG of the history in the logger's directory, also added to TensorBoard as a figure
where a ``TensorBoardLogger`` is in use (rank zero only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_ortho._extras import require
from lightning_ortho._lightning import pl, rank_zero_info, rank_zero_only, rank_zero_warn
from lightning_ortho.callbacks._console import wide_console


def check_plotting(owner: str) -> None:
    """Raise :class:`~lightning_ortho._extras.MissingExtraError` (an ``ImportError``) naming the ``plots`` extra
    (``pip install "lightning-ortho[plots]"``) when matplotlib, needed by ``plot=True``, is not installed."""
    require("matplotlib", f"{owner}(plot=True) draws its history (pass plot=False to do without)")


def report_at_fit_end(monitor: Any, trainer: pl.Trainer) -> None:
    """``monitor``'s table (``verbose``) and figure (``plot``, not under ``fast_dev_run``). Called on every process:
    ``trainer.log_dir`` broadcasts under DDP; only rank zero prints and writes."""
    notes = monitor.notes()
    if not monitor.history and not notes:
        return
    name = type(monitor).__name__
    if monitor.verbose:
        print_table(f"{name} ({len(monitor.history)} measurements)", monitor.summary(), notes)
    if monitor.plot and monitor.history and not trainer.fast_dev_run:
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        save_figure(monitor.history, monitor.prefix, folder / f"{name}.png", trainer, f"{monitor.prefix}/history")


@rank_zero_only
def print_table(
    title: str, summary: dict[str, tuple[float, float, float]], notes: dict[str, str] | None = None
) -> None:
    """Print ``key -> (last, min, max)`` as a rich table as wide as it needs (not cut at the terminal's or a pipe's
    80 columns), then ``notes`` as ``key: text`` lines."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("statistic", "last", "min", "max"):
        table.add_column(column, justify="left" if column == "statistic" else "right", no_wrap=True)
    for key, (last, low, high) in summary.items():
        table.add_row(key, f"{last:.4g}", f"{low:.4g}", f"{high:.4g}")
    console = wide_console(table)
    console.print(table)
    for key, text in (notes or {}).items():
        console.print(f"  {key}: {text}", soft_wrap=True, highlight=False)


def history_figure(history: list[dict[str, Any]], prefix: str) -> Any:
    """A matplotlib ``Figure`` of the records ``{"log_step": int, "values": {"<prefix>/<module>/<statistic>":
    float}}``: one panel per statistic, one line per module, against the step at which the values were logged (what
    the loggers, TensorBoard and CSV, show); ``None`` without values.

    Built with ``matplotlib.figure.Figure`` on an Agg canvas, without pyplot: the user's backend (a notebook's
    inline one, say) and pyplot's list of open figures are left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # One panel per statistic, one line per module: a monitor of 24 layers draws 6 panels, not 144 (which would be
    # slow to draw and hard to read).
    series: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for record in history:
        for key, value in record["values"].items():
            module, _, statistic = key.rpartition("/")
            steps, values = series.setdefault(statistic, {}).setdefault(module, ([], []))
            steps.append(record.get("log_step", record["step"]))  # (a history saved before log_step had step)
            values.append(value)
    if not series:
        return None
    figure = Figure(figsize=(7, 2.2 * len(series)))
    FigureCanvasAgg(figure)  # attaches itself as figure.canvas
    axes = figure.subplots(len(series), 1, squeeze=False)
    for axis, (statistic, lines) in zip(axes[:, 0], series.items(), strict=True):
        for module, (steps, values) in lines.items():
            axis.plot(steps, values, marker=".", label=module.removeprefix(prefix).removeprefix("/") or "model")
        axis.set_title(statistic, fontsize=9)
        if 1 < len(lines) <= 12:
            axis.legend(fontsize=6)
    axes[-1, 0].set_xlabel("logged step (the loggers' step, as in TensorBoard and the CSV)")
    figure.tight_layout()
    return figure


@rank_zero_only
def save_figure(history: list[dict[str, Any]], prefix: str, path: Path, trainer: pl.Trainer, tag: str) -> None:
    """Write the history's figure to ``path`` (a PNG) and add it to every TensorBoard logger (``add_figure``, at the
    last logged step)."""
    figure = history_figure(history, prefix)
    if figure is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    for logger in trainer.loggers:
        experiment = getattr(logger, "experiment", None) if _is_tensorboard(logger) else None
        if experiment is not None and hasattr(experiment, "add_figure"):
            step = history[-1].get("log_step", trainer.global_step)
            experiment.add_figure(tag, figure, global_step=step, close=False)


def _is_tensorboard(logger: object) -> bool:
    return any(cls.__name__ == "TensorBoardLogger" for cls in type(logger).__mro__)


def warn_unmeasured(monitor: Any, trainer: pl.Trainer) -> None:
    """One warning (at info level for a fit that was only too short, where ``monitor.short_fit_is_info``) when
    this fit trained but a watched module of ``monitor`` (or every one) got no value, with each reason."""
    if trainer.global_step == monitor._fit_start_step or (not monitor._watched and monitor.skipped):
        return  # nothing trained, or the first forwards already warned that no module was left
    missing = [n for n in monitor._watched if n not in monitor._measured and not monitor.nothing_to_log(n)]
    if not missing:
        return
    owner = type(monitor).__name__
    reasons = "; ".join(
        f"{repr(name) if name else 'the whole model'}: {monitor.unmeasured_reason(name, trainer)}" for name in missing
    )
    what = "measured nothing" if not monitor._measured else f"never measured {len(missing)} of its modules"
    message = f"{owner} {what} in this fit ({trainer.global_step - monitor._fit_start_step} steps): {reasons}."
    if monitor.short_fit_is_info and all(monitor.fit_too_short(name, trainer) for name in missing):
        rank_zero_info(message)
    else:
        rank_zero_warn(message)
