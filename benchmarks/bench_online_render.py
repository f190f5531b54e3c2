"""Results-page tables of benchmarks/bench_online.py (time per step and peak memory of the online estimators):
``render(data)`` of its result JSON (``python -m benchmarks.report`` finds it by the script's name)."""

from __future__ import annotations

from benchmarks._render import claims_table


def _online_label(row: dict) -> str:
    method = row["method"]
    if method == "uoro":
        return f"UORO ({row['projection']})"
    if method == "tbptt":
        return f"TruncatedBPTT (k={row['k']})"
    return {"forward": "forward step (no_grad)", "bptt": "BPTT (full)", "rtrl": "RTRL"}.get(method, method)


def _megabytes(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def render(data: dict) -> str:
    setup = data.get("setup", {})
    timing = [r for r in data["rows"] if r["section"] == "time"]
    memory = [r for r in data["rows"] if r["section"] == "memory"]
    labels = list(dict.fromkeys(_online_label(r) for r in data["rows"]))
    hiddens = sorted({r["H"] for r in timing})
    time_index = {(_online_label(r), r["H"]): r for r in timing}
    lines = [
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}` ({data.get('total_seconds', '?')} s). {setup.get('cell', 'TanhRNNCell')} with "
        f"{setup.get('readout', 'a readout')}, B = {setup.get('B', '?')} streams. Time per step: best of "
        f"{setup.get('timing_rounds', '?')} interleaved rounds, and in brackets the multiple of a forward step "
        "(`cell(x, h)` under `no_grad`).",
        "",
        "| method | " + " | ".join(f"H = {h}" for h in hiddens) + " |",
        "|---|" + "---:|" * len(hiddens),
    ]
    for name in labels:
        cells = []
        for hidden in hiddens:
            row = time_index.get((name, hidden))
            if row is None:
                cells.append("")
            elif "skipped" in row:
                cells.append("skipped")
            else:
                ratio = f" ({row['ratio_to_forward_step']:.1f}x)" if name != "forward step (no_grad)" else ""
                cells.append(f"{row['time_per_step_ms']:.3g} ms{ratio}")
        if any(cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lengths = sorted({r["T"] for r in memory})
    if memory:
        lines += [
            "",
            "Peak memory of a run of T steps above the process's resident set before it, in brackets the bytes still "
            f"allocated at its end (MB; {data.get('memory_method', 'peak RSS')}), and the size of the estimator's "
            "state after the run:",
            "",
            "| H | method | " + " | ".join(f"T = {t}" for t in lengths) + " | state (MB) |",
            "|---:|---|" + "---:|" * (len(lengths) + 1),
        ]
        memory_index = {(r["H"], _online_label(r), r["T"]): r for r in memory}
        for hidden in sorted({r["H"] for r in memory}):
            for name in labels:
                rows = [memory_index.get((hidden, name, t)) for t in lengths]
                if not any(rows):
                    continue
                cells = [
                    ""
                    if r is None
                    else "skipped"
                    if "skipped" in r
                    else _megabytes(r["peak_memory_mb"])
                    + (f" ({_megabytes(max(r['in_use_mb'], 0.0))})" if "in_use_mb" in r else "")
                    for r in rows
                ]
                states = [r["state_mb"] for r in rows if r and r.get("state_mb") is not None]
                lines.append(
                    f"| {hidden} | {name} | " + " | ".join(cells) + f" | {_megabytes(states[-1]) if states else ''} |"
                )
    skipped: dict[tuple[str, int, str], list] = {}
    for row in timing + memory:
        if "skipped" in row:
            where = row.get("T") if row["section"] == "memory" else "time"
            skipped.setdefault((_online_label(row), row["H"], row["skipped"]), []).append(where)
    if skipped:
        lines += ["", "Skipped:"]
        for (name, hidden, reason), where in skipped.items():
            when = "timing and every T" if "time" in where else "T = " + ", ".join(str(t) for t in where)
            lines.append(f"- {name} at H = {hidden} ({when}): {reason}.")
    return "\n".join(lines + claims_table(data["claims"]))
