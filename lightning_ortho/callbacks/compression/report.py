"""What TransformCompression prints at the end of fit: the table of the compressed layers under the metric's change."""

from __future__ import annotations

from lightning_ortho._lightning import rank_zero_only
from lightning_ortho.callbacks._console import wide_console


@rank_zero_only
def print_report(
    report: list[dict],
    metric_name: str | None,
    before: float | None,
    after: float | None,
    finetuned: float | None = None,
    kept_dense: list[dict] | None = None,
) -> None:
    """A rich table of the compressed layers (sizes, codes, blocks, error, operations), then the layers kept dense
    (``kept_dense``: ``{"module", "type", "reason", "ops"}``) with the reason; its title is the metric of the model
    before compression, after it and after the fine-tuning that followed (``metric_name=None``: there is no metric,
    the error % says it all)."""
    from rich.table import Table

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    if metric_name is None:
        title = "TransformCompression (no metric: the error % is the weights' relative error)"
    else:
        title = f"TransformCompression ({metric_name}: {fmt(before)} before -> {fmt(after)} compressed"
        title += f" -> {fmt(finetuned)} fine-tuned)" if finetuned is not None else ")"
    table = Table(title=title)
    columns = ("module", "type", "in -> out", "s", "blocks", "error %", "ops before", "ops after", "ratio", "note")
    for column in columns:
        table.add_column(column, justify="left" if column in ("module", "type", "note") else "right")
    for row in report:
        ops = lambda k: row[f"{k}_additions"] + row[f"{k}_multiplications"] + row[f"{k}_shifts"]  # noqa: E731
        table.add_row(
            row["module"],
            row["type"],
            f"{row['in_features']} -> {row['out_features']}",
            str(row["s"]),
            str(row["blocks"]),
            f"{row['error']:.2f}",
            str(ops("dense_ops")),
            str(ops("factorized_ops")),
            f"{row['ops_ratio']:.3f}",
            "compressed",
        )
    for row in kept_dense or []:
        ops = str(row["ops"])
        table.add_row(
            row["module"], row["type"], "-", "-", "-", "-", ops, ops, "1.000", f"stays dense: {row['reason']}"
        )
    wide_console(table).print(table)  # not cut at 80 columns in a log file
