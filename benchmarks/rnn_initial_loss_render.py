"""Results-page table of benchmarks/rnn_initial_loss.py: ``render(data)`` of its result JSON (the initial training loss
of the orthogonal RNN under each input scaling)."""

from __future__ import annotations

from benchmarks._render import claims_table


def render(data: dict) -> str:
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` "
        f"(mean over the first {data['setup']['batches']} training batches of {data['setup']['batch_size']}).",
        "",
        "| input scaling | transition | initial training loss | mean ‖h_T‖ | logit std |",
        "|---|---|---:|---:|---:|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['scaling']} | {row['transition']} | {row['initial_loss']:.2f} | {row['final_state_norm']:.1f} "
            f"| {row['logit_std']:.2f} |"
        )
    return "\n".join(lines + claims_table(data["claims"]))
