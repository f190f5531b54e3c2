"""The measurements of benchmarks/bench_orthogonal.py: its grid of orthogonal maps beside ``nn.Linear``
(:func:`measure`), the paper's FCNN trained for an epoch with each map (:func:`measure_fcnn`), the sizes and the
claims (:func:`claims_from`). benchmarks/gpu_suite.py runs the same measurements on a GPU. The protocol is in
bench_orthogonal's docstring."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import nn

from benchmarks._common import interleave, synchronizer
from lightning_ortho.nn import AuxiliaryReflection, HouseholderProduct, ParametrizedOrthogonal, SVDLinear

#: method -> geotorch.orthogonal's ``triv`` (its default is "expm").
GEOTORCH_METHODS = {"geotorch": "expm", "geotorch_cayley": "cayley"}
METHODS = (
    "linear",
    "aux",
    "householder_sequential",
    "householder_wy",
    "torch_householder",
    "cayley",
    "matrix_exp",
    *GEOTORCH_METHODS,
)
#: FCNN method -> lightning_ortho's orthogonal_map name (geotorch's maps replace SVDLinear's after construction).
FCNN_METHODS = {"aux": "aux", "householder_wy": "householder", "cayley": "cayley", "matrix_exp": "matrix_exp"}
FCNN_METHODS.update(dict.fromkeys(GEOTORCH_METHODS, "aux"))
#: (d, training images) of the FCNN epoch: the paper's width and the 4,000 training images of mnist5k.py.
FCNN_FULL, FCNN_QUICK = (784, 4000), (64, 384)
FCNN_BATCH, FCNN_LR, FCNN_DEPTH, FCNN_CLASSES = 128, 1e-3, 3, 10
#: Seconds of epochs after which an FCNN method is measured for only two rounds (matrix_exp: about a minute
#: per epoch at d = 784 on 2 cores).
FCNN_SLOW_BUDGET = 120.0
FULL_DIMS, FULL_BATCHES = (64, 256, 784, 2048), (32, 1024, 16384)
QUICK_DIMS, QUICK_BATCHES = (64, 256), (32, 1024)
#: Seconds of forward+backward after which a method is measured for only two rounds (matrix_exp and
#: torch's householder take ~20 s per call at d = 2048 on 2 cores).
SLOW_METHOD_BUDGET = 30.0
#: Autograd keeps one (B, d) activation per sequential reflection; above this the run would swap or die.
SEQUENTIAL_MEMORY_LIMIT = 4 * 2**30


def build(method: str, d: int, geotorch: ModuleType | None = None) -> nn.Module:
    if method in GEOTORCH_METHODS:
        return geotorch.orthogonal(nn.Linear(d, d, bias=False), "weight", triv=GEOTORCH_METHODS[method])
    if method == "linear":
        return nn.Linear(d, d, bias=False)
    if method == "aux":
        return AuxiliaryReflection(d)
    if method == "householder_sequential":
        return HouseholderProduct(d, strategy="sequential")
    if method == "householder_wy":
        return HouseholderProduct(d, strategy="wy")
    return ParametrizedOrthogonal(d, "householder" if method == "torch_householder" else method)


def skip_reason(
    method: str, d: int, batch: int, device: torch.device, geotorch_missing: str | None = None
) -> str | None:
    if method in GEOTORCH_METHODS and geotorch_missing:
        return f"geotorch not available: {geotorch_missing}"
    if method == "householder_sequential":
        memory = d * batch * d * 4
        if memory > SEQUENTIAL_MEMORY_LIMIT:
            return f"autograd would hold d={d} activations of {batch}x{d} floats ({memory / 2**30:.0f} GiB)"
        if device.type == "cpu" and d >= 2048:
            return "d=2048 sequential steps take minutes per call on CPU"
    return None


def measure(
    dims,
    batches,
    rounds: int,
    min_time: float,
    device: torch.device,
    methods=METHODS,
    geotorch: ModuleType | None = None,
    geotorch_missing: str | None = None,
) -> list[dict]:
    rows = []
    for d in dims:
        for batch in batches:
            torch.manual_seed(0)
            x = torch.randn(batch, d, device=device, requires_grad=True)
            grad = torch.randn(batch, d, device=device)
            modules = {}
            for method in methods:
                reason = skip_reason(method, d, batch, device, geotorch_missing)
                if reason:
                    rows.append({"d": d, "batch": batch, "method": method, "skipped": reason})
                    continue
                torch.manual_seed(0)
                modules[method] = build(method, d, geotorch).to(device)

            def calls(module: nn.Module) -> dict:
                def forward():
                    module.zero_grad(set_to_none=True)
                    x.grad = None
                    return module(x)

                return {"forward": forward, "backward": lambda y: y.backward(grad)}

            # Methods that already spent SLOW_METHOD_BUDGET seconds stop after two rounds.
            timing = interleave(
                {method: calls(module) for method, module in modules.items()},
                rounds=rounds,
                min_time=min_time,
                synchronize=synchronizer(device),
                budget=SLOW_METHOD_BUDGET,
            )
            for method in modules:
                row = {"d": d, "batch": batch, "method": method, "rounds": timing.rounds(method)}
                for kind, phase in (("forward", "forward"), ("backward", "backward"), ("both", "total")):
                    row[f"{kind}_ms"] = 1e3 * timing.best(method, phase)
                    row[f"{kind}_median_ms"] = 1e3 * timing.median(method, phase)
                    if "linear" in modules:
                        row[f"{kind}_ratio_to_linear"] = timing.ratio(method, "linear", phase)
                rows.append(row)
                print(
                    f"d={d:5d} B={batch:6d} {method:24s} fwd {row['forward_ms']:9.2f} ms  fwd+bwd {row['both_ms']:9.2f} ms"
                    + (f"  x{row['both_ratio_to_linear']:.2f} of Linear" if "both_ratio_to_linear" in row else ""),
                    flush=True,
                )
    return rows


def build_fcnn(method: str, d: int, geotorch: ModuleType | None = None) -> nn.Module:
    """OrthogonalClassifier's network as a plain nn.Sequential: FCNN_DEPTH SVDLinear layers with ReLU after each,
    then nn.Linear(d, 10). For a geotorch method, each SVDLinear's ``left`` (U) and ``right`` (V^T) maps are
    replaced by geotorch's orthogonal ``nn.Linear(d, d, bias=False)``; the singular values, bias and forward stay."""
    layers: list[nn.Module] = []
    for _ in range(FCNN_DEPTH):
        layer = SVDLinear(d, d, orthogonal=FCNN_METHODS[method])
        if method in GEOTORCH_METHODS:
            layer.left, layer.right = build(method, d, geotorch), build(method, d, geotorch)
        layers += [layer, nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(d, FCNN_CLASSES))


def fcnn_data(d: int, images: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(x (images, d) float32 in [0, 1], labels (images,) int64, description)``: ``images`` of the 4,000 real
    MNIST training digits of benchmarks/mnist5k.py (resized to sqrt(d) x sqrt(d) where d != 784), or uniform
    random pixels and labels of the same shape where those cannot be had (the description says why)."""
    generator = torch.Generator().manual_seed(seed)
    side = round(d**0.5)
    try:
        if side * side != d:
            raise ValueError(f"d = {d} is not the number of pixels of a square image")
        from benchmarks import mnist5k

        raw = mnist5k.prepare() / "MNIST" / "raw"
        pixels = np.frombuffer((raw / "train-images-idx3-ubyte").read_bytes(), np.uint8, offset=16)
        labels = np.frombuffer((raw / "train-labels-idx1-ubyte").read_bytes(), np.uint8, offset=8)
        pixels = pixels.reshape(len(labels), 28, 28)
        if images > len(labels):
            raise ValueError(f"{images} images asked, mnist5k has {len(labels)} training images")
    except Exception as error:  # no network for the wheel, a broken file: time on random data instead
        x = torch.rand(images, d, generator=generator)
        y = torch.randint(0, FCNN_CLASSES, (images,), generator=generator)
        return x, y, f"random uniform pixels and labels ({type(error).__name__}: {error})"
    keep = torch.randperm(len(labels), generator=generator)[:images].sort().values.numpy()
    x = torch.from_numpy(pixels[keep].astype(np.float32) / 255.0)
    size = "28x28"
    if side != 28:
        x = nn.functional.interpolate(x[:, None], size=(side, side), mode="bilinear", antialias=True)[:, 0]
        size = f"resized to {side}x{side}"
    y = torch.from_numpy(labels[keep].astype(np.int64))
    return x.reshape(images, d), y, f"mnist5k: {images} of the 4,000 real MNIST training images ({size}, pixels / 255)"


def train_epoch(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, batches, device) -> float:
    """One pass over ``batches`` (index tensors): forward, cross-entropy, backward, Adam step; returns the mean
    training loss (read after the pass, so that timing it needs no host sync inside)."""
    total = torch.zeros((), device=device)
    for index in batches:
        loss = nn.functional.cross_entropy(model(x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return float(total) / len(batches)


def measure_fcnn(
    d: int,
    images: int,
    rounds: int,
    device: torch.device,
    methods=None,
    geotorch: ModuleType | None = None,
    geotorch_missing: str | None = None,
    data: tuple[torch.Tensor, torch.Tensor, str] | None = None,
) -> tuple[list[dict], str]:
    """One FCNN per method (same seed), trained one epoch per round on the same batches in the same order,
    methods interleaved in a random order within each round (default: every FCNN_METHODS). Returns
    ``(rows, data description)``."""
    methods = tuple(FCNN_METHODS) if methods is None else methods
    x, y, source = data or fcnn_data(d, images)
    x, y = x.to(device), y.to(device)
    base = {"section": "fcnn_epoch", "d": d, "batch": FCNN_BATCH, "images": len(y)}
    skipped, models, optimizers = {}, {}, {}
    for method in methods:
        if method in GEOTORCH_METHODS and geotorch_missing:
            skipped[method] = f"geotorch not available: {geotorch_missing}"
            continue
        torch.manual_seed(0)
        models[method] = build_fcnn(method, d, geotorch).to(device)
        optimizers[method] = torch.optim.Adam(models[method].parameters(), lr=FCNN_LR)
    generator = torch.Generator().manual_seed(0)
    warm_up = [torch.randperm(len(y), generator=generator)[:FCNN_BATCH].to(device)]
    for method in models:  # one untimed step each (allocator, lazy init, LAPACK workspaces)
        train_epoch(models[method], optimizers[method], x, y, warm_up, device)
    batches = [torch.randperm(len(y), generator=generator).to(device).split(FCNN_BATCH)]  # this round's order

    def next_round(index, timing) -> None:
        if index + 1 < rounds:
            batches[0] = torch.randperm(len(y), generator=generator).to(device).split(FCNN_BATCH)

    timing = interleave(
        {m: lambda m=m: train_epoch(models[m], optimizers[m], x, y, batches[0], device) for m in models},
        rounds=rounds,
        warmup=0,
        synchronize=synchronizer(device),
        budget=FCNN_SLOW_BUDGET,
        after_round=next_round,
    )
    rows = []
    for method in methods:
        if method in skipped:
            rows.append({**base, "method": method, "skipped": skipped[method]})
            continue
        row = {**base, "method": method, "batches": len(batches[0]), "rounds": timing.rounds(method)}
        row["epoch_s"], row["epoch_median_s"] = timing.best(method), timing.median(method)
        if "aux" in models:
            row["epoch_ratio_to_aux"] = timing.ratio(method, "aux")
        losses = timing.results[method]
        row["train_loss_first_epoch"], row["train_loss_last_epoch"] = losses[0], losses[-1]
        rows.append(row)
        print(
            f"FCNN d={d} {method:16s} epoch {row['epoch_s']:8.3f} s"
            + (f"  x{row['epoch_ratio_to_aux']:.2f} of aux" if "epoch_ratio_to_aux" in row else "")
            + f"  loss {row['train_loss_first_epoch']:.3f} -> {row['train_loss_last_epoch']:.3f}",
            flush=True,
        )
    return rows, source


def claims_from(rows: list[dict]) -> list[dict]:
    """The speed targets and the paper's claims, computed from measured rows (map rows and FCNN-epoch rows)."""
    measured = [r for r in rows if "skipped" not in r and "section" not in r]
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
    others = ("householder_wy", "torch_householder", "cayley", "matrix_exp", *GEOTORCH_METHODS)
    for d, b in sorted({(r["d"], r["batch"]) for r in measured}):
        if d < 784 or b < 1024 or (d, b, "aux") not in by_key:
            continue
        aux_ms = by_key[(d, b, "aux")]["both_ms"]
        candidates = [(by_key[(d, b, m)]["both_ms"], m) for m in others if (d, b, m) in by_key]
        if candidates:
            fastest = min(candidates)
            claims.append(
                {
                    "claim": f"aux faster than the fastest other orthogonal map ({fastest[1]}) at d={d}, B={b}",
                    "figure": round(fastest[0] / aux_ms, 2),
                    "holds": fastest[0] / aux_ms > 1,
                }
            )
        geotorch = [(by_key[(d, b, m)]["both_ms"], m) for m in GEOTORCH_METHODS if (d, b, m) in by_key]
        if geotorch:
            fastest = min(geotorch)
            claims.append(
                {
                    "claim": f"aux faster than geotorch's faster trivialization ({fastest[1]}) at d={d}, B={b}",
                    "figure": round(fastest[0] / aux_ms, 2),
                    "holds": fastest[0] / aux_ms > 1,
                }
            )
    fcnn = {r["method"]: r for r in rows if r.get("section") == "fcnn_epoch" and "skipped" not in r}
    if "aux" in fcnn:
        aux_s, d = fcnn["aux"]["epoch_s"], fcnn["aux"]["d"]
        for label, names in (
            ("the fastest other map", [m for m in fcnn if m != "aux"]),
            ("geotorch's faster trivialization", [m for m in GEOTORCH_METHODS if m in fcnn]),
        ):
            if names:
                seconds, fastest = min((fcnn[m]["epoch_s"], m) for m in names)
                claims.append(
                    {
                        "claim": f"aux FCNN epoch >= 2x faster than {label} ({fastest}) at d={d} "
                        "(paper: 2-6x); figure = speed-up",
                        "figure": round(seconds / aux_s, 2),
                        "holds": seconds / aux_s >= 2,
                    }
                )
    return claims
