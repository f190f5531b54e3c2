"""Results-page table of benchmarks/reproduce_uoro_training.py: ``render(data)`` of its result JSON (online training
with each estimator: the final figure of each task)."""

from __future__ import annotations

from benchmarks._render import claims_table


def render(data: dict) -> str:
    rows = data["rows"]
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` (one seed; the "
        f"character task gives every estimator {data['setup']['character_seconds']} s of training).",
        "",
        "| task | estimator | final | epochs | training seconds |",
        "|---|---|---:|---:|---:|",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows if r["task"] == task):
            mine = [r for r in rows if r["task"] == task and r["method"] == method and "train_seconds" in r]
            blew = [r for r in rows if r["task"] == task and r["method"] == method and "diverged" in r]
            last = mine[-1] if mine else {}
            if task == "influence":
                final = f"theta {last['theta']:.4g}, train loss {last['train_loss']:.3g}" if last else ""
            elif task == "characters":
                final = f"{last['val_bits']:.3f} bits/char" if last else ""
            else:
                final = f"val loss {last['val_loss']:.4f} nats" if last else ""
            if blew:
                final += f" (stopped: {blew[0]['diverged'].split(':')[0]})"
            seconds = f"{last['train_seconds']:.0f}" if last else ""
            lines.append(f"| {task} | {method} | {final} | {last.get('epoch', '')} | {seconds} |")
    return "\n".join(lines + claims_table(data["claims"]))
