"""Cooijmans & Martens 2019, "On the Variance of Unbiased Online Recurrent Optimization": the variance of UORO's
gradient estimate under each variance reduction, on a fixed short sequence where everything is known by backprop.

    python -m benchmarks.reproduce_uoro                 # 3 sequences x 9 estimators x 20,000 draws (~6 minutes)
    python -m benchmarks.reproduce_uoro --quick         # smoke run

Setup: a tanh RNN (``TanhRNNCell``, H = 16, 4 inputs, ``W_h ~ N(0, 1/H)``), T = 20 steps of Gaussian inputs, a
linear readout with squared error to random targets; the loss gradients ``dL_t/dh_t`` are those of the
noise-free trajectory (UORO does not perturb it). The exact gradient of ``sum_t L_t`` comes from RTRL (equal to
BPTT, tested); an estimator is run on ``draws`` identical streams at once, each with its own noise, which gives
``draws`` independent estimates of the total gradient. For each estimator: the empirical total variance
``tr Cov(g)`` (with its standard error), the relative bias ``||mean - exact|| / ||exact||``, the largest
per-parameter z-score of the mean against the exact gradient (and the Bonferroni critical value for a 1e-3
family-wise false alarm), the section-6 prediction for the fixed-Q estimators, and the time per step.

Estimators: GIR UORO at the state (Tallec & Ollivier), the preactivation and the parameters; fixed
``Q = I`` at the state; fixed ``Q_t = alpha_t Q0`` at the preactivation with ``Q0 = I``, with the oracle ``Q0 = B^{-1/4}`` and with that ``Q0``
plus the optimal ``alpha`` (section 7); the preactivation estimator without spatial noise ("none", section 8).

Claims (paper): every estimator is unbiased; the preactivation projection lowers the variance versus the state;
``Q0 = B^{-1/4}`` lowers ``V(Q)`` from ``tr(B) tr(I)`` to ``tr(B^{1/2})^2``; "none" lowers it most, at a higher cost.
Writes benchmarks/results/reproduce_uoro-HARDWARE.json and .png.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch

from benchmarks._common import (
    benchmark_parser,
    configured,
    parse_args,
    print_claims,
    pyplot,
    reject,
    result_path,
    write_result,
)
from lightning_ortho.online import (
    RTRL,
    UORO,
    TanhRNNCell,
    optimal_alpha,
    optimal_q0,
    oracle_terms,
    preactivation_b_matrix,
    preactivation_variance,
    total_variance,
)

FALSE_ALARM = 1e-3


def problem(seed: int, hidden: int, inputs: int, steps: int):
    """The cell, inputs, initial state and the loss gradients along the noise-free trajectory of one sequence."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cell = TanhRNNCell(inputs, hidden).double()
    with torch.no_grad():
        cell.weight_hh.copy_(torch.randn(hidden, hidden, generator=g, dtype=torch.float64) / math.sqrt(hidden))
    xs = torch.randn(steps, inputs, generator=g, dtype=torch.float64)
    h0 = torch.zeros(hidden, dtype=torch.float64)
    readout = torch.randn(2, hidden, generator=g, dtype=torch.float64) / math.sqrt(hidden)
    targets = torch.randn(steps, 2, generator=g, dtype=torch.float64)
    h, loss_gradients = h0, []
    with torch.no_grad():
        for t in range(steps):
            h = cell(xs[t][None], h[None])[0]
            loss_gradients.append(readout.T @ (readout @ h - targets[t]))  # d 0.5 ||V h - y||^2 / dh
    return cell, xs, h0, torch.stack(loss_gradients)


def estimates(estimator, xs, h0, loss_gradients, draws: int) -> tuple[torch.Tensor, float]:
    """``(draws, P)`` independent estimates of the total gradient, and seconds per step."""
    state = estimator.initial_state(h0.expand(draws, -1).clone())
    total = torch.zeros(draws, estimator.layout.size, dtype=torch.float64)
    start = time.perf_counter()
    for t in range(xs.shape[0]):
        _, state = estimator.step(xs[t].expand(draws, -1).clone(), state)
        grads = estimator.gradient(state, loss_gradients[t].expand(draws, -1).clone(), per_stream=True)
        total += estimator.layout.flatten(grads, lead=1)
    return total, (time.perf_counter() - start) / xs.shape[0]


def summary(values: torch.Tensor, exact: torch.Tensor) -> dict:
    draws = values.shape[0]
    squared = (values - values.mean(0)).square().sum(1)
    spread = values.std(0) / math.sqrt(draws)
    gap = values.mean(0) - exact
    moving = spread > 0
    z = (gap[moving] / spread[moving]).abs().max().item()
    return {
        "total_variance": squared.mean().item(),
        "total_variance_se": (squared.std() / math.sqrt(draws)).item(),
        "relative_bias": (gap.norm() / exact.norm()).item(),
        "bias_se": (spread.square().sum().sqrt() / exact.norm()).item(),
        "max_z": z,
        "critical_z": statistics.NormalDist().inv_cdf(1 - FALSE_ALARM / (2 * exact.numel())),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("reproduce_uoro", __doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    args = parse_args(parser, argv)
    reject(parser, args, rounds="reproduce_uoro draws estimates (see --draws)", device="it runs on the CPU only")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    if args.quick:
        args.seeds, args.draws, args.hidden, args.steps = 1, 500, 4, 5
    inputs = 4
    rows: list[dict] = []
    for seed in range(args.seeds):
        cell, xs, h0, loss_gradients = problem(seed, args.hidden, inputs, args.steps)
        exact, _ = estimates(RTRL(cell), xs, h0, loss_gradients, 1)
        exact = exact[0]
        terms = oracle_terms(cell, xs, h0, loss_gradients, cut="preactivation")
        state_terms = oracle_terms(cell, xs, h0, loss_gradients, cut="state")
        b_matrix = preactivation_b_matrix(terms)
        q0 = optimal_q0(b_matrix)
        alpha = optimal_alpha(terms, q0)
        ones = torch.ones(args.steps, dtype=torch.float64)
        identity = torch.eye(args.hidden, dtype=torch.float64)
        fixed = {
            "fixed Q, Q0 = I": (ones, identity),
            "fixed Q, Q0 = B^-1/4": (ones, q0),
            "fixed Q, Q0 = B^-1/4, optimal alpha": (alpha, q0),
        }
        estimators = {
            "GIR, state": UORO(cell, projection="state", generator=seed),
            "GIR, preactivation": UORO(cell, projection="preactivation", generator=seed),
            "GIR, parameter": UORO(cell, projection="parameter", generator=seed),
            "fixed Q, Q0 = I, state": UORO(cell, projection="state", rescaling=(ones, identity), generator=seed),
            **{name: UORO(cell, projection="preactivation", rescaling=r, generator=seed) for name, r in fixed.items()},
            "none (no spatial noise), GIR": UORO(cell, projection="none", generator=seed),
        }
        fixed_part = (total_variance(terms, identity) - preactivation_variance(terms, None, None)).item()
        for name, estimator in estimators.items():
            values, seconds = estimates(estimator, xs, h0, loss_gradients, args.draws)
            row = {
                "method": name,
                "seed": seed,
                "draws": args.draws,
                "seconds_per_step": seconds,
                **summary(values, exact),
            }
            if name in fixed:
                a, q = fixed[name]
                row["predicted_total_variance"] = total_variance(terms, a[:, None, None] * q).item()
                row["predicted_v_q"] = row["predicted_total_variance"] - fixed_part
            elif name == "fixed Q, Q0 = I, state":
                row["predicted_total_variance"] = total_variance(state_terms, identity).item()
            rows.append(row)
            print(
                f"seed {seed} {name:38s} trCov {row['total_variance']:10.4g} ± {row['total_variance_se']:.2g}"
                f"  pred {row.get('predicted_total_variance', float('nan')):10.4g}  bias {row['relative_bias']:.3g}"
                f"  max z {row['max_z']:.2f}/{row['critical_z']:.2f}  {1e3 * seconds:.2f} ms/step",
                flush=True,
            )
        rows.append(
            {
                "method": "oracle",
                "seed": seed,
                "tr_b_tr_i": (torch.trace(b_matrix) * args.hidden).item(),
                "tr_sqrt_b_squared": (torch.linalg.eigvalsh(b_matrix).clamp_min(0).sqrt().sum() ** 2).item(),
                "v_q_optimal_alpha": preactivation_variance(terms, q0, alpha).item(),
                "q_independent_part": fixed_part,
                "exact_gradient_norm": exact.norm().item(),
            }
        )
    setup = {"hidden": args.hidden, "inputs": inputs, "steps": args.steps, "draws": args.draws, "seeds": args.seeds}
    path = write_result("reproduce_uoro", device, rows, claims(rows), args, extra={"setup": setup})
    plot(rows, result_path("reproduce_uoro", device, args, ".png"))
    print_claims(claims(rows))
    return path


def _mean(rows: list[dict], method: str, key: str) -> float:
    values = [r[key] for r in rows if r["method"] == method]
    return sum(values) / len(values)


def _ratio(rows: list[dict], better: str, worse: str) -> float:
    """Geometric mean over sequences of ``worse / better`` total variance."""
    seeds = sorted({r["seed"] for r in rows})
    pick = {(r["method"], r["seed"]): r["total_variance"] for r in rows if "total_variance" in r}
    logs = [math.log(pick[(worse, s)] / pick[(better, s)]) for s in seeds]
    return math.exp(sum(logs) / len(logs))


def claims(rows: list[dict]) -> list[dict]:
    estimators = [r for r in rows if "max_z" in r]
    worst = max(r["max_z"] / r["critical_z"] for r in estimators)
    oracle = [r for r in rows if r["method"] == "oracle"]
    q_gain = sum(o["tr_b_tr_i"] / o["tr_sqrt_b_squared"] for o in oracle) / len(oracle)
    measured_q_gain = _ratio(rows, "fixed Q, Q0 = B^-1/4", "fixed Q, Q0 = I")
    prediction_error = max(
        abs(r["total_variance"] - r["predicted_total_variance"]) / r["total_variance_se"]
        for r in estimators
        if "predicted_total_variance" in r
    )
    preactivation_gain = _ratio(rows, "GIR, preactivation", "GIR, state")
    preactivation_gain_fixed = _ratio(rows, "fixed Q, Q0 = I", "fixed Q, Q0 = I, state")
    none_gain = min(
        _ratio(rows, "none (no spatial noise), GIR", other)
        for other in {r["method"] for r in estimators} - {"none (no spatial noise), GIR"}
    )
    cost = _mean(rows, "none (no spatial noise), GIR", "seconds_per_step") / _mean(
        rows, "GIR, preactivation", "seconds_per_step"
    )
    return [
        {
            "claim": "every estimator is unbiased (largest per-parameter abs(z) / Bonferroni critical value at 1e-3, <= 1)",
            "figure": round(worst, 3),
            "holds": worst <= 1,
        },
        {
            "claim": "section 6's total variance predicts the measured one for fixed Q (worst abs(measured - predicted) in standard errors, <= 4)",
            "figure": round(prediction_error, 2),
            "holds": prediction_error <= 4,
        },
        {
            "claim": "preactivation projection lowers the variance versus the state (GIR; variance ratio state / preactivation > 1)",
            "figure": round(preactivation_gain, 3),
            "holds": preactivation_gain > 1,
        },
        {
            "claim": "preactivation projection lowers the variance versus the state (fixed Q = I; ratio state / preactivation > 1)",
            "figure": round(preactivation_gain_fixed, 3),
            "holds": preactivation_gain_fixed > 1,
        },
        {
            "claim": "Q0 = B^-1/4 lowers V(Q) from tr(B) tr(I) to tr(B^1/2)^2 (predicted ratio, mean over sequences)",
            "figure": round(q_gain, 3),
            "holds": q_gain > 1,
        },
        {
            "claim": "Q0 = B^-1/4 lowers the measured total variance versus Q0 = I (ratio > 1)",
            "figure": round(measured_q_gain, 3),
            "holds": measured_q_gain > 1,
        },
        {
            "claim": "no spatial noise ('none') has the lowest variance (smallest ratio other / none over all estimators > 1)",
            "figure": round(none_gain, 3),
            "holds": none_gain > 1,
        },
        {
            "claim": "... at a higher cost per step than the preactivation projection (time ratio > 1)",
            "figure": round(cost, 2),
            "holds": cost > 1,
        },
    ]


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    methods = list(dict.fromkeys(r["method"] for r in rows if "total_variance" in r))
    seeds = sorted({r["seed"] for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, seed in enumerate(seeds):
        values = [next(r["total_variance"] for r in rows if r["method"] == m and r["seed"] == seed) for m in methods]
        ax.scatter(range(len(methods)), values, label=f"sequence {seed}", marker="o^s"[i % 3])
    ax.set_yscale("log")
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(methods, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("tr Cov(g) (total variance)")
    ax.set_title("UORO variance on a fixed sequence (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
