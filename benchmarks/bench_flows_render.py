"""Results-page table of benchmarks/bench_flows.py: ``render(data)`` of its result JSON (one invertible 1x1 convolution
of each kind: forward + log-det, backward, inverse and its Newton iterations)."""

from __future__ import annotations

from benchmarks._render import claims_table


def render(data: dict) -> str:
    lines = [
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}`. One 1x1 convolution on 32 images of 16x16 pixels (best of 5 interleaved rounds; "
        f"allocator: {data.get('allocator', 'default')}).",
        "",
        "| c | kind | forward + log-det (ms) | backward (ms) | forward + backward vs LU | inverse (ms) "
        "| Newton iterations mean / max | failed pixels |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        newton = (
            f"{row['newton_iterations_mean']:.1f} / {row['newton_iterations_max']}" if "newton_failures" in row else ""
        )
        inverse = f"{row['inverse_ms']:.2f}" if "inverse_ms" in row else ""
        lines.append(
            f"| {row['channels']} | {row['kind']} | {row['forward_logdet_ms']:.2f} | {row['backward_ms']:.2f} "
            f"| {row['step_vs_lu']:.1f}x | {inverse} "
            f"| {newton} | {row.get('newton_failures', '')} |"
        )
    return "\n".join(lines + claims_table(data["claims"]))
