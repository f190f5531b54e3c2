"""Orthogonal weights on existing modules, side by side: one training step (the weight from its parametrisation,
a loss, the backward pass) of ``lightning_ortho.nn.orthogonal``, torch's
``torch.nn.utils.parametrizations.orthogonal`` and geotorch's ``geotorch.orthogonal``, each with its maps.

    python -m benchmarks.bench_orthogonal_weights            # a few minutes on 2 cores
    python -m benchmarks.bench_orthogonal_weights --quick    # seconds: small shapes (the tests run it)

Shapes (the parameter each library is given; a convolution kernel is given to every library as the matrix
``(out, in * k * k)`` that ours keeps orthogonal, since torch's and geotorch's would read a 4-D kernel as a batch of
``k x k`` matrices): square ``784 x 784``, tall ``30,000 x 50`` and ``4,096 x 256``, the kernel ``256 x 64*3*3``.
The step is ``(W * G).sum().backward()`` for a fixed random ``G``: the parametrisation's forward and backward,
nothing else. Per row, the median over interleaved rounds of the seconds per step (float32, the threads torch
chooses). For a tall ``n x k`` weight torch's and geotorch's Cayley and exponential maps pad it to ``n x n``, and
torch's Householder map forms ``n x n`` matrices in its backward: from ``n >= 2048`` on those are timed once (one
step is seconds), their exponentials not at all (minutes a step; their Cayley map, cheaper, stands for them), and
where the ``n x n`` matrices would need more than half the machine's memory they are not run either. geotorch is pinned (``GEOTORCH`` of benchmarks/_peers.py) and installed into
benchmarks/.peers on first use; without it its columns say why.

Claim: ours (the fastest of its maps) at most 1.0x the fastest peer in every row where a peer runs.

Writes benchmarks/results/bench_orthogonal_weights-HARDWARE.json.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch
from torch import nn
from torch.nn.utils import parametrizations

from benchmarks._common import (
    benchmark_parser,
    claim,
    configured,
    interleave,
    parse_args,
    print_claims,
    write_result,
)
from benchmarks._peers import GEOTORCH, load_geotorch
from lightning_ortho.nn import orthogonal

#: name -> (rows, columns)
FULL_SHAPES = {"square 784": (784, 784), "tall 30000x50": (30000, 50), "tall 4096x256": (4096, 256)}
FULL_SHAPES["conv 256x(64*3*3)"] = (256, 64 * 3 * 3)
QUICK_SHAPES = {"square 32": (32, 32), "tall 300x8": (300, 8), "conv 16x(4*3*3)": (16, 4 * 3 * 3)}
OURS = {"ours householder": "householder", "ours cayley": "cayley", "ours matrix_exp": "matrix_exp"}
TORCH = {"torch householder": "householder", "torch cayley": "cayley", "torch matrix_exp": "matrix_exp"}
GEOTORCH_TRIV = {"geotorch expm": "expm", "geotorch cayley": "cayley"}
#: the maps that form n x n matrices for a tall (n, k) weight: torch's and geotorch's Cayley and exponential pad it
#: to n x n; torch's Householder map forms them in its backward (torch.linalg.householder_product's)
SQUARE_FORMING = {"torch householder", "torch cayley", "torch matrix_exp", *GEOTORCH_TRIV}
#: from this n on, those maps of a tall weight are timed once (a step is seconds to minutes)
HEAVY_N = 2048
#: the exponentials among them, not run from HEAVY_N on: an n x n exponential and its backward (a 2n x 2n one) take
#: minutes a step here, and an n x n Cayley map, which runs, is always the cheaper of the two
EXPONENTIALS = {"torch matrix_exp", "geotorch expm"}


class _Holder(nn.Module):
    def __init__(self, rows: int, columns: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, columns))
        nn.init.orthogonal_(self.weight)


def build(name: str, rows: int, columns: int, geotorch: ModuleType | None) -> nn.Module:
    """The parametrised holder of a ``(rows, columns)`` weight for implementation ``name``."""
    holder = _Holder(rows, columns)
    if name in OURS:
        return orthogonal(holder, map=OURS[name])
    if name in TORCH:
        return parametrizations.orthogonal(holder, orthogonal_map=TORCH[name])
    return geotorch.orthogonal(holder, "weight", triv=GEOTORCH_TRIV[name])


def square_bytes(rows: int, columns: int) -> int:
    """What an ``n x n`` map of a ``(rows, columns)`` weight holds at once, estimated: about ten float32 ``n x n``
    matrices (the padded matrix, its exponential's work, autograd's saved tensors)."""
    n = max(rows, columns)
    return 10 * n * n * 4


def memory_limit() -> int:
    """Half the machine's physical memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def measure(shapes: dict, rounds: int, budget: float, geotorch: ModuleType | None, missing: str | None) -> list[dict]:
    rows = []
    names = [*OURS, *TORCH, *GEOTORCH_TRIV]
    for label, (n, k) in shapes.items():
        row: dict = {"shape": label, "rows": n, "columns": k, "seconds": {}, "not_run": {}}
        calls = {}
        for name in names:
            if name in GEOTORCH_TRIV and geotorch is None:
                row["not_run"][name] = f"geotorch not available: {missing}"
                continue
            if name in SQUARE_FORMING and n != k and square_bytes(n, k) > memory_limit():
                row["not_run"][name] = (
                    f"forms a {max(n, k)} x {max(n, k)} matrix: about {square_bytes(n, k) / 2**30:.0f} GiB, more than"
                    f" half of this machine's {2 * memory_limit() / 2**30:.0f} GiB"
                )
                continue
            if name in EXPONENTIALS and n != k and max(n, k) >= HEAVY_N:
                row["not_run"][name] = (
                    f"exponentiates a {max(n, k)} x {max(n, k)} matrix (its backward a {2 * max(n, k)} x"
                    f" {2 * max(n, k)} one): minutes a step here; the same library's n x n Cayley map, cheaper, runs"
                )
                continue
            torch.manual_seed(0)
            module = build(name, n, k, geotorch)
            target = torch.randn(n, k)

            def step(module=module, target=target) -> None:
                module.zero_grad(set_to_none=True)
                (module.weight * target).sum().backward()

            calls[name] = step
        # an n x n exponential of a tall weight takes minutes here: one timed call, no warm-up
        heavy = {name: call for name, call in calls.items() if name in SQUARE_FORMING and n != k and n >= HEAVY_N}
        light = {name: call for name, call in calls.items() if name not in heavy}
        timing = interleave(light, rounds=rounds, warmup=1, budget=budget)
        for name in light:
            row["seconds"][name] = timing.median(name)
        if heavy:
            once = interleave(heavy, rounds=1, warmup=0)
            for name in heavy:
                row["seconds"][name] = once.median(name)
            row["timed_once"] = sorted(heavy)
        ours = min(row["seconds"][name] for name in OURS)
        peers = {name: s for name, s in row["seconds"].items() if name not in OURS}
        row["ours_best"] = min(OURS, key=lambda name: row["seconds"][name])
        if peers:
            fastest = min(peers, key=peers.get)
            row["fastest_peer"], row["ratio"] = fastest, ours / peers[fastest]
        rows.append(row)
        shown = ", ".join(f"{name} {1e3 * s:.3g} ms" for name, s in row["seconds"].items())
        print(f"{label}: {shown}; ours / fastest peer {row.get('ratio', float('nan')):.2f}", flush=True)
    return rows


def claims_from(rows: list[dict]) -> list[dict]:
    measured = [row for row in rows if "ratio" in row]
    worst = max((row["ratio"] for row in measured), default=float("nan"))
    text = "ours (its fastest map) / the fastest peer, one training step, every shape a peer runs: <= 1.0x"
    return [claim(text, round(worst, 3), worst <= 1.0)]


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("bench_orthogonal_weights", __doc__)
    args = parse_args(parser, argv)
    with configured(args):
        shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
        geotorch, missing = load_geotorch()
        rows = measure(shapes, args.rounds or (2 if args.quick else 5), 0.5 if args.quick else 20.0, geotorch, missing)
        peer = {"requirement": GEOTORCH}
        peer.update({"skipped": missing} if missing else {"version": geotorch.__version__, "path": "benchmarks/.peers"})
        claims = claims_from(rows)
        path = write_result(
            "bench_orthogonal_weights", torch.device("cpu"), rows, claims, args, extra={"peers": {"geotorch": peer}}
        )
    print_claims(claims)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
