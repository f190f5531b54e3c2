"""The Glow of reproduce_glow.py's budget, built with the public `normflows` library, as a peer.

    python -m benchmarks.peer_normflows            # 3 seeds x 10 epochs on the embedded digits
    python -m benchmarks.peer_normflows --quick

`normflows` is installed only for this script, into benchmarks/.peers (git-ignored), with
`pip install --no-deps --target benchmarks/.peers normflows==1.7.3` (benchmarks/_peers.py) on first use.
Model: normflows.MultiscaleFlow with L = 3 levels of K = 4 GlowBlocks (affine coupling with sigmoid scale,
LU 1x1 convolution, ActNorm; hidden 32 channels) and GlowBase priors, trained with Adam (lr 1e-3, 50 warm-up
steps, gradient clipping 50) on the same dequantised digits (17 levels), batch 64. Bits/dim are computed
with the same formula as lightning_ortho (lightning_ortho.flows.bits_per_dim). Note that normflows' split
priors are unconditional per level, where ours condition on the kept half (Glow's learned prior).

Writes benchmarks/results/peer_normflows-HARDWARE.json.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks._common import benchmark_parser, configured, parse_args, reject, write_result
from benchmarks._peers import import_peer
from benchmarks._reproduce import aggregate
from lightning_ortho.datamodules import DigitsDataModule
from lightning_ortho.flows import bits_per_dim, dequantize

NORMFLOWS = "normflows==1.7.3"


def import_normflows():
    """The pinned normflows, installed into benchmarks/.peers on first use.

    Raises:
        RuntimeError: it cannot be installed or imported (the reason from ``_peers.import_peer``).
    """
    normflows, error = import_peer("normflows", NORMFLOWS)
    if normflows is None:
        raise RuntimeError(f"peer_normflows needs {NORMFLOWS}: {error}")
    return normflows


def build(nf, levels: int, steps: int, hidden: int, channels: int = 1, size: int = 8):
    q0, merges, flows = [], [], []
    for i in range(levels):
        flows_ = [
            nf.flows.GlowBlock(channels * 2 ** (levels + 1 - i), hidden, split_mode="channel", scale=True)
            for _ in range(steps)
        ]
        flows_ += [nf.flows.Squeeze()]
        flows.append(flows_)
        if i > 0:
            merges.append(nf.flows.Merge())
            shape = (channels * 2 ** (levels - i), size // 2 ** (levels - i), size // 2 ** (levels - i))
        else:
            shape = (channels * 2 ** (levels + 1), size // 2**levels, size // 2**levels)
        q0.append(nf.distributions.GlowBase(shape))
    return nf.MultiscaleFlow(q0, flows, merges, class_cond=False)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("peer_normflows", __doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    args = parse_args(parser, argv)
    reject(parser, args, rounds="peer_normflows trains (see --seeds)", device="peer_normflows trains on the CPU only")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    if args.quick:
        args.epochs, args.seeds = 1, 1
    nf = import_normflows()
    data = DigitsDataModule(batch_size=64, flatten=False, standardize=False)
    train, val = data.split("train").tensors[0], data.split("val").tensors[0]
    rows = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = build(nf, levels=3, steps=1 if args.quick else 4, hidden=8 if args.quick else 32)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
        seconds = 0.0
        generator = torch.Generator().manual_seed(seed)
        for epoch in range(1, args.epochs + 1):
            model.train()
            start = time.perf_counter()
            order = torch.randperm(len(train), generator=generator)
            batches = list(order.split(64))[: 2 if args.quick else None]
            for index in batches:
                y = dequantize(train[index], 17)
                loss = bits_per_dim(model.log_prob(y, None), 64, 17).mean()
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 50.0)
                optimizer.step()
                schedule.step()
            epoch_seconds = time.perf_counter() - start
            seconds += epoch_seconds
            model.eval()
            with torch.no_grad():
                bpd = torch.cat(
                    [bits_per_dim(model.log_prob(dequantize(b, 17), None), 64, 17) for b in val.split(256)]
                ).mean()
            rows.append(
                {
                    "method": "normflows (LU, unconditional split priors)",
                    "seed": seed,
                    "epoch": epoch,
                    "val_bpd": float(bpd),
                    "train_seconds": seconds,
                    "epoch_seconds": epoch_seconds,
                }
            )
            print(
                f"normflows seed {seed} epoch {epoch:2d}: val bits/dim {float(bpd):.4f}  train {seconds:7.2f} s",
                flush=True,
            )
    curves = aggregate(rows, metric="val_bpd")
    setup = {
        "library": "normflows 1.7.3",
        "levels": 3,
        "steps": 4,
        "hidden_channels": 32,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "batch_size": 64,
        "optimizer": "Adam lr 1e-3, 50 warm-up steps, clip 50",
    }
    return write_result("peer_normflows", device, rows, [], args, extra={"curves": curves, "setup": setup})


if __name__ == "__main__":
    main()
