"""Results-page tables of benchmarks/bench_transforms.py (learning, applying and compressing with fast transforms):
``render(data)`` of its result JSON (``python -m benchmarks.report`` finds it by the script's name)."""

from __future__ import annotations

from benchmarks._render import claims_table

#: method of bench_transforms' apply rows -> column label
TRANSFORM_APPLY_COLUMNS = {
    "b_fft": "B, FFT-like",
    "m_q8": "M-like, q = 8",
    "b_fft_autograd": "B, FFT-like, autograd recording",
}


def _op_split(ops: dict) -> str:
    return f"{ops['total']:,} ({ops['additions']:,} / {ops['multiplications']:,} / {ops['shifts']:,})"


def render(data: dict) -> str:
    rows = data["rows"]
    lines = [
        "Reproduce: `python -m benchmarks.bench_transforms`",
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
            "b4x4": "B⊗_m-DLA",
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
