"""Render the README's benchmark tables from benchmarks/results/*.json.

    python benchmarks/report.py            # rewrite the marked sections of README.md
    python benchmarks/report.py --print    # print the markdown instead

    python benchmarks/report.py --check    # exit 1 if README.md is not what the results render to

A section is delimited by ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` where NAME is the benchmark.
Files ending in ``-quick.json`` (smoke runs) are ignored. Every benchmark with results needs its markers in the
README, and every pair of markers needs results: otherwise :class:`ReportError` says which, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"


class ReportError(ValueError):
    """The results and the README's markers do not match, or a result file cannot be rendered."""


ORTHOGONAL_COLUMNS = ("aux", "householder_wy", "householder_sequential", "torch_householder", "cayley", "matrix_exp")


def claims_table(claims: list[dict]) -> list[str]:
    """The markdown lines of a result's claims (preceded by a blank line): claim, measured figure, holds."""
    lines = ["", "| claim | measured | holds |", "|---|---:|:---:|"]
    for claim in claims:
        lines.append(f"| {claim['claim']} | {claim['figure']} | {'yes' if claim['holds'] else '**no**'} |")
    return lines


def _fmt_ratio(row: dict | None) -> str:
    if row is None:
        return ""
    if "skipped" in row:
        return "skipped"
    return f"{row['both_ratio_to_linear']:.2f}x"


def render_bench_orthogonal(data: dict) -> str:
    rows = [r for r in data["rows"] if "section" not in r]  # the single maps; FCNN epochs have "section"
    index = {(r["d"], r["batch"], r["method"]): r for r in rows}
    keys = sorted({(r["d"], r["batch"]) for r in rows})
    labels = {"geotorch": "geotorch (expm, default)", "geotorch_cayley": "geotorch (cayley)"}
    present = {r["method"] for r in rows}
    columns = [m for m in (*ORTHOGONAL_COLUMNS, *labels) if m in present]
    lines = [
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}`. Forward+backward time of nn.Linear, and of each map as a multiple of it "
        "(best of interleaved rounds; lower is better).",
        "",
        "| d | B | nn.Linear | " + " | ".join(labels.get(m, m) for m in columns) + " |",
        "|---:|---:|---:|" + "---:|" * len(columns),
    ]
    for d, b in keys:
        linear = index.get((d, b, "linear"))
        cells = [f"{linear['both_ms']:.2f} ms" if linear else ""]
        cells += [_fmt_ratio(index.get((d, b, m))) for m in columns]
        lines.append(f"| {d} | {b} | " + " | ".join(cells) + " |")
    skipped = sorted({r["skipped"] for r in rows if "skipped" in r})
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    peer = data.get("peers", {}).get("geotorch")
    if peer:
        triv = peer.get("triv", {})
        lines += [
            "",
            f"geotorch: `{peer['requirement']}` "
            + ("(installed into benchmarks/.peers for this benchmark only)" if "version" in peer else "(not available)")
            + ', `geotorch.orthogonal(nn.Linear(d, d, bias=False), "weight", triv=...)`: '
            + ", ".join(f"{labels.get(m, m)} is `triv={t!r}`" for m, t in triv.items())
            + ".",
        ]
    fcnn = [r for r in data["rows"] if r.get("section") == "fcnn_epoch"]
    if fcnn:
        setup = data.get("fcnn", {})
        lines += [
            "",
            f"One training epoch of the paper's FCNN ({setup.get('model', 'SVD layers')}; d = {fcnn[0]['d']}, "
            f"{fcnn[0]['images']} images, batch {fcnn[0]['batch']}, {setup.get('optimizer', 'Adam')}; data: "
            f"{setup.get('data', 'unknown')}) with U and V of each kind: best of interleaved epochs.",
            "",
            "| U, V | seconds per epoch | vs aux | epochs | training loss, first -> last epoch |",
            "|---|---:|---:|---:|---|",
        ]
        for r in fcnn:
            label = labels.get(r["method"], r["method"])
            if "skipped" in r:
                lines.append(f"| {label} | skipped | | | |")
                continue
            ratio = f"{r['epoch_ratio_to_aux']:.2f}x" if "epoch_ratio_to_aux" in r else ""
            loss = f"{r['train_loss_first_epoch']:.3f} -> {r['train_loss_last_epoch']:.3f}"
            lines.append(f"| {label} | {r['epoch_s']:.3f} | {ratio} | {r['rounds']} | {loss} |")
        fcnn_skipped = sorted({r["skipped"] for r in fcnn if "skipped" in r})
        if fcnn_skipped:
            lines += ["", "Skipped: " + "; ".join(fcnn_skipped) + "."]
    return "\n".join(lines + claims_table(data["claims"]))


#: metric of a reproduction's curves -> (column label, decimals)
METRICS = {"val_error": ("validation error (%)", 2), "val_bpd": ("validation bits/dim", 3)}


def _curves_metric(curves: dict[str, list[dict]]) -> str:
    """The one metric all curves average (``aggregate``'s ``"metric"`` field)."""
    points = [point for curve in curves.values() for point in curve]
    if not points or any("mean" not in p or "metric" not in p for p in points):
        raise ReportError(
            "curves lack the metric/mean/std keys (old val_error_* curves?): recompute them from the rows with "
            "benchmarks/_reproduce.py's aggregate(data['rows'], metric=...)"
        )
    metrics = {p["metric"] for p in points}
    if len(metrics) != 1 or not metrics <= set(METRICS):
        raise ReportError(f"curves average {sorted(metrics)}; expected one of {sorted(METRICS)}")
    return metrics.pop()


def render_reproduction(data: dict) -> str:
    setup = data.get("setup", {})
    setup_text = ", ".join(f"{k} {v}" for k, v in setup.items())
    metric = _curves_metric(data["curves"])
    label, digits = METRICS[metric]
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` ({setup_text}).",
        "",
        f"| run | final {label} | mean over seeds of the best epoch | seconds per training epoch |",
        "|---|---:|---:|---:|",
    ]
    for method, curve in sorted(data["curves"].items(), key=lambda kv: kv[1][-1]["mean"]):
        final = curve[-1]
        best = [
            min(r[metric] for r in data["rows"] if r["method"] == method and r["seed"] == s)
            for s in sorted({r["seed"] for r in data["rows"] if r["method"] == method})
        ]
        per_epoch = sum(c["epoch_seconds_mean"] for c in curve) / len(curve)
        lines.append(
            f"| {method} | {final['mean']:.{digits}f} ± {final['std']:.{digits}f} ({final['seeds']} seeds) "
            f"| {sum(best) / len(best):.{digits}f} | {per_epoch:.2f} |"
        )
    if data.get("inversions"):
        lines += [
            "",
            "| kind | seeds whose validation set reconstructs (max error < 1e-3, Newton converged) | pixels with minority Jacobian sign (worst layer, mean over seeds) |",
            "|---|---:|---:|",
        ]
        for kind in sorted({i["method"] for i in data["inversions"]}):
            mine = [i for i in data["inversions"] if i["method"] == kind]
            good = sum(1 for i in mine if not i["newton_failures"] and i["reconstruction_max_error"] <= 1e-3)
            flips = sum(i["jacobian_sign_flips"] for i in mine) / len(mine)
            lines.append(f"| {kind} | {good} of {len(mine)} | {100 * flips:.2f}% |")
    if not data["claims"]:
        return "\n".join(lines)
    return "\n".join(lines + claims_table(data["claims"]))


def render_bench_flows(data: dict) -> str:
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


def render_rnn_initial_loss(data: dict) -> str:
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


def render_reproduce_uoro(data: dict) -> str:
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


def _online_label(row: dict) -> str:
    method = row["method"]
    if method == "uoro":
        return f"UORO ({row['projection']})"
    if method == "tbptt":
        return f"TruncatedBPTT (k={row['k']})"
    return {"forward": "forward step (no_grad)", "bptt": "BPTT (full)", "rtrl": "RTRL"}.get(method, method)


def _megabytes(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def render_bench_online(data: dict) -> str:
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


def render_reproduce_uoro_training(data: dict) -> str:
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


def render_reproduce_transforms(data: dict) -> str:
    setup = data["setup"]
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` "
        f"({data.get('total_seconds', '?')} s; {setup['patches']:,} patches, n = {setup['n']}, s = {setup['s']}; "
        "error = 100 ||Y - X D^T||^2 / ||Y||^2; operations of one transform of one patch).",
        "",
        "| transform | codes | error (%) | additions | multiplications | shifts | total | seconds to learn |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        seconds = f"{row['seconds']:.1f}" if row.get("seconds") else ""
        lines.append(
            f"| {row['label']} | {row['coding']} | {row['error']:.2f} | {row['additions']} | {row['multiplications']} "
            f"| {row['shifts']} | {row['total_ops']} | {seconds} |"
        )
    peer = data.get("peers", {}).get("pyfaust", {})
    if peer:
        status = f"version {peer['version']}" if "version" in peer else f"not available: {peer.get('error', '?')}"
        note = f" {peer['note']}." if peer.get("note") else ""
        lines += ["", f"FAµST: `{peer.get('requirement', 'pyfaust')}` ({status}).{note}"]
    return "\n".join(lines + claims_table(data["claims"]))


#: method of bench_transforms' apply rows -> column label
TRANSFORM_APPLY_COLUMNS = {
    "b_fft": "B, FFT-like",
    "m_q8": "M-like, q = 8",
    "b_fft_autograd": "B, FFT-like, autograd recording",
}


def _op_split(ops: dict) -> str:
    return f"{ops['total']:,} ({ops['additions']:,} / {ops['multiplications']:,} / {ops['shifts']:,})"


def render_bench_transforms(data: dict) -> str:
    rows = data["rows"]
    lines = [
        "Reproduce: `python benchmarks/bench_transforms.py`",
        "",
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}` ({data.get('total_seconds', '?')} s; load average "
        f"{' / '.join(str(v) for v in data.get('load_average', {}).get('start', []))} at the start).",
    ]
    learned = [r for r in rows if r["section"] == "learn"]
    if learned:
        setup = data.get("learn", {})
        names = {
            "b": "B_m-DLA",
            "m": "M_q-DLA",
            "shear": "S-DLA",
            "identity": "no transform (identity)",
            "dct": "2-D DCT-II",
            "pca": "PCA (dense)",
        }
        lines += [
            "",
            f"Learning at n = {learned[0]['n']} on {learned[0]['patches']:,} patches, s = {learned[0]['s']} "
            f"({setup.get('threads', '?')} thread; best of {learned[0].get('rounds', 1)} runs): seconds and the "
            "error reached, 100 ||Y - X D^T||^2 / ||Y||^2, with the fixed bases under the same coding.",
            "",
            "| transform | blocks (live) | layers | seconds | error (%) | operations per patch: total (add / mul / shift) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in learned:
            name = (
                f"{names.get(r['family'], r['family'])} {r['label']}"
                if "seconds" in r
                else names.get(r["family"], r["family"])
            )
            if "seconds" not in r:
                lines.append(f"| {name} | | | | {r['error']:.2f} | |")
                continue
            blocks = f"{r['blocks']} ({r['live_blocks']})" if "live_blocks" in r else str(r["blocks"])
            lines.append(
                f"| {name} | {blocks} | {r['layers']} | {r['seconds']:.2f} | {r['error']:.2f} "
                f"| {_op_split(r['transform_ops'])} |"
            )
    applied = [r for r in rows if r["section"] == "apply"]
    if applied:
        setup = data.get("apply", {})
        index = {(r["n"], r["threads"], r["method"]): r for r in applied}
        methods = [m for m in TRANSFORM_APPLY_COLUMNS if any(r["method"] == m for r in applied)]
        lines += [
            "",
            f"Applying to a batch of {applied[0]['batch']} float32 rows, forward under `torch.no_grad` (the last "
            "column records autograd): median ms over "
            f"{setup.get('rounds', '?')} interleaved rounds, and in brackets the speed-up over nn.Linear (above 1: "
            "faster). Operations per row: nn.Linear n^2 + n(n - 1); the B product 4 per block.",
            "",
            "| n | threads | nn.Linear | "
            + " | ".join(TRANSFORM_APPLY_COLUMNS[m] for m in methods)
            + " | B blocks / layers |",
            "|---:|---:|---:|" + "---:|" * len(methods) + "---:|",
        ]
        for n, threads in sorted({(r["n"], r["threads"]) for r in applied}, key=lambda k: (k[1], k[0])):
            linear = index.get((n, threads, "linear"))
            cells = [f"{linear['forward_ms']:.2f}" if linear else ""]
            for method in methods:
                r = index.get((n, threads, method))
                cells.append(f"{r['forward_ms']:.2f} ({r['speedup_vs_linear']:.2f}x)" if r else "")
            b = index.get((n, threads, "b_fft"))
            structure = f"{b['blocks']:,} / {b['layers']}" if b else ""
            lines.append(f"| {n} | {threads} | " + " | ".join(cells) + f" | {structure} |")
    compressed = [r for r in rows if r["section"] == "compress"]
    if compressed:
        setup = data.get("compress", {})
        lines += [
            "",
            f"Compressing every layer of {setup.get('model', 'the digits FCNN')} trained for {setup.get('epochs', '?')} "
            f"epochs ({setup.get('data', '')}): validation accuracy right after compression and after fine-tuning the "
            f"codes for {setup.get('finetune_epochs', '?')} epochs (test accuracy at the end), operations per sample "
            "(biases excluded). `fit=data`: codes refit by least squares on each layer's inputs.",
            "",
            "| model | fit | operations: total (add / mul / shift) | of dense | val acc, compressed | val acc, fine-tuned "
            "| test acc, fine-tuned |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in compressed:
            ops = f"{_op_split(r['ops'])} | {100 * r['ops_ratio']:.1f} %"
            if r["family"] in ("dense", "dense_continued"):
                lines.append(f"| {r['label']} | | {ops} | | {r['val_acc']:.2f} | {r['test_acc']:.2f} |")
                continue
            lines.append(
                f"| {r['family']} {r['label']} | {r['fit']} | {ops} | {r['val_acc_compressed']:.2f} "
                f"| {r['val_acc_finetuned']:.2f} | {r['test_acc_finetuned']:.2f} |"
            )
    return "\n".join(lines + claims_table(data["claims"]))


def render_bench_callbacks(data: dict) -> str:
    rows = data["rows"]
    load = data.get("load_average", {}).get("start", [])
    lines = [
        "Reproduce: `python benchmarks/bench_callbacks.py`",
        "",
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}` ({data.get('total_seconds', '?')} s"
        + (f"; load average {' / '.join(str(v) for v in load)} at the start" if load else "")
        + ").",
    ]
    overhead = [r for r in rows if r["section"] == "overhead"]
    if overhead:
        setup = data.get("overhead", {})
        baseline = {r["model"]: r for r in overhead if r["callback"] == "none"}
        lines += [
            "",
            "Training with each monitor alone against training without it, same seed and steps: the training loop's "
            f"wall time as a multiple of the run without (median over {setup.get('rounds', '?')} interleaved rounds of "
            "each round's ratio, min-max in brackets); the time inside the monitor's hooks as a share of the loop "
            "without it, and the part of that spent in `pl_module.log`. Target: at most "
            f"{data.get('target_ratio', 1.05)}x at the defaults.",
            "",
            "| model | monitor | every_n_steps | measurements | loop without (s) | with / without | in hooks | "
            "of which logging |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in overhead:
            if r["callback"] == "none":
                continue
            if "skipped" in r:
                lines.append(f"| {r['model']} | {r['callback']} | | | | skipped | | |")
                continue
            base = baseline.get(r["model"], {})
            ratio = f"{r['ratio']:.3f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
            ratio = ratio if r["ratio"] <= data.get("target_ratio", 1.05) else f"**{ratio}**"
            lines.append(
                f"| {r['model']} | {r['callback']} | {r['every_n_steps']} | {r['measurements']} "
                f"| {base.get('loop_s', math.nan):.2f} ({r['steps']} steps) | {ratio} | {100 * r['hook_share']:.1f} % "
                f"| {100 * r['log_share']:.1f} % |"
            )
        models = setup.get("models", {})
        if models:
            lines += ["", "Models (Trainer without logger, progress bar, checkpoints or validation):"]
            lines += [f"- {name}: {m['model']}." for name, m in models.items()]
        notes = [f"{r['model']}, {r['callback']}: {r['skipped']}." for r in overhead if "skipped" in r]
        notes += [
            f'{r["model"]}, {r["callback"]} warned {len(r["warnings"])} time(s), e.g. "{r["warnings"][0]}"'
            for r in overhead
            if r.get("warnings")
        ]
        if notes:
            lines += ["", "Notes:"] + [f"- {note}" for note in notes]
    logdet = sorted((r for r in rows if r["section"] == "logdet"), key=lambda r: r["d"])
    if logdet:
        setup = data.get("logdet", {})
        lines += [
            "",
            f"log|det J| of {setup.get('module', 'AuxiliaryReflection(d, invertible=True)')} on a probe of "
            f"{logdet[0]['probe_size']} rows, ms per probe batch (median of {logdet[0]['rounds']} interleaved rounds): "
            "the closed form (`log_abs_det_jacobian`, Lemma 1), JacobianDeterminantMonitor's closed-form path (the "
            f"same plus the sign of det J from the dense analytic Jacobian where d <= max_autograd_dim = "
            f"{setup.get('max_autograd_dim', 256)}) and its autograd path (vmap(jacrev) in float64, then slogdet); "
            "agreement of closed form and autograd on a float64 copy.",
            "",
            "| d | closed form | monitor, closed-form path | monitor, autograd path | autograd / closed form "
            "| max abs difference (float64) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in logdet:
            lines.append(
                f"| {r['d']} | {r['closed_form_ms']:.3g} | {r['monitor_closed_form_ms']:.3g} | {r['autograd_ms']:.3g} "
                f"| {r['autograd_over_closed_form']:.1f}x | {r['max_abs_difference_f64']:.1e} |"
            )
        fits = setup.get("fits", {})
        if fits:
            dims = next(iter(fits.values()))["dims"]
            lines += [
                "",
                f"Fitted growth, time ~ d^k over d = {', '.join(str(d) for d in dims)}: "
                + ", ".join(f"{method.replace('_', ' ')} k = {fit['exponent']:.2f}" for method, fit in fits.items())
                + ".",
            ]
    return "\n".join(lines + claims_table(data["claims"]))


RENDERERS = {
    "rnn_initial_loss": render_rnn_initial_loss,
    "bench_flows": render_bench_flows,
    "reproduce_glow": render_reproduction,
    "peer_normflows": render_reproduction,
    "bench_orthogonal": render_bench_orthogonal,
    "reproduce_fcnn": render_reproduction,
    "reproduce_rnn": render_reproduction,
    "reproduce_rnn_mnist5k": render_reproduction,
    "reproduce_fcnn_mnist5k": render_reproduction,
    "reproduce_uoro": render_reproduce_uoro,
    "reproduce_uoro_training": render_reproduce_uoro_training,
    "bench_online": render_bench_online,
    "reproduce_transforms": render_reproduce_transforms,
    "bench_transforms": render_bench_transforms,
    "bench_callbacks": render_bench_callbacks,
}


def sections(results: Path = RESULTS) -> dict[str, str]:
    """Benchmark name -> the markdown of its result files in ``results`` (sorted by file name, ``-quick`` skipped).

    Raises:
        ReportError: a result file of a benchmark with no renderer, or one its renderer cannot read.
    """
    out: dict[str, list[str]] = {}
    for path in sorted(results.glob("*.json")):
        if path.stem.endswith("-quick"):
            continue
        data = json.loads(path.read_text())
        renderer = RENDERERS.get(data["benchmark"])
        if renderer is None:
            raise ReportError(
                f"{path.name}: benchmark {data['benchmark']!r} has no renderer; add one to RENDERERS in benchmarks/report.py"
            )
        try:
            out.setdefault(data["benchmark"], []).append(renderer(data))
        except (KeyError, ReportError) as error:
            raise ReportError(f"{path.name}: cannot render: {error}") from error
    return {name: "\n\n".join(parts) for name, parts in out.items()}


def _marker(name: str, end: str) -> str:
    return f"<!-- {name}:{end} -->"


def render_readme(text: str, bodies: dict[str, str]) -> str:
    """``text`` with the body of every marked section replaced by ``bodies[name]``.

    Raises:
        ReportError: a benchmark of ``bodies`` has no markers in ``text``, a marker has no body (no results), or
            the markers of a name are not one ``start`` followed by one ``end``.
    """
    problems = []
    names = sorted(set(re.findall(r"<!-- ([\w.-]+):(?:start|end) -->", text)) | set(bodies))
    for name in names:
        starts, ends = text.count(_marker(name, "start")), text.count(_marker(name, "end"))
        if (starts, ends) == (0, 0):
            problems.append(
                f"{name} has results but the README has no section for it: add the lines "
                f"{_marker(name, 'start')} and {_marker(name, 'end')} where its tables belong"
            )
        elif (starts, ends) != (1, 1) or text.index(_marker(name, "start")) > text.index(_marker(name, "end")):
            problems.append(f"{name}: expected one {_marker(name, 'start')} before one {_marker(name, 'end')}")
        elif name not in bodies:
            problems.append(
                f"the README has a section {_marker(name, 'start')} but there are no {name}-*.json results "
                "(quick runs do not count): commit the results or remove the section"
            )
    if problems:
        raise ReportError("README sections do not match the results:\n  " + "\n  ".join(problems))
    for name, body in bodies.items():
        pattern = re.compile(rf"({re.escape(_marker(name, 'start'))}\n).*?({re.escape(_marker(name, 'end'))})", re.S)
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def update_readme(readme: Path = README, results: Path = RESULTS) -> bool:
    """Rewrite the marked sections of ``readme`` from ``results``; whether the file changed. Writes nothing on error."""
    text = readme.read_text()
    new = render_readme(text, sections(results))
    if new != text:
        readme.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--print", action="store_true", help="print the markdown instead of writing README.md")
    group.add_argument("--check", action="store_true", help="exit 1 if README.md differs from the rendered results")
    args = parser.parse_args(argv)
    try:
        if args.print:
            for name, body in sections().items():
                print(f"## {name}\n\n{body}\n")
        elif args.check:
            text = README.read_text()
            if render_readme(text, sections()) != text:
                print("README.md is out of date: run python benchmarks/report.py", file=sys.stderr)
                return 1
        else:
            update_readme()
    except ReportError as error:
        print(f"report.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
