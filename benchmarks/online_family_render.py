"""Claims, figure and results-page table of ``python -m benchmarks.online_family`` (no torch import at module level: the
report reads result files only)."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks._render import claims_table

#: the long copy task counts as learned when the validation recall loss is below this fraction of chance (ln 4)
LEARNED_FRACTION = 0.5
#: an exact estimator's mean cosine with backprop through time must exceed this
EXACT_COSINE = 0.999
#: estimators exact for their cell (SnAp-2's pattern is full for a dense tanh RNN)
EXACT = ("RTRL", "SnAp-2", "LRU, diagonal RTRL")


def _final(row: dict | None, key: str) -> float:
    """A training figure of a row, ``inf`` for a missing row or a run that diverged."""
    if row is None or "diverged" in row:
        return math.inf
    return row.get(key, math.inf)


def _pick(rows: list[dict], task: str, method: str) -> dict | None:
    return next((r for r in rows if r["task"] == task and r["method"] == method), None)


def claims(rows: list[dict]) -> list[dict]:
    """The claims rows, each computed from the measured rows (a missing measurement makes a claim not hold)."""
    out = []
    # Mujika, Meier & Steger 2018: KF-RTRL's variance is lower than UORO's (at the initial parameters)
    ratios = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        kf = next((r for r in mine if "KF-RTRL" in r["method"]), None)
        for uoro in (r for r in mine if "UORO" in r["method"]):
            if kf is not None:
                ratio = uoro["initial"]["total_variance"] / max(kf["initial"]["total_variance"], 1e-300)
                ratios[f"{task}, {uoro['method'].split('UORO ')[-1].strip('()')}"] = round(ratio, 3)
    lowest = min(ratios.values()) if ratios else math.nan
    out.append(
        {
            "claim": "KF-RTRL has lower variance than UORO (Mujika et al. 2018): tr Cov of UORO / tr Cov of KF-RTRL at"
            " the initial parameters, smallest over tasks and projections, > 1",
            "figure": f"{lowest:.3g} (" + ", ".join(f"{k} {v:.3g}" for k, v in ratios.items()) + ")",
            "holds": bool(ratios) and lowest > 1,
        }
    )
    # Menick et al. 2021: SnAp-1 beats UORO at equal wall time on characters
    snap = _final(_pick(rows, "characters", "SnAp-1"), "val_bits")
    uoros = {r["method"]: _final(r, "val_bits") for r in rows if r["task"] == "characters" and "UORO" in r["method"]}
    best = min(uoros, key=uoros.get) if uoros else None
    best_bits = uoros[best] if best else math.inf
    out.append(
        {
            "claim": "SnAp-1 beats UORO at equal wall time on characters (Menick et al. 2021): validation bits/char of"
            " SnAp-1 below the best UORO's",
            "figure": f"SnAp-1 {snap:.3f} vs {best} {best_bits:.3f}",
            "holds": snap < best_bits,
        }
    )
    # Zucchet et al. 2023: an LRU by exact diagonal RTRL learns the 100-step delay, a tanh RNN by UORO does not
    lru, tanh = _pick(rows, "long copy", "LRU, diagonal RTRL"), _pick(rows, "long copy", "tanh, UORO (preactivation)")
    chance = next((r["chance_loss"] for r in (lru, tanh) if r and "chance_loss" in r), math.log(4))
    threshold = LEARNED_FRACTION * chance
    delay = next((r["delay"] for r in (lru, tanh) if r and "delay" in r), "?")
    lru_loss, tanh_loss = _final(lru, "val_loss"), _final(tanh, "val_loss")
    out.append(
        {
            "claim": f"an LRU trained online with exact diagonal RTRL learns the {delay}-step delay copy task that a"
            f" UORO-trained tanh RNN does not learn here (Zucchet et al. 2023; learned: recall loss < {LEARNED_FRACTION}"
            " x chance)",
            "figure": f"LRU {lru_loss:.3f} vs tanh UORO {tanh_loss:.3f} nats (chance {chance:.3f}, threshold"
            f" {threshold:.3f})",
            "holds": lru_loss < threshold <= tanh_loss,
        }
    )
    # sanity: the exact estimators agree with backprop through time
    exact = {f"{r['task']}/{r['method']}": r["initial"]["cosine"] for r in rows if r["method"] in EXACT}
    worst = min(exact.values()) if exact else math.nan
    out.append(
        {
            "claim": f"the exact estimators (RTRL, SnAp-2 on a dense cell, diagonal RTRL on the LRU) align with"
            f" backprop through time (smallest mean cosine > {EXACT_COSINE})",
            "figure": f"{worst:.6f} over {len(exact)}",
            "holds": bool(exact) and worst > EXACT_COSINE,
        }
    )
    return out


def plot(rows: list[dict], path: Path) -> None:
    """Per task: training loss against training seconds for every estimator."""
    from benchmarks._common import pyplot

    plt = pyplot()
    if plt is None:
        return
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for row in (r for r in rows if r["task"] == task):
            points = row.get("curve", [])
            if points:
                ax.plot([p[0] for p in points], [p[2] for p in points], lw=1, label=row["method"])
        chance = next((r.get("chance_loss") for r in rows if r["task"] == task and "chance_loss" in r), None)
        if chance:
            ax.axhline(chance, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("training seconds")
        ax.set_ylabel("training loss (nats)")
        ax.set_title(task)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bias(q: dict) -> str:
    if q["draws"] == 1:
        return f"{q['relative_bias']:.3g}"
    z = q["squared_bias"] / q["squared_bias_se"] if q["squared_bias_se"] > 0 else math.nan
    return f"{q['relative_bias']:.3g} (z {z:.1f})"


def render(data: dict) -> str:
    setup = data["setup"]
    lines = [
        f"**{data['hardware']}**, torch {data['torch']}, {data['date']}: `{data['command']}` (tanh RNN H ="
        f" {setup['hidden']}, LRU H = {setup['lru_hidden']}, {setup['streams']} streams; gradient quality on a"
        f" {setup['probe_streams']}-stream probe chunk against backprop, {setup['draws']} draws of a random estimator;"
        f" training for {setup['seconds']:g} s per estimator, {setup['long_seconds']:g} s on the long copy task,"
        " then validation).",
        "",
        "| task | estimator | cos(g_r, g) init / trained | variance / norm² | squared bias / norm² | ms per step |"
        " state KiB per stream | validation loss (nats) | optimizer steps |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        init, trained = row["initial"], row.get("trained")
        cos = f"{init['cosine']:.3f}" + (f" / {trained['cosine']:.3f}" if trained else "")
        if "diverged" in row:
            loss = f"diverged ({row['diverged'].split(':')[0]})"
        else:
            loss = f"{row['val_loss']:.4f}" + (
                f" ({row['val_bits']:.3f} bits/char)" if row["task"] == "characters" else ""
            )
        lines.append(
            f"| {row['task']} | {row['method']} | {cos} | {init['relative_variance']:.3g} | {_bias(init)} |"
            f" {row['ms_per_step']:.2f} | {row['state_bytes_per_stream'] / 1024:.1f} | {loss} | {row['optimizer_steps']} |"
        )
    return "\n".join(lines + claims_table(data["claims"]))
