"""A monitor's report at the end of fit: a rich table of each statistic's last, smallest and largest value, and a PNG
of the history (rank zero only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_ortho._lightning import rank_zero_only


@rank_zero_only
def print_table(title: str, summary: dict[str, tuple[float, float, float]]) -> None:
    """Print ``key -> (last, min, max)`` as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("statistic", "last", "min", "max"):
        table.add_column(column, justify="left" if column == "statistic" else "right")
    for key, (last, low, high) in summary.items():
        table.add_row(key, f"{last:.4g}", f"{low:.4g}", f"{high:.4g}")
    Console().print(table)


@rank_zero_only
def plot_history(history: list[dict[str, Any]], prefix: str, path: Path) -> None:
    """Write ``path`` (a PNG): one panel per statistic, one line per module, of the records ``{"step": int,
    "values": {"<prefix>/<module>/<statistic>": float}}``; nothing when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    # One panel per statistic, one line per module: a monitor of 24 layers draws 6 panels, not 144 (13 s).
    series: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for record in history:
        for key, value in record["values"].items():
            module, _, statistic = key.rpartition("/")
            steps, values = series.setdefault(statistic, {}).setdefault(module, ([], []))
            steps.append(record["step"])
            values.append(value)
    if not series:
        return
    figure, axes = plt.subplots(len(series), 1, figsize=(7, 2.2 * len(series)), squeeze=False)
    for axis, (statistic, lines) in zip(axes[:, 0], series.items(), strict=True):
        for module, (steps, values) in lines.items():
            axis.plot(steps, values, marker=".", label=module.removeprefix(f"{prefix}/"))
        axis.set_title(statistic, fontsize=9)
        if 1 < len(lines) <= 12:
            axis.legend(fontsize=6)
    axes[-1, 0].set_xlabel("global step")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
