"""Results-page tables of benchmarks/bench_callbacks.py (the monitors' overhead, log-determinants):
``render(data)`` of its result JSON (``python -m benchmarks.report`` finds it by the script's name)."""

from __future__ import annotations

import math

from benchmarks._render import claims_table


def render(data: dict) -> str:
    rows = data["rows"]
    load = data.get("load_average", {}).get("start", [])
    lines = [
        "Reproduce: `python -m benchmarks.bench_callbacks`",
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
