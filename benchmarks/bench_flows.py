"""Speed of the invertible 1x1 convolutions of lightning_ortho.flows, side by side, and Newton statistics.

    python -m benchmarks.bench_flows            # c in {12, 24, 48} (a few minutes on 2 CPU cores)
    python -m benchmarks.bench_flows --quick    # smoke run

For each kind (plain, lu, householder, aux, aux_invertible) on a batch of 32 images of 16x16 pixels
(8192 pixel vectors of c channels): forward + log-determinant, the backward pass after it, and the inverse.
The auxiliary log-determinant (Lemma 1 with one eigendecomposition of W, O(c^2) per pixel) is also timed
against the per-pixel route: Theorem 3's Jacobian for every pixel and torch.linalg.slogdet (O(c^3) per pixel).
Newton statistics (iterations mean/max, failures, worst relative residual) for aux with a perturbed W and
for aux_invertible with a random V. Every kind's forward+backward and each inverse are named callables of one
interleaved loop (a random order per round, after one untimed round); forward+backward repeat for at least 0.2 s
per round, the inverse is one call per round; the best round is reported.

Targets: aux log-det >= 10x faster than per-pixel slogdet at c = 48; aux forward+log-det within 2x of LU.
Writes benchmarks/results/bench_flows-HARDWARE.json.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks._common import (
    benchmark_parser,
    configured,
    interleave,
    keep_freed_memory,
    parse_args,
    print_claims,
    reject,
    write_result,
)
from lightning_ortho.flows import CONV1X1_KINDS, Invertible1x1Conv, invertible_1x1_conv
from lightning_ortho.flows.conv1x1.base import to_rows


class PerPixelSlogdet(torch.nn.Module):
    """The aux 1x1 convolution with its log-determinant from per-pixel dense Jacobians and slogdet."""

    def __init__(self, layer: Invertible1x1Conv) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = to_rows(x)
        y = self.layer.reflection(rows)
        log_det = self.layer.reflection.log_abs_det_jacobian(rows, method="dense").reshape(x.shape[0], -1).sum(1)
        return y, log_det


def perturbed(layer: Invertible1x1Conv, scale: float) -> Invertible1x1Conv:
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("weight") or name.endswith("factor"):
                p.add_(scale * torch.randn_like(p) / p.shape[0] ** 0.5)
    return layer


def measure(channels_list, batch: int, side: int, rounds: int, min_time: float) -> list[dict]:
    rows = []
    for channels in channels_list:
        torch.manual_seed(0)
        x = torch.randn(batch, channels, side, side, requires_grad=True)
        layers = {kind: perturbed(invertible_1x1_conv(channels, kind), 0.1) for kind in CONV1X1_KINDS}
        modules = dict(layers)
        modules["aux (per-pixel slogdet)"] = PerPixelSlogdet(layers["aux"])
        outputs = {kind: layers[kind](x)[0].detach() for kind in CONV1X1_KINDS}

        def step(module):
            def forward():
                module.zero_grad(set_to_none=True)
                x.grad = None
                y, log_det = module(x)
                return y.square().mean() - log_det.mean()

            return {"forward": forward, "backward": lambda loss: loss.backward()}

        def inverse(kind):
            def call():
                with torch.no_grad():
                    layers[kind].inverse(outputs[kind])

            return call

        calls = {name: step(module) for name, module in modules.items()}
        calls.update({f"{kind} inverse": inverse(kind) for kind in layers})
        # Forward+backward repeat for min_time per round, an inverse is one call per round; one warm-up round.
        timing = interleave(calls, rounds=rounds, min_time={name: min_time for name in modules})
        for name in modules:
            row = {"channels": channels, "pixels": batch * side * side, "kind": name}
            row["forward_logdet_ms"] = 1e3 * timing.best(name, "forward")
            row["backward_ms"] = 1e3 * timing.best(name, "backward")
            row["forward_logdet_median_ms"] = 1e3 * timing.median(name, "forward")
            if name in layers:
                row["inverse_ms"] = 1e3 * timing.best(f"{name} inverse")
            if name in ("aux", "aux_invertible"):
                with torch.no_grad():
                    _, result = layers[name].inverse_with_result(outputs[name], raise_on_failure=False)
                row["newton_iterations_mean"] = float(result.iterations.float().mean())
                row["newton_iterations_max"] = int(result.iterations.max())
                row["newton_failures"] = int((~result.converged).sum())
                row["newton_worst_residual"] = float(result.residual.max())
            rows.append(row)
            print(
                f"c={channels:3d} {name:26s} fwd+logdet {row['forward_logdet_ms']:8.2f} ms  backward {row['backward_ms']:8.2f} ms"
                + (f"  inverse {row['inverse_ms']:8.2f} ms" if "inverse_ms" in row else "")
                + (
                    f"  newton {row['newton_iterations_mean']:.1f}/{row['newton_iterations_max']} it, {row['newton_failures']} failed"
                    if "newton_failures" in row
                    else ""
                ),
                flush=True,
            )
    return rows


def claims_from(rows: list[dict]) -> list[dict]:
    index = {(r["channels"], r["kind"]): r for r in rows}
    claims = []
    top = max(r["channels"] for r in rows)
    aux, slow = index[(top, "aux")], index[(top, "aux (per-pixel slogdet)")]
    speedup = slow["forward_logdet_ms"] / aux["forward_logdet_ms"]
    claims.append(
        {
            "claim": f"aux forward+log-det >= 10x faster than per-pixel slogdet at c = {top}",
            "figure": round(speedup, 2),
            "holds": speedup >= 10,
        }
    )
    both = (slow["forward_logdet_ms"] + slow["backward_ms"]) / (aux["forward_logdet_ms"] + aux["backward_ms"])
    claims.append(
        {"claim": f"... including the backward pass, at c = {top}", "figure": round(both, 2), "holds": both >= 10}
    )
    for kind in ("aux", "aux_invertible"):
        for channels in sorted({r["channels"] for r in rows}):
            ratio = index[(channels, kind)]["forward_logdet_ms"] / index[(channels, "lu")]["forward_logdet_ms"]
            claims.append(
                {
                    "claim": f"{kind} forward+log-det within 2x of the LU 1x1 convolution at c = {channels}",
                    "figure": round(ratio, 2),
                    "holds": ratio <= 2,
                }
            )
    failures = sum(r.get("newton_failures", 0) for r in rows if r["kind"] == "aux_invertible")
    claims.append(
        {
            "claim": "Newton inverts every pixel of aux_invertible (provably invertible)",
            "figure": failures,
            "holds": failures == 0,
        }
    )
    return claims


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("bench_flows", __doc__)
    args = parse_args(parser, argv)
    reject(parser, args, device="bench_flows runs on the CPU only")
    with configured(args) as device:
        allocator = keep_freed_memory()
        if args.quick:
            rows = measure((4, 8), batch=4, side=4, rounds=args.rounds or 1, min_time=0.01)
        else:
            rows = measure((12, 24, 48), batch=32, side=16, rounds=args.rounds or 5, min_time=0.2)
        claims = claims_from(rows)
        for row in rows:  # the whole training step of the layer, relative to LU's
            lu = next(r for r in rows if r["channels"] == row["channels"] and r["kind"] == "lu")
            row["step_vs_lu"] = (row["forward_logdet_ms"] + row["backward_ms"]) / (
                lu["forward_logdet_ms"] + lu["backward_ms"]
            )
        path = write_result("bench_flows", device, rows, claims, args, extra={"allocator": allocator or "default"})
    print_claims(claims)
    return path


if __name__ == "__main__":
    main()
