"""Results-page table of benchmarks/bench_small.py: ``render(data)`` of its result JSON, and the figure and
details of one row (``measured``, ``details``), which benchmarks/gpu_suite.py's table shares."""

from __future__ import annotations

from benchmarks._render import claims_table


def measured(row: dict) -> str:
    """A row's figure as the table shows it (``1.23x``, ``4.5 s``), or why it was skipped."""
    if row["figure"] is None:
        return f"skipped: {row['skipped']}" if "skipped" in row else ""
    return f"{row['figure']:.1f} s" if row["unit"] == "s" else f"{row['figure']:.2f}{row['unit']}"


def details(row: dict) -> str:
    """The times behind a row's figure, in the words of its section."""
    section = row["section"]
    if section in ("aux_linear", "orthogonal_rnn"):
        a, b = ("aux", "linear") if section == "aux_linear" else ("aux", "cayley")
        return f"{row[f'{a}_ms']:.3g} / {row[f'{b}_ms']:.3g} ms; best rounds {row['ratio_of_best']:.2f}x"
    if section.startswith("uoro_bptt"):
        text = (
            f"{row['uoro_ms_per_step']:.3g} / {row['bptt_ms_per_step']:.3g} ms per step; "
            f"best rounds {row['ratio_of_best']:.2f}x"
        )
        if "estimator_over_bptt" in row:  # the breakdown: the rest is the readout step and accumulating
            text += (
                f"; the estimator's own step + gradient {row['estimator_ms_per_step']:.3g} ms "
                f"({row['estimator_over_bptt']:.2f}x BPTT)"
            )
        return text
    if section == "online_recipe":
        return (
            f"{row['default_threads_s']:.2f} s at {row['default_threads']} threads / {row['one_thread_s']:.2f} s at 1, "
            f"{row['spinners']} spinning process(es)"
        )
    if section == "uoro_bandwidth":
        return (
            f"{row['step_gb_per_s']:.2f} / {row['copy_gb_per_s']:.2f} GB/s ({row['w_tilde_mb']:.1f} MB w_tilde, "
            f"step {row['step_ms']:.3g} ms)"
        )
    return ""


def render(data: dict) -> str:
    """The results-page table: one line per row (what, measured figure, goal, holds, the times behind it)."""
    lines = [
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}` ({data.get('total_seconds', '?')} s). Ratios: median over interleaved rounds of each "
        "round's ratio.",
        "",
        "| what | measured | goal | holds | details |",
        "|---|---:|---|:---:|---|",
    ]
    for row in data["rows"]:
        holds = "" if row["holds"] is None else "yes" if row["holds"] else "**no**"
        lines.append(f"| {row['what']} | {measured(row)} | {row['goal'] or ''} | {holds} | {details(row)} |")
    return "\n".join(lines + claims_table(data["claims"]))
