"""Results-page table of benchmarks/bench_orthogonal_weights.py: ``render(data)`` of its result JSON (milliseconds per
training step of an orthogonal weight, ours beside torch's and geotorch's maps, per shape)."""

from __future__ import annotations

#: the table's columns: every implementation benchmarks/bench_orthogonal_weights.py times, in its order (ours, torch's,
#: geotorch's; tests/benchmarks/test_bench_orthogonal_weights.py holds the two in step)
COLUMNS = (
    "ours householder",
    "ours cayley",
    "ours matrix_exp",
    "torch householder",
    "torch cayley",
    "torch matrix_exp",
    "geotorch expm",
    "geotorch cayley",
)


def render(data: dict) -> str:
    """The results-page table: milliseconds per step of every implementation, per shape."""
    rows = data["rows"]
    names = COLUMNS
    lines = [
        f"**{data['hardware']}** ({data['hardware_description']}), torch {data['torch']}, {data['date']}:"
        f" `{data['command']}`. Milliseconds per training step (the weight, `(W * G).sum()`, backward), median of"
        f" interleaved rounds; ratio: ours (its fastest map) over the fastest peer.",
        "",
        "| shape | " + " | ".join(names) + " | ours / fastest peer |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for row in rows:
        cells = []
        for name in names:
            if name in row["seconds"]:
                cells.append(f"{1e3 * row['seconds'][name]:.3g}")
            else:
                cells.append("not run")
        ratio = f"{row['ratio']:.2f}x ({row['fastest_peer']})" if "ratio" in row else "no peer runs"
        lines.append(f"| {row['shape']} | " + " | ".join(cells) + f" | {ratio} |")
    once = sorted({f"{name} ({row['shape']})" for row in rows for name in row.get("timed_once", [])})
    if once:
        lines += ["", "Timed once (one step takes seconds to minutes): " + ", ".join(once) + "."]
    reasons = sorted({f"{name}: {reason}" for row in rows for name, reason in row["not_run"].items()})
    if reasons:
        lines += ["", "Not run: " + "; ".join(reasons) + "."]
    return "\n".join(lines)
