"""Results-page table of benchmarks/bench_online_steps.py (one stream, one thread, ours against plain NumPy):
``render(data)`` of its result JSON (``python -m benchmarks.report`` finds it by the script's name). No torch
import."""

from __future__ import annotations

from benchmarks._render import claims_table

#: row key -> the estimator's name in the table (the order of the table)
LABELS = {
    "forward": "forward",
    "rtrl": "RTRL",
    "uoro": "UORO",
    "kf_rtrl": "KF-RTRL",
    "rflo": "RFLO",
    "snap1": "SnAp-1",
    "tbptt": "TruncatedBPTT",
    "diagonal_rtrl": "DiagonalRTRL",
}


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    ratio = f"{row['ratio']:.2f}x"
    if not row["holds"]:
        ratio = f"**{ratio}**"
    text = f"{ratio} ({row['ours_ms']:.3g} / {row['numpy_ms']:.3g})"
    return text if row["agreement"]["agrees"] else text + " (disagrees)"


def render(data: dict) -> str:
    setup = data.get("setup", {})
    rows = data["rows"]
    columns = list(dict.fromkeys((r["dtype"], r["H"]) for r in rows))
    index = {(r["estimator"], r["dtype"], r["H"]): r for r in rows}
    names = [n for n in LABELS if any(r["estimator"] == n for r in rows)]
    before = data.get("before")  # a run kept to show where the work started: its table, without claims
    lines = [f"*{before}*", ""] if before else []
    lines += [
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, NumPy "
        f"{setup.get('numpy', '?')}, {data['date']}: `{data['command']}` ({data.get('total_seconds', '?')} s). One "
        f"stream, one thread; {setup.get('cell', 'TanhRNNCell')}; RFLO tau = {setup.get('rflo_tau', '?')}, "
        f"TruncatedBPTT k = {setup.get('tbptt_k', '?')}. Each entry: ours / NumPy, the median over "
        f"{setup.get('rounds', '?')} interleaved rounds of each round's ratio, and in brackets the median ms per step "
        "(ours / NumPy); in bold where the goal does not hold.",
        "",
        "| estimator | goal | " + " | ".join(f"H = {h}, {d}" for d, h in columns) + " |",
        "|---|---|" + "---:|" * len(columns),
    ]
    for name in names:
        first = next(r for r in rows if r["estimator"] == name)
        cells = [_cell(index.get((name, d, h))) for d, h in columns]
        lines.append(f"| {LABELS[name]} | <= {first['goal']:g}x | " + " | ".join(cells) + " |")
    errors: dict[str, float] = {}
    for row in rows:
        errors[row["dtype"]] = max(errors.get(row["dtype"], 0.0), row["agreement"]["max_error"])
    agreement = ", ".join(f"{d} {e:.1e} (tolerance {_tolerance(rows, d):g})" for d, e in errors.items())
    lines += [
        "",
        "Largest relative difference between ours and the NumPy reference (new state and every gradient entry) over "
        f"{rows[0]['agreement']['steps'] if rows else '?'} steps from the same state: {agreement}.",
    ]
    return "\n".join(lines if before else lines + claims_table(data["claims"]))


def _tolerance(rows: list[dict], dtype: str) -> float:
    return next(r["agreement"]["tolerance"] for r in rows if r["dtype"] == dtype)
