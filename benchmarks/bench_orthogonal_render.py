"""Results-page tables of benchmarks/bench_orthogonal.py (one orthogonal map beside nn.Linear, the FCNN epoch):
``render(data)`` of its result JSON (``python -m benchmarks.report`` finds it by the script's name)."""

from __future__ import annotations

from benchmarks._render import claims_table

ORTHOGONAL_COLUMNS = ("aux", "householder_wy", "householder_sequential", "torch_householder", "cayley", "matrix_exp")


def _fmt_ratio(row: dict | None) -> str:
    if row is None:
        return ""
    if "skipped" in row:
        return "skipped"
    return f"{row['both_ratio_to_linear']:.2f}x"


def render(data: dict) -> str:
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
