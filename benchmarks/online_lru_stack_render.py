"""Claims and results-page table of ``python -m benchmarks.online_lru_stack`` (no torch import: the report reads result
files only)."""

from __future__ import annotations

import math

from benchmarks._render import claims_table

#: the copy task counts as learned when the validation recall loss is below this fraction of chance (ln 4), as in
#: benchmarks/online_family.py
LEARNED_FRACTION = 0.5
#: the method labels of the rows
STACK = "LRU stack, online (exact in-layer traces)"
SINGLE_LRU = "LRU, diagonal RTRL"
UORO_TANH = "tanh, UORO (preactivation)"


def _pick(rows: list[dict], method: str) -> dict | None:
    return next((r for r in rows if r["method"] == method), None)


def _loss(row: dict | None) -> float:
    """The validation loss of a row, ``inf`` for a missing row or a run that diverged."""
    if row is None or "diverged" in row:
        return math.inf
    return row.get("val_loss", math.inf)


def claims(rows: list[dict]) -> list[dict]:
    """The claim row, computed from the rows: the stack's measured validation loss against the UORO-trained tanh
    RNN's (read from the committed online_family result). It holds only if both are present, on the same delay,
    the stack's loss is below ``LEARNED_FRACTION`` x chance and the tanh RNN's is not."""
    stack, tanh = _pick(rows, STACK), _pick(rows, UORO_TANH)
    chance = stack["chance_loss"] if stack else math.log(4)
    threshold = LEARNED_FRACTION * chance
    stack_delay = stack["delay"] if stack else None
    tanh_delay = tanh.get("delay") if tanh else None
    stack_loss, tanh_loss = _loss(stack), _loss(tanh)
    same_task = stack_delay is not None and stack_delay == tanh_delay
    figure = (
        f"stack {stack_loss:.3f} nats (delay {stack_delay}) vs tanh UORO {tanh_loss:.3f} nats (delay {tanh_delay},"
        f" online_family-cpu1.json); chance {chance:.3f}, threshold {threshold:.3f}"
    )
    return [
        {
            "claim": f"an LRU stack ({stack['layers'] if stack else '?'} layers) trained online with exact in-layer"
            f" traces learns the {tanh_delay}-step delay copy task (recall loss < {LEARNED_FRACTION} x chance) that a"
            " UORO-trained tanh RNN does not learn (online_family)",
            "figure": figure,
            "holds": bool(same_task and stack_loss < threshold <= tanh_loss),
        }
    ]


def render(data: dict) -> str:
    setup = data["setup"]
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` (copy task: 4 symbols,"
        f" 2 per episode, delay {setup['delay']}, {setup['streams']} streams, the state reset between episodes;"
        f" {setup['update']}; Adam lr {setup['lr']:g}, gradient norm clipped at {setup['clip_gradient_norm']:g};"
        f" {setup['seconds']:g} s of training, then validation on {setup['val_streams']} streams). The rows marked"
        f" online_family are read from {setup['reference_file']}, not rerun.",
        "",
        "| model | trained by | source | parameters | validation recall loss (nats) | updates | ms per step |"
        " training s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        loss = f"diverged ({row['diverged'].split(':')[0]})" if "diverged" in row else f"{row['val_loss']:.4f}"
        lines.append(
            f"| {row['model']} | {row['trained_by']} | {row['source']} | {row['parameters']} | {loss} |"
            f" {row['optimizer_steps']} | {row['ms_per_step']:.2f} | {row['train_seconds']:.1f} |"
        )
    return "\n".join(lines + claims_table(data["claims"]))
