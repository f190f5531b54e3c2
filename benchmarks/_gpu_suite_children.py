"""The sections of benchmarks/gpu_suite.py that run in processes of their own, so that a crash there (a DDP
rendezvous that fails, a compiler that takes the interpreter down) cannot stop the suite:

    python -m benchmarks._gpu_suite_children ddp --device cuda --out FOLDER        # two-process DDP fit
    python -m benchmarks._gpu_suite_children compiled --device cuda --out FOLDER   # compiled chunk against eager

Both fit recipes/online_adding.yaml (``OnlineRNNModule``, ``TanhRNNCell(1, 32)``, UORO, one Adam update per time
step) at a small size, built as the CLI builds it (seeded, then
:func:`benchmarks._small_processes.build_recipe`), and write what they measured as JSON files into ``--out``;
the suite reads them.

* ``ddp``: ``Trainer(strategy=DDPStrategy(process_group_backend=...), devices=2)`` with ``nccl`` on CUDA and
  ``gloo`` on the CPU (``accelerator="cpu"``). Lightning starts the second rank by running this same command again
  (its subprocess launcher); the rendezvous address and port come from ``MASTER_ADDR`` / ``MASTER_PORT`` in the
  environment (the suite picks a free port). Each rank writes ``ddp-rank{R}.json``: its chunks' seconds (device
  synchronised before and after), the time steps per chunk, and a SHA-1 of its parameters after the fit (DDP keeps
  the ranks' parameters equal: the suite compares them).
* ``compiled``: the same fit twice from the same seed, eager and ``OnlineRNNModule(compile=True)`` (a chunk of steps
  as one compiled region; CUDA graphs on CUDA where capturable), each chunk timed; writes ``compiled.json`` with the
  chunk times of both, the first chunk apart (it compiles), and the largest difference between the two fits'
  parameters. The suite runs it only where the constructor has a ``compile`` argument.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

from benchmarks import _small_processes
from benchmarks._common import synchronize
from lightning_ortho._lightning import pl

#: The recipe's data module sizes (full, quick): streams over all processes (divisible by 2 for DDP).
SIZES = (
    {"streams": 32, "chunk_length": 32, "chunks_per_epoch": 6, "val_streams": 2, "val_chunks": 1},
    {"streams": 4, "chunk_length": 4, "chunks_per_epoch": 3, "val_streams": 2, "val_chunks": 1},
)
#: The rendezvous of the DDP child where the environment names none.
DEFAULT_MASTER_ADDR = "127.0.0.1"


class ChunkTimer(pl.Callback):
    """Seconds of every training batch (one chunk of the stream), the device synchronised before and after, so
    that a GPU's queued work counts in the chunk that queued it."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds, self.start = device, [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        synchronize(self.device)
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        synchronize(self.device)
        self.seconds.append(time.perf_counter() - self.start)


def accelerator(device: torch.device) -> str:
    """Lightning's accelerator name of ``device``."""
    return "gpu" if device.type == "cuda" else device.type


def backend(device: torch.device) -> str:
    """The process group backend of a DDP run on ``device``: ``nccl`` on CUDA, ``gloo`` on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def parameters_digest(model: torch.nn.Module) -> str:
    """SHA-1 of the model's parameters (float64 bytes in ``named_parameters`` order): equal digests, equal weights."""
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in model.parameters()])
    return hashlib.sha1(flat.numpy().tobytes()).hexdigest()


def _trainer(root: str, device: torch.device, callbacks: list, **overrides) -> pl.Trainer:
    return pl.Trainer(
        **{
            "accelerator": accelerator(device),
            "devices": 1,
            "max_epochs": 1,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": root,
            "callbacks": callbacks,
            **overrides,
        }
    )


@contextlib.contextmanager
def _quiet():
    loggers = [logging.getLogger(n) for n in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def build(sizes: dict, **model_overrides):
    """``(model, data)`` of the recipe at ``sizes``, built after seeding with the recipe's ``seed_everything`` (as
    the CLI does): the same initial weights in every build."""
    recipe = yaml.safe_load(_small_processes.RECIPE.read_text())
    pl.seed_everything(recipe.get("seed_everything", 0), verbose=False)
    model, data, _, _ = _small_processes.build_recipe(sizes, **model_overrides)
    return model, data


def fit(device: torch.device, sizes: dict, root: str, **model_overrides) -> tuple[pl.LightningModule, list[float]]:
    """``(model, seconds per chunk)`` of one single-process fit of the recipe at ``sizes`` on ``device``."""
    model, data = build(sizes, **model_overrides)
    timer = ChunkTimer(device)
    with _quiet():
        _trainer(root, device, [timer]).fit(model, datamodule=data)
    return model, timer.seconds


# -- the two-process DDP fit ---------------------------------------------------------------------------------------
class RankReport(pl.Callback):
    """At the end of training, writes this rank's ``ddp-rank{R}.json`` into ``out`` (all ranks are still there)."""

    def __init__(self, out: Path, timer: ChunkTimer, chunk_length: int) -> None:
        self.out, self.timer, self.chunk_length = out, timer, chunk_length

    def on_train_end(self, trainer, pl_module) -> None:
        report = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "chunk_seconds": self.timer.seconds,
            "steps_per_chunk": self.chunk_length,
            "global_step": trainer.global_step,
            "parameters_sha1": parameters_digest(pl_module),
            "finished": True,
        }
        (self.out / f"ddp-rank{trainer.global_rank}.json").write_text(json.dumps(report, indent=1) + "\n")


def ddp(device: torch.device, quick: bool, out: Path) -> None:
    """Fit the recipe on two processes of ``device`` (this one and the one Lightning starts) and write each rank's
    report into ``out``."""
    DDPStrategy = pl.strategies.DDPStrategy  # the Lightning package the program uses (lightning or pytorch_lightning)

    os.environ.setdefault("MASTER_ADDR", DEFAULT_MASTER_ADDR)
    sizes = SIZES[int(quick)]
    model, data = build(sizes)
    timer = ChunkTimer(device)
    with tempfile.TemporaryDirectory(prefix="gpu_suite-ddp-") as root, _quiet():
        trainer = _trainer(
            root,
            device,
            [timer, RankReport(out, timer, sizes["chunk_length"])],
            devices=2,
            strategy=DDPStrategy(process_group_backend=backend(device)),
        )
        trainer.fit(model, datamodule=data)
    # Destroyed here, before the interpreter exits: gloo's teardown at exit can abort a process that finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# -- a compiled chunk against eager --------------------------------------------------------------------------------
def dynamo_counts() -> dict:
    """What the compiler counted in this process: graph breaks and graphs made (``torch._dynamo``'s counters, a
    private API: ``None`` where it is not there)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {"graph_breaks": None, "graphs": None}
    return {"graph_breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"].get("unique_graphs")}


def compiled(device: torch.device, quick: bool, out: Path) -> dict:
    """Fit the recipe eagerly and with ``compile=True`` from the same seed; write and return ``compiled.json``'s
    figures: per-chunk seconds of both (the first chunk, which compiles, apart), steady-state milliseconds per time
    step and their ratio, and the largest absolute difference of the two fits' parameters."""
    sizes = SIZES[int(quick)]
    steps = sizes["chunk_length"]
    result: dict = {"sizes": sizes, "steps_per_chunk": steps}
    parameters = {}
    with tempfile.TemporaryDirectory(prefix="gpu_suite-compiled-") as root:
        for name, options in (("eager", {}), ("compiled", {"compile": True})):
            started = time.perf_counter()
            model, seconds = fit(device, sizes, root, **options)
            steady = seconds[1:] or seconds
            result[name] = {
                "fit_seconds": time.perf_counter() - started,
                "first_chunk_s": seconds[0],
                "chunk_seconds": seconds,
                "ms_per_step": 1e3 * statistics.median(steady) / steps,
            }
            parameters[name] = [p.detach().to("cpu", torch.float64) for p in model.parameters()]
    result["compiled"] |= dynamo_counts()
    result["compiled_over_eager"] = result["compiled"]["ms_per_step"] / result["eager"]["ms_per_step"]
    result["max_abs_parameter_difference"] = max(
        float((a - b).abs().max()) for a, b in zip(parameters["eager"], parameters["compiled"], strict=True)
    )
    (out / "compiled.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._gpu_suite_children", description=__doc__)
    parser.add_argument("section", choices=("ddp", "compiled"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    (ddp if args.section == "ddp" else compiled)(device, args.quick, args.out)


if __name__ == "__main__":
    main()
