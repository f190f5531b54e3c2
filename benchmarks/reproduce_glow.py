"""Section 3.3 / Figure 5 of "One Reflection Suffice" on the embedded digits: Glow with each 1x1 convolution.

    python -m benchmarks.reproduce_glow            # 3 seeds x 5 kinds x 10 epochs (~15 minutes on 2 CPU cores)
    python -m benchmarks.reproduce_glow --quick    # smoke run

Glow (L = 3 scales, K = 4 steps, C = 32 hidden channels) trained by maximum likelihood on scikit-learn's 8x8
digits (17 grey levels, uniform dequantisation) with the same budget for every kind of 1x1 convolution:
plain, LU, Householder (c reflections), aux (unconstrained W = I - Q) and aux_invertible (Theorem 2).
After training every validation image is encoded and decoded (Newton for the aux kinds) to test invertibility.

Claims tested (paper): unconstrained aux ties Householder (within 0.05 bits/dim); aux_invertible is worse
than Householder; Newton inverts every trained aux model (every seed reconstructs the validation set to
1e-3 with every Newton solve converged).

Writes benchmarks/results/reproduce_glow-HARDWARE.json, .png, and a grid of samples (-samples.png).
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks._common import (
    benchmark_parser,
    configured,
    keep_freed_memory,
    parse_args,
    print_claims,
    reject,
    result_path,
    write_result,
)
from benchmarks._reproduce import aggregate, final_means, plot_curves, train_once
from lightning_ortho.datamodules import DigitsDataModule
from lightning_ortho.flows import CONV1X1_KINDS, dequantize, diagnostics
from lightning_ortho.models import GlowModule
from lightning_ortho.nn import NewtonInverseError


def inversion_check(model: GlowModule, data: DigitsDataModule) -> dict:
    """Encode and decode every validation image (pixel centres); count Newton failures and the worst
    reconstruction error (lightning_ortho.flows.diagnostics, as GlowInvertibilityCheck logs them)."""
    images = data.split("val").tensors[0]
    y = dequantize(images, model.hparams.num_levels, noise=torch.full_like(images, 0.5))
    result = diagnostics.reconstruction(model.glow, y)
    return {
        "newton_failures": result.newton_failures,
        "reconstruction_max_error": result.max_error,
        "jacobian_sign_flips": diagnostics.jacobian_sign_flips(model.glow, y),
        "layers": len(diagnostics.conv1x1_layers(model.glow)),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("reproduce_glow", __doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hidden-channels", type=int, default=32)
    parser.add_argument("--kinds", nargs="+", default=list(CONV1X1_KINDS), choices=list(CONV1X1_KINDS))
    args = parse_args(parser, argv)
    reject(parser, args, rounds="reproduce_glow trains (see --seeds)", device="reproduce_glow trains on the CPU only")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    allocator = keep_freed_memory()  # as bench_flows: page faults would otherwise dominate CPU epoch times
    if args.quick:
        args.epochs, args.seeds, args.steps, args.hidden_channels = 1, 1, 1, 8
    rows, inversions, sample_grids = [], [], {}
    for kind in args.kinds:
        for seed in range(args.seeds):

            def build(kind=kind):
                model = GlowModule(
                    image_size=8,
                    levels=3,
                    steps=args.steps,
                    hidden_channels=args.hidden_channels,
                    conv1x1=kind,
                    num_levels=17,
                    lr=1e-3,
                    warmup_steps=50,
                )
                return model, DigitsDataModule(batch_size=64, flatten=False, standardize=False)

            extra = {"limit_train_batches": 2, "limit_val_batches": 1} if args.quick else {}
            recorded, model, data = train_once(
                build, seed, args.epochs, return_model=True, gradient_clip_val=50.0, **extra
            )
            for row in recorded:
                rows.append({"method": kind, "seed": seed, **row})
                print(
                    f"{kind:15s} seed {seed} epoch {row['epoch']:2d}: val bits/dim {row['val_bpd']:.4f}  train {row['train_seconds']:7.2f} s",
                    flush=True,
                )
            model.eval()
            check = {"method": kind, "seed": seed, **inversion_check(model, data)}
            inversions.append(check)
            print(f"{kind:15s} seed {seed} inversion: {check}", flush=True)
            if seed == 0:
                torch.manual_seed(0)
                try:
                    sample_grids[kind] = (model.glow.sample(16, temperature=0.7) + 0.5).clamp(0, 1)
                except NewtonInverseError:
                    pass
    curves = aggregate(rows, metric="val_bpd")
    claims = claims_from(curves, inversions)
    setup = {
        "epochs": args.epochs,
        "seeds": args.seeds,
        "levels": 3,
        "steps": args.steps,
        "hidden_channels": args.hidden_channels,
        "batch_size": 64,
        "data": "sklearn digits 8x8, 17 levels",
        "optimizer": "Adam lr 1e-3, 50 warm-up steps, clip 50",
    }
    path = write_result(
        "reproduce_glow",
        device,
        rows,
        claims,
        args,
        extra={"allocator": allocator or "default", "curves": curves, "inversions": inversions, "setup": setup},
    )
    plot_curves(
        curves,
        result_path("reproduce_glow", device, args, ".png"),
        "Glow, digits",
        ylabel="validation bits/dim",
        log_y=False,
    )
    if sample_grids:
        from torchvision.utils import make_grid, save_image

        grid = torch.cat([make_grid(g, nrow=16, padding=1, pad_value=1.0) for g in sample_grids.values()], dim=1)
        save_image(grid, result_path("reproduce_glow", device, args, "-samples.png"))
    print_claims(claims)
    return path


def claims_from(curves: dict[str, list[dict]], inversions: list[dict]) -> list[dict]:
    final = final_means(curves, "val_bpd")
    claims = []
    if {"aux", "householder"} <= set(final):
        gap = final["aux"] - final["householder"]
        claims.append(
            {
                "claim": "unconstrained aux ties householder: final val bits/dim within 0.05 (figure = aux - householder)",
                "figure": round(gap, 4),
                "holds": abs(gap) <= 0.05,
            }
        )
    if {"aux_invertible", "householder"} <= set(final):
        gap = final["aux_invertible"] - final["householder"]
        claims.append(
            {
                "claim": "aux_invertible is worse than householder (figure = aux_invertible - householder, bits/dim)",
                "figure": round(gap, 4),
                "holds": gap > 0,
            }
        )
    for kind in ("aux", "aux_invertible"):
        mine = [i for i in inversions if i["method"] == kind]
        if mine:
            bad = sum(1 for i in mine if i["newton_failures"] or not i["reconstruction_max_error"] <= 1e-3)
            claims.append(
                {
                    "claim": f"Newton inverts every trained {kind} model (figure = seeds whose validation set does not reconstruct to 1e-3)",
                    "figure": bad,
                    "holds": bad == 0,
                }
            )
    return claims


if __name__ == "__main__":
    main()
