"""Results-page table of benchmarks/reproduce_uoro.py: ``render(data)`` of its result JSON (UORO's gradient variance
and bias, per estimator and sequence)."""

from __future__ import annotations

import math

from benchmarks._render import claims_table


def render(data: dict) -> str:
    setup = data["setup"]
    rows = [r for r in data["rows"] if "total_variance" in r]
    seeds = sorted({r["seed"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    pick = {(r["method"], r["seed"]): r for r in rows}
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` (tanh RNN, H = "
        f"{setup['hidden']}, T = {setup['steps']}, {setup['draws']:,} independent draws per estimator on each of "
        f"{len(seeds)} sequences; tr Cov(g) of the total gradient estimate; lower is better).",
        "",
        "| estimator | tr Cov(g), sequences "
        + " / ".join(str(s) for s in seeds)
        + " | relative to GIR at the state | section 6 prediction | relative bias (± s.e.) | max abs(z) / critical | ms per step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        mine = [pick[(method, s)] for s in seeds]
        logs = [
            math.log(r["total_variance"] / pick[("GIR, state", s)]["total_variance"])
            for s, r in zip(seeds, mine, strict=True)
        ]
        gain = math.exp(sum(logs) / len(logs))
        predicted = (
            " / ".join(f"{r['predicted_total_variance']:.4g}" for r in mine)
            if "predicted_total_variance" in mine[0]
            else ""
        )
        bias = sum(r["relative_bias"] for r in mine) / len(mine)
        bias_se = sum(r["bias_se"] for r in mine) / len(mine)
        z = max(r["max_z"] / r["critical_z"] for r in mine)
        ms = 1e3 * sum(r["seconds_per_step"] for r in mine) / len(mine)
        lines.append(
            f"| {method} | "
            + " / ".join(f"{r['total_variance']:.4g}" for r in mine)
            + f" | {gain:.3g}x | {predicted} | {bias:.3f} (± {bias_se:.3f}) | {z:.2f} | {ms:.0f} |"
        )
    return "\n".join(lines + claims_table(data["claims"]))
