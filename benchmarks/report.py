"""Render the README's benchmark tables from benchmarks/results/*.json.

    python benchmarks/report.py            # rewrite the marked sections of README.md
    python benchmarks/report.py --print    # print the markdown instead

A section is delimited by ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` where NAME is the benchmark.
Files ending in ``-quick.json`` (smoke runs) are ignored.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

ORTHOGONAL_COLUMNS = ("aux", "householder_wy", "householder_sequential", "torch_householder", "cayley", "matrix_exp")


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
    lines += ["", "| claim | measured | holds |", "|---|---:|:---:|"]
    for claim in data["claims"]:
        lines.append(f"| {claim['claim']} | {claim['figure']} | {'yes' if claim['holds'] else '**no**'} |")
    return "\n".join(lines)


def render_reproduction(data: dict) -> str:
    setup = data.get("setup", {})
    setup_text = ", ".join(f"{k} {v}" for k, v in setup.items())
    bpd = data["benchmark"] in ("reproduce_glow", "peer_normflows")
    metric, label = ("val_bpd", "validation bits/dim") if bpd else ("val_error", "validation error (%)")
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` ({setup_text}).",
        "",
        f"| run | final {label} | mean over seeds of the best epoch | seconds per training epoch |",
        "|---|---:|---:|---:|",
    ]
    for method, curve in sorted(data["curves"].items(), key=lambda kv: kv[1][-1]["val_error_mean"]):
        final = curve[-1]
        best = [
            min(r[metric] for r in data["rows"] if r["method"] == method and r["seed"] == s)
            for s in sorted({r["seed"] for r in data["rows"] if r["method"] == method})
        ]
        per_epoch = sum(c["epoch_seconds_mean"] for c in curve) / len(curve)
        digits = 3 if bpd else 2
        lines.append(
            f"| {method} | {final['val_error_mean']:.{digits}f} ± {final['val_error_std']:.{digits}f} ({final['seeds']} seeds) "
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
    lines += ["", "| claim | measured | holds |", "|---|---:|:---:|"]
    for claim in data["claims"]:
        lines.append(f"| {claim['claim']} | {claim['figure']} | {'yes' if claim['holds'] else '**no**'} |")
    return "\n".join(lines)


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
    lines += ["", "| claim | measured | holds |", "|---|---:|:---:|"]
    for claim in data["claims"]:
        lines.append(f"| {claim['claim']} | {claim['figure']} | {'yes' if claim['holds'] else '**no**'} |")
    return "\n".join(lines)


RENDERERS = {
    "bench_flows": render_bench_flows,
    "reproduce_glow": render_reproduction,
    "peer_normflows": render_reproduction,
    "bench_orthogonal": render_bench_orthogonal,
    "reproduce_fcnn": render_reproduction,
    "reproduce_rnn": render_reproduction,
}


def sections() -> dict[str, str]:
    out: dict[str, list[str]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        if path.stem.endswith("-quick"):
            continue
        data = json.loads(path.read_text())
        renderer = RENDERERS.get(data["benchmark"])
        if renderer:
            out.setdefault(data["benchmark"], []).append(renderer(data))
    return {name: "\n\n".join(parts) for name, parts in out.items()}


def update_readme(readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    for name, body in sections().items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    readme.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print", action="store_true")
    args = parser.parse_args()
    if args.print:
        for name, body in sections().items():
            print(f"## {name}\n\n{body}\n")
    else:
        update_readme()


if __name__ == "__main__":
    main()
