"""Results-page table of benchmarks/bench_compression_budget.py: ``render(data)`` of its result JSON (the budgeted
compression of a trained CNN and FCNN: test accuracy at each stage, the operations, and per layer what the search
did)."""

from __future__ import annotations

import math

import numpy as np


def groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The rows of each (model, dataset), in the order run (one per seed)."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["model"], row["dataset"]), []).append(row)
    return grouped


def render(data: dict) -> str:
    """The results-page table: per model and dataset, test accuracy at each stage and the operations."""
    lines = [
        f"**{data['hardware']}** ({data['hardware_description']}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}`. Test accuracy (held out from training, search and fine-tuning); operations per sample "
        "(per image for convolutions), additions + multiplications + shifts, biases excluded. Points lost +- their "
        "paired standard error on the test split (the mean's: +- its standard error over the seeds); "
        "compressible layers: those the family can compress, whether the search did or kept them dense.",
        "",
        "| model | data | seed | dense | compressed | fine-tuned | points lost | ops, compressible layers | ratio | "
        "ops, all candidates | ratio | search (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (model, dataset), runs in groups(data["rows"]).items():
        for row in runs:
            acc = row["test_accuracy"]
            ops, every = row["ops_compressible_layers"], row["ops_all_candidates"]
            lines.append(
                f"| {model} | {dataset} | {row['seed']} | {acc['dense']:.4f} | {acc['compressed']:.4f} | "
                f"{acc['finetuned']:.4f} | {row['drop_points_after_finetuning']:.2f} +- "
                f"{row['drop_standard_error']:.2f} | {ops['before']} -> "
                f"{ops['after']} | {row['ops_ratio_compressible_layers']:.2f}x | {every['before']} -> "
                f"{every['after']} | {row['ops_ratio_all_candidates']:.2f}x | {row['search_seconds']:.1f} |"
            )
        if len(runs) > 1:
            mean = lambda key: float(np.mean([row[key] for row in runs]))  # noqa: E731
            drops = [row["drop_points_after_finetuning"] for row in runs]
            spread = float(np.std(drops, ddof=1) / math.sqrt(len(drops)))
            lines.append(
                f"| {model} | {dataset} | **mean** | | | | **{mean('drop_points_after_finetuning'):.2f}** +- "
                f"{spread:.2f} | | **{mean('ops_ratio_compressible_layers'):.2f}x** | | "
                f"{mean('ops_ratio_all_candidates'):.2f}x | |"
            )
    lines += [
        "",
        "Per layer, the first seed of each (s: nonzeros per code row; m: the transform's blocks; errors in percent, "
        "the output error on the validation inputs):",
        "",
    ]
    lines += ["| model | data | layer | type | s | m | ops before | ops after | weight error | output error | note |"]
    lines += ["|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for runs in groups(data["rows"]).values():
        row = runs[0]
        for layer in row["layers"]:
            fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
            note = "compressed" if layer["compressed"] else layer["reason"].split(":")[0]
            lines.append(
                f"| {row['model']} | {row['dataset']} | {layer['name']} | {layer['kind']} | {layer['s'] or '-'} | "
                f"{layer.get('blocks') or '-'} | "
                f"{layer['ops_before']} | {layer['ops_after']} | {fmt(layer['weight_error'])} | "
                f"{fmt(layer['output_error'])} | {note} |"
            )
    return "\n".join(lines)
