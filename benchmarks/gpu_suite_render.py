"""Results-page section of benchmarks/gpu_suite.py: ``render(data)`` of a suite run's JSON: the sections' statuses,
then each section's table (bench_small's rows and bench_orthogonal's grid in their own tables' words)."""

from __future__ import annotations

from benchmarks import bench_orthogonal_render as orthogonal_table
from benchmarks import bench_small_render as small_table


def _online_cell(row: dict | None) -> str:
    if row is None:
        return ""
    if "ms_per_step" in row:
        memory = f" ({row['peak_memory_mb']:.0f} MB)" if row.get("peak_memory_mb") is not None else ""
        return f"{row['ms_per_step']:.3g}{memory}"
    if "failed" in row:
        return "failed"
    return "skipped (" + str(row.get("skipped", "")).split(":")[0] + ")"


def render(data: dict) -> str:
    """The results-page section of a suite run: the sections' statuses, then each section's table."""
    sections = data["sections"]
    lines = [
        f"**{data['device_name']}**, torch {data['torch']}"
        + (f" (CUDA {data['cuda']})" if data.get("cuda") else "")
        + f", {data['date']}: `{data['command']}` ({data['total_seconds']} s of a {data['budget_s']:g} s budget).",
        "",
        "| section | status | seconds |",
        "|---|---|---:|",
    ]
    for name, result in sections.items():
        lines.append(f"| {name} | {result['status']} | {result.get('seconds', 0):.1f} |")
    small = sections.get("small", {})
    if small.get("rows"):
        lines += ["", "| what | measured | goal (CPU) | details |", "|---|---:|---|---|"]
        for row in small["rows"]:
            if "what" not in row:
                lines.append(f"| {row['section']} | skipped: {row['skipped']} | | |")
                continue
            lines.append(
                f"| {row['what']} | {small_table.measured(row)} | {row['goal'] or ''} | {small_table.details(row)} |"
            )
    orthogonal = sections.get("orthogonal", {})
    if orthogonal.get("rows"):
        spent = [r for r in orthogonal["rows"] if str(r.get("skipped", "")).startswith("budget")]
        measured = [r for r in orthogonal["rows"] if r not in spent]
        if measured:
            lines += ["", orthogonal_table.render({**data, **orthogonal, "rows": measured})]
        skipped = [
            f"(d, B) = ({d}, {b})" for d, b in sorted({(r["d"], r["batch"]) for r in spent if "section" not in r})
        ]
        skipped += ["the FCNN epochs"] if any("section" in r for r in spent) else []
        if skipped:
            lines += ["", "Skipped for the budget: " + ", ".join(skipped) + "."]
    online = sections.get("online_steps", {})
    if online.get("rows"):
        rows = online["rows"]
        streams = sorted({r["B"] for r in rows})
        index = {(r["estimator"], r["H"], r["B"]): r for r in rows}
        lines += [
            "",
            "Online steps, milliseconds per step + gradient (median of rounds; CUDA: peak memory in MB):",
            "",
            "| estimator | H | " + " | ".join(f"B = {b}" for b in streams) + " |",
            "|---|---:|" + "---:|" * len(streams),
        ]
        labels = {r["estimator"]: r["label"] for r in rows}
        for key in labels:
            for hidden in sorted({r["H"] for r in rows if r["estimator"] == key}):
                cells = [_online_cell(index.get((key, hidden, b))) for b in streams]
                lines.append(f"| {labels[key]} | {hidden} | " + " | ".join(cells) + " |")
    compiled = sections.get("compiled_chunk", {})
    if "compiled_over_eager" in compiled:
        lines += [
            "",
            f"Compiled chunk: {compiled['compiled']['ms_per_step']:.3g} ms per time step against "
            f"{compiled['eager']['ms_per_step']:.3g} eager ({compiled['compiled_over_eager']:.2f}x; the first, "
            f"compiling chunk {compiled['compiled']['first_chunk_s']:.1f} s); parameters after the fit differ by "
            f"{compiled['max_abs_parameter_difference']:.2g} at most; graph breaks: "
            f"{compiled['compiled'].get('graph_breaks')}.",
        ]
    ddp = sections.get("ddp", {})
    if "ms_per_step" in ddp:
        lines += [
            "",
            f"DDP ({ddp['backend']}, 2 processes, {ddp['recipe']}): {ddp['ms_per_step']:.3g} ms per time step (the "
            f"slower rank); both ranks finished: {ddp['both_ranks_finished']}; parameters equal across ranks: "
            f"{ddp.get('parameters_equal_across_ranks')}.",
        ]
    return "\n".join(lines)
