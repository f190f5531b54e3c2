"""Results-page table of benchmarks/reproduce_rnn.py: ``render(data)`` of its result JSON (the orthogonal RNN
reproduction (final validation error, seconds per epoch, claims), or for a tagged timing run the seconds per training
epoch of each transition)."""

from __future__ import annotations

from benchmarks._render import render_reproduction

#: the auxiliary-reflection transition's label, which the timing table compares the others with
AUX = "aux (1 auxiliary reflection)"


def render(data: dict) -> str:
    """The results-page table of a result: the reproduction's (final validation error, seconds per epoch, claims), or
    for a tagged timing run the seconds per training epoch of each transition."""
    if "tag" not in data:
        return render_reproduction(data)
    setup = ", ".join(f"{k} {v}" for k, v in data.get("setup", {}).items())
    lines = [
        f"Time per epoch (timing run `{data['tag']}`): **{data['hardware']}**, torch {data['torch']}, {data['date']}: "
        f"`{data['command']}` ({setup}). Seconds per training epoch, validation excluded: the mean over seeds and "
        "epochs, and the fastest epoch.",
        "",
        "| transition | seeds x epochs | seconds per epoch, mean | fastest | mean vs aux |",
        "|---|---:|---:|---:|---:|",
    ]
    by_method: dict[str, list[float]] = {}
    for row in data["rows"]:
        by_method.setdefault(row["method"], []).append(row["epoch_seconds"])
    aux = by_method.get(AUX)
    for method, seconds in by_method.items():
        mean = sum(seconds) / len(seconds)
        ratio = f"{mean / (sum(aux) / len(aux)):.2f}x" if aux else ""
        seeds = len({r["seed"] for r in data["rows"] if r["method"] == method})
        lines.append(f"| {method} | {seeds} x {len(seconds) // seeds} | {mean:.3g} | {min(seconds):.3g} | {ratio} |")
    return "\n".join(lines)
