"""Speed of one d x d orthogonal(-like) map on a batch, side by side with nn.Linear in the same run, and of one
training epoch of the paper's FCNN with each map.

    python -m benchmarks.bench_orthogonal               # full grid + FCNN epochs (about 20 minutes on 2 CPU cores)
    python -m benchmarks.bench_orthogonal --skip-fcnn   # the map grid only (about 17 minutes)
    python -m benchmarks.bench_orthogonal --quick       # small grid, tiny FCNN, seconds (used by the tests)
    python -m benchmarks.bench_orthogonal --device cuda

Maps: nn.Linear(d, d, bias=False) (the one-matmul baseline), one auxiliary reflection (ours), d Householder
reflections (ours, sequential and compact WY), PyTorch's orthogonal parametrisations (householder, cayley,
matrix_exp), and the peer library geotorch: ``geotorch.orthogonal(nn.Linear(d, d, bias=False), "weight")``
with its default trivialisation ``triv="expm"`` (``base @ matrix_exp(A - A^T)``; column ``geotorch``) and with
``triv="cayley"`` (column ``geotorch_cayley``). geotorch is pinned (GEOTORCH) and installed on first use into
benchmarks/.peers (git-ignored) with ``pip install --no-deps --target``; it is never a dependency of
lightning_ortho. Where it cannot be installed its rows say ``skipped`` with the reason.

Forward (with autograd recording, as in training) and the backward pass that follows it (gradients of input
and parameters) are timed separately in the same loop; forward+backward is their sum. Methods are interleaved
(in a random order) within each round; the best round is reported (``*_ms``; the machine's noise only ever
adds time) beside the median (``*_median_ms``), and ratios to nn.Linear are ratios of best rounds.

FCNN epochs (rows with ``"section": "fcnn_epoch"``): the FCNN of Appendix B.1 (three SVDLinear layers
``U diag(s) V^T`` of width d = 784 with ReLU, then a linear layer to 10 classes, as OrthogonalClassifier; Adam lr
1e-3, batch 128, cross-entropy) trained in a plain PyTorch loop for one epoch per round on the same 4,000
images in the same order for every method: real MNIST digits from benchmarks/mnist5k.py where it can be
prepared, else random data of the same shape (top-level ``fcnn.data`` says which). U and V are aux,
householder (compact WY), torch's cayley / matrix_exp, or geotorch's orthogonal map (expm, cayley), which
replaces SVDLinear's two maps and nothing else. Epoch seconds (forward, loss, backward, optimizer step) are the
best of interleaved rounds (3 by default; a method past FCNN_SLOW_BUDGET seconds stops after two);
``epoch_ratio_to_aux`` is how many times longer than aux's epoch.

Writes benchmarks/results/bench_orthogonal-HARDWARE.json (+ .png); results table: bench_orthogonal_render.py.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks._common import (
    benchmark_parser,
    configured,
    parse_args,
    print_claims,
    pyplot,
    result_path,
    write_result,
)
from benchmarks._orthogonal_rows import (
    FCNN_BATCH,
    FCNN_CLASSES,
    FCNN_DEPTH,
    FCNN_FULL,
    FCNN_LR,
    FCNN_QUICK,
    FULL_BATCHES,
    FULL_DIMS,
    GEOTORCH_METHODS,
    METHODS,
    QUICK_BATCHES,
    QUICK_DIMS,
    claims_from,
    measure,
    measure_fcnn,
)
from benchmarks._peers import GEOTORCH, load_geotorch


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
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
    parser = benchmark_parser("bench_orthogonal", __doc__)
    parser.add_argument("--skip-fcnn", action="store_true", help="time the single maps only, no FCNN epochs")
    parser.add_argument("--fcnn-rounds", type=int, default=None, help="epochs per FCNN method (default 3; 1 quick)")
    args = parse_args(parser, argv)
    with configured(args) as device:
        dims, batches = (QUICK_DIMS, QUICK_BATCHES) if args.quick else (FULL_DIMS, FULL_BATCHES)
        rounds = args.rounds or (2 if args.quick else 5)
        geotorch, missing = load_geotorch()
        peer = {"requirement": GEOTORCH, "triv": GEOTORCH_METHODS}
        peer.update({"skipped": missing} if missing else {"version": geotorch.__version__, "path": "benchmarks/.peers"})
        print(f"geotorch: {peer.get('version') or 'skipped: ' + missing}", flush=True)
        rows = measure(
            dims, batches, rounds, 0.02 if args.quick else 0.2, device, geotorch=geotorch, geotorch_missing=missing
        )
        extra: dict = {"peers": {"geotorch": peer}}
        if not args.skip_fcnn:
            d, images = FCNN_QUICK if args.quick else FCNN_FULL
            fcnn_rounds = args.fcnn_rounds or (1 if args.quick else 3)
            fcnn_rows, source = measure_fcnn(
                d, images, fcnn_rounds, device, geotorch=geotorch, geotorch_missing=missing
            )
            rows += fcnn_rows
            extra["fcnn"] = {
                "model": f"{FCNN_DEPTH} SVDLinear(d, d) layers with ReLU, then Linear(d, {FCNN_CLASSES}), as OrthogonalClassifier",
                "d": d,
                "images": images,
                "batch_size": FCNN_BATCH,
                "optimizer": f"Adam lr {FCNN_LR:g}",
                "rounds": fcnn_rounds,
                "data": source,
            }
        claims = claims_from(rows)
        path = write_result("bench_orthogonal", device, rows, claims, args, extra=extra)
        plot(rows, result_path("bench_orthogonal", device, args, ".png"))
    print_claims(claims)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
