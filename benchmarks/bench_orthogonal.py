"""Speed of one d x d orthogonal(-like) map on a batch, side by side with nn.Linear in the same run.

    python benchmarks/bench_orthogonal.py            # full grid (about 15 minutes on 2 CPU cores)
    python benchmarks/bench_orthogonal.py --quick    # small grid, seconds (used by the tests)
    python benchmarks/bench_orthogonal.py --device cuda

Maps: nn.Linear(d, d, bias=False) (the one-matmul baseline), one auxiliary reflection (ours), d Householder
reflections (ours, sequential and compact WY), and PyTorch's orthogonal parametrisations (householder,
cayley, matrix_exp). Forward (with autograd recording, as in training) and the backward pass that follows
it (gradients of input and parameters) are timed separately in the same loop; forward+backward is their
sum. Methods are interleaved (in a random order) within each
round; the best round is reported (``*_ms``; the machine's noise only ever adds time) beside the median
(``*_median_ms``), and ratios to nn.Linear are ratios of best rounds.

Writes benchmarks/results/bench_orthogonal-HARDWARE.json (+ .png).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, hardware_name, median, time_forward_backward, write_result  # noqa: E402

from lightning_ortho.nn import AuxiliaryReflection, HouseholderProduct, ParametrizedOrthogonal  # noqa: E402

METHODS = ("linear", "aux", "householder_sequential", "householder_wy", "torch_householder", "cayley", "matrix_exp")
FULL_DIMS, FULL_BATCHES = (64, 256, 784, 2048), (32, 1024, 16384)
QUICK_DIMS, QUICK_BATCHES = (64, 256), (32, 1024)
#: Seconds of forward+backward after which a method is measured for only two rounds (matrix_exp and
#: torch's householder take ~20 s per call at d = 2048 on 2 cores).
SLOW_METHOD_BUDGET = 30.0
#: Autograd keeps one (B, d) activation per sequential reflection; above this the run would swap or die.
SEQUENTIAL_MEMORY_LIMIT = 4 * 2**30


def build(method: str, d: int) -> nn.Module:
    if method == "linear":
        return nn.Linear(d, d, bias=False)
    if method == "aux":
        return AuxiliaryReflection(d)
    if method == "householder_sequential":
        return HouseholderProduct(d, strategy="sequential")
    if method == "householder_wy":
        return HouseholderProduct(d, strategy="wy")
    return ParametrizedOrthogonal(d, "householder" if method == "torch_householder" else method)


def skip_reason(method: str, d: int, batch: int, device: torch.device) -> str | None:
    if method == "householder_sequential":
        memory = d * batch * d * 4
        if memory > SEQUENTIAL_MEMORY_LIMIT:
            return f"autograd would hold d={d} activations of {batch}x{d} floats ({memory / 2**30:.0f} GiB)"
        if device.type == "cpu" and d >= 2048:
            return "d=2048 sequential steps take minutes per call on CPU"
    return None


def measure(dims, batches, rounds: int, min_time: float, device: torch.device, methods=METHODS) -> list[dict]:
    rows = []
    for d in dims:
        for batch in batches:
            torch.manual_seed(0)
            x = torch.randn(batch, d, device=device, requires_grad=True)
            grad = torch.randn(batch, d, device=device)
            modules, times = {}, {}
            for method in methods:
                reason = skip_reason(method, d, batch, device)
                if reason:
                    rows.append({"d": d, "batch": batch, "method": method, "skipped": reason})
                    continue
                modules[method] = build(method, d).to(device)
                times[method] = {"forward": [], "backward": [], "both": []}

            def run(module):
                def forward():
                    module.zero_grad(set_to_none=True)
                    x.grad = None
                    return module(x)

                return time_forward_backward(forward, lambda y: y.backward(grad), device, min_time=min_time)

            for module in modules.values():  # warm-up (allocator, lazy init, LAPACK workspaces)
                run(module)
            for round_index in range(rounds):
                # Methods that already spent SLOW_METHOD_BUDGET seconds stop after two rounds.
                order = [m for m in modules if round_index < 2 or sum(times[m]["both"]) < SLOW_METHOD_BUDGET]
                random.shuffle(order)
                for method in order:
                    forward_s, backward_s = run(modules[method])
                    times[method]["forward"].append(forward_s)
                    times[method]["backward"].append(backward_s)
                    times[method]["both"].append(forward_s + backward_s)
            for method, measured in times.items():
                row = {"d": d, "batch": batch, "method": method}
                row["rounds"] = len(measured["both"])
                for kind in ("forward", "backward", "both"):
                    row[f"{kind}_ms"] = 1e3 * min(measured[kind])
                    row[f"{kind}_median_ms"] = 1e3 * median(measured[kind])
                    if "linear" in times:
                        row[f"{kind}_ratio_to_linear"] = min(measured[kind]) / min(times["linear"][kind])
                rows.append(row)
                print(
                    f"d={d:5d} B={batch:6d} {method:24s} fwd {row['forward_ms']:9.2f} ms  fwd+bwd {row['both_ms']:9.2f} ms"
                    + (f"  x{row['both_ratio_to_linear']:.2f} of Linear" if "both_ratio_to_linear" in row else ""),
                    flush=True,
                )
    return rows


def claims_from(rows: list[dict]) -> list[dict]:
    measured = [r for r in rows if "skipped" not in r]
    claims = []
    aux_big = [r for r in measured if r["method"] == "aux" and r["d"] >= 784 and r["batch"] >= 1024]
    if aux_big:
        worst = max(r["both_ratio_to_linear"] for r in aux_big)
        claims.append(
            {
                "claim": "aux forward+backward <= 1.3x nn.Linear at d >= 784, B >= 1024 (worst case)",
                "figure": round(worst, 3),
                "holds": worst <= 1.3,
            }
        )
        worst_fwd = max(r["forward_ratio_to_linear"] for r in aux_big)
        claims.append(
            {
                "claim": "aux forward <= 1.3x nn.Linear at d >= 784, B >= 1024 (worst case)",
                "figure": round(worst_fwd, 3),
                "holds": worst_fwd <= 1.3,
            }
        )
    by_key = {(r["d"], r["batch"], r["method"]): r for r in measured}
    speedups = [
        by_key[(d, b, "householder_sequential")]["both_ms"] / by_key[(d, b, "householder_wy")]["both_ms"]
        for (d, b, m) in by_key
        if m == "householder_wy" and d == 784 and (d, b, "householder_sequential") in by_key
    ]
    if speedups:
        claims.append(
            {
                "claim": "householder wy >= 5x faster than sequential (forward+backward) at d = 784 (worst batch)",
                "figure": round(min(speedups), 2),
                "holds": min(speedups) >= 5,
            }
        )
    others = ("householder_wy", "torch_householder", "cayley", "matrix_exp")
    for d, b in sorted({(r["d"], r["batch"]) for r in measured}):
        if d < 784 or b < 1024 or (d, b, "aux") not in by_key:
            continue
        fastest = min((by_key[(d, b, m)]["both_ms"], m) for m in others if (d, b, m) in by_key)
        speedup = fastest[0] / by_key[(d, b, "aux")]["both_ms"]
        claims.append(
            {
                "claim": f"aux faster than the fastest other orthogonal map ({fastest[1]}) at d={d}, B={b}",
                "figure": round(speedup, 2),
                "holds": speedup > 1,
            }
        )
    return claims


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    measured = [r for r in rows if "both_ratio_to_linear" in r]
    batches = sorted({r["batch"] for r in measured})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        for method in METHODS[1:]:
            pts = sorted(
                (r["d"], r["both_ratio_to_linear"]) for r in measured if r["batch"] == batch and r["method"] == method
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=method)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="d", ylabel="forward+backward time / nn.Linear", title=f"B = {batch}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small grid for smoke tests")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--output-suffix", default="", help="appended to the result file name (e.g. -quick)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    random.seed(0)
    dims, batches = (QUICK_DIMS, QUICK_BATCHES) if args.quick else (FULL_DIMS, FULL_BATCHES)
    rounds = args.rounds or (2 if args.quick else 5)
    rows = measure(dims, batches, rounds, 0.02 if args.quick else 0.2, device)
    claims = claims_from(rows)
    suffix = args.output_suffix or ("-quick" if args.quick else "")
    path = write_result("bench_orthogonal", device, rows, claims, suffix=suffix)
    plot(rows, RESULTS / f"bench_orthogonal-{hardware_name(device)}{suffix}.png")
    for claim in claims:
        print(f"[{'holds' if claim['holds'] else 'DOES NOT HOLD'}] {claim['claim']}: {claim['figure']}")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
