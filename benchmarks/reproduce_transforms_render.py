"""Results-page tables of benchmarks/reproduce_transforms.py (representation error against operations):
``render(data)`` of its result JSON (``python -m benchmarks.report`` finds it by the script's name)."""

from __future__ import annotations

from benchmarks._render import claims_table


def render(data: dict) -> str:
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
    held_out = [row for row in data["rows"] if row.get("evaluation") == "held-out"]
    if held_out:
        first = held_out[0]
        lines += [
            "",
            f"Rows marked (held-out) learn on {first['train_patches']:,} of the patches and are scored on the other "
            f"{first['held_out_patches']:,}; their error on the patches they learned from: "
            + ", ".join(f"{row['label'].split(' (')[0]} {row['train_error']:.2f} %" for row in held_out)
            + ".",
        ]
    generalised = data.get("learned_fast_generalisation") or []
    if generalised:
        lines += [
            "",
            "The learned fast transform (init dct) learned on one photograph and scored on the other, beside the DCT:",
            "",
            "| learned on | scored on | error there (%) | DCT there (%) | on its own photograph (%) | DCT there (%) |",
            "|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {g['train']} | {g['test']} | {g['test_error']:.2f} | {g['dct_test_error']:.2f} | {g['train_error']:.2f} "
            f"| {g['dct_train_error']:.2f} |"
            for g in generalised
        ]
    peer = data.get("peers", {}).get("pyfaust", {})
    if peer:
        status = f"version {peer['version']}" if "version" in peer else f"not available: {peer.get('error', '?')}"
        note = f" {peer['note']}." if peer.get("note") else ""
        lines += ["", f"FAµST: `{peer.get('requirement', 'pyfaust')}` ({status}).{note}"]
    return "\n".join(lines + claims_table(data["claims"]))
