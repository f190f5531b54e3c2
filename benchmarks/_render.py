"""Markdown pieces shared by the scripts' ``render(data) -> str``: the claims table and the table of a training
reproduction (curves aggregated over seeds by ``benchmarks._reproduce.aggregate``). No torch import: the report
reads result files only."""

from __future__ import annotations


class ReportError(ValueError):
    """The results and the results pages' markers do not match, or a result file cannot be rendered."""


def claims_table(claims: list[dict]) -> list[str]:
    """The markdown lines of a result's claims (preceded by a blank line): claim, measured figure, holds."""
    lines = ["", "| claim | measured | holds |", "|---|---:|:---:|"]
    for claim in claims:
        lines.append(f"| {claim['claim']} | {claim['figure']} | {'yes' if claim['holds'] else '**no**'} |")
    return lines


#: metric of a reproduction's curves -> (column label, decimals)
METRICS = {"val_error": ("validation error (%)", 2), "val_bpd": ("validation bits/dim", 3)}


def curves_metric(curves: dict[str, list[dict]]) -> str:
    """The one metric all curves average (``aggregate``'s ``"metric"`` field).

    Raises:
        ReportError: curves without it (an older file), or curves of several or unknown metrics.
    """
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
    """The table of a training reproduction: final metric (mean ± std over seeds), the mean of each seed's best
    epoch, seconds per training epoch; Glow's inversion checks where present; the claims."""
    setup = data.get("setup", {})
    setup_text = ", ".join(f"{k} {v}" for k, v in setup.items())
    metric = curves_metric(data["curves"])
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
