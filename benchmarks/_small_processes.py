"""The rows of benchmarks/bench_small.py that need other processes: ``compress_linear`` in a child stopped at a time
budget, and a recipe's training epoch through ``Trainer.fit`` while spinning children keep other cores busy."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

from benchmarks._common import interleave, median

ROOT = Path(__file__).resolve().parent.parent
#: The recipe of the online_recipe row, and its small size (data module arguments), full and quick.
RECIPE = ROOT / "recipes" / "online_adding.yaml"
RECIPE_SIZES = ({"chunks_per_epoch": 10}, {"chunks_per_epoch": 2, "chunk_length": 8, "streams": 4})
#: The online_recipe row's rounds at most (each is two whole fits).
RECIPE_MAX_ROUNDS = 7
#: Seconds a compress child may spend importing and building before its budget starts.
CHILD_START_SECONDS = 120.0


# -- compress_linear at a budget -----------------------------------------------------------------------------------
class _OverBudget(Exception):
    pass


def compress_child(n: int, threads: int | None, budget: float) -> None:
    """In a child process: ``compress_linear(nn.Linear(n, n))`` at its defaults (seed 0), stopped by a timer signal
    after ``budget`` seconds; prints one JSON line: its seconds and report, or ``over_budget``."""
    from torch import nn

    from lightning_ortho.transforms import compress_linear

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    layer = nn.Linear(n, n)

    def stop(signum, frame):
        raise _OverBudget

    previous = signal.signal(signal.SIGALRM, stop)
    start = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        compressed = compress_linear(layer)
    except _OverBudget:
        print(json.dumps({"over_budget": True, "seconds": time.perf_counter() - start}))
        return
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - start
    report = compressed.report
    print(json.dumps({"seconds": seconds, "error": report.error, "blocks": report.blocks, "s": report.s}))


def measure_compress(sizes, budget: float, threads: int | None) -> list[tuple[int, str, float | None, dict]]:
    """``(n, what, seconds or None, fields)`` per ``n``: a child process each (a fresh heap, and a run over budget
    can be stopped); ``fields`` say ``"skipped"`` (with ``budget_s``) when it was."""
    out = []
    for n in sizes:
        what = f"compress_linear(nn.Linear({n}, {n})) at its defaults, seconds"
        code = f"from benchmarks._small_processes import compress_child; compress_child({n}, {threads}, {budget})"
        fields: dict = {"n": n, "budget_s": budget}
        try:
            done = subprocess.run(
                [sys.executable, "-c", code],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=budget + CHILD_START_SECONDS,
            )
        except subprocess.TimeoutExpired:  # the timer signal could not interrupt it (a long call into C)
            out.append((n, what, None, fields | {"skipped": f"over budget: not done after {budget:g} s"}))
            continue
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = " ".join(done.stderr.split())[-300:]
            out.append((n, what, None, fields | {"skipped": f"the child failed (exit {done.returncode}): {tail}"}))
            continue
        result = json.loads(lines[-1])
        if result.get("over_budget"):
            out.append((n, what, None, fields | {"skipped": f"over budget: not done after {budget:g} s"}))
            continue
        fields.update(error=result["error"], blocks=result["blocks"], s=result["s"])
        out.append((n, what, result["seconds"], fields))
    return out


# -- a recipe's epoch at default threads and at one ----------------------------------------------------------------
def _instantiate(spec: dict, **overrides):
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**{**spec.get("init_args", {}), **overrides})


def build_recipe(sizes: dict, **model_overrides):
    """``(model, data, trainer arguments, seed)`` of RECIPE with the data module's ``sizes`` (what the CLI builds:
    the cell's ``input_size`` and the model's ``output_size`` from the data module)."""
    config = yaml.safe_load(RECIPE.read_text())
    data = _instantiate(config["data"], **sizes)
    model_spec = dict(config["model"])
    arguments = dict(model_spec.get("init_args", {}))
    cell = _instantiate(arguments.pop("cell"), input_size=data.input_size)
    model = _instantiate(
        {"class_path": model_spec["class_path"], "init_args": arguments},
        cell=cell,
        output_size=data.output_size,
        **model_overrides,
    )
    trainer = {k: v for k, v in config.get("trainer", {}).items() if k in ("accelerator", "devices", "deterministic")}
    return model, data, trainer, config.get("seed_everything", 0)


def fit_epoch(sizes: dict, threads: int, **model_overrides) -> float:
    """Seconds of one training epoch (``on_train_epoch_start`` to ``on_train_epoch_end``, no validation) of the
    recipe at ``threads`` torch threads; the process's thread count and deterministic mode are given back."""
    from lightning_ortho._lightning import pl

    class EpochTimer(pl.Callback):
        seconds = float("nan")

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.seconds = time.perf_counter() - self.start

    previous, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    try:
        model, data, trainer_arguments, seed = build_recipe(sizes, **model_overrides)
        pl.seed_everything(seed, verbose=False)
        timer = EpochTimer()
        with tempfile.TemporaryDirectory(prefix="bench_small-") as root:
            trainer = pl.Trainer(
                max_epochs=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                limit_val_batches=0,
                num_sanity_val_steps=0,
                default_root_dir=root,
                callbacks=[timer],
                **trainer_arguments,
            )
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(model, datamodule=data)
        return timer.seconds
    finally:
        torch.set_num_threads(previous)
        torch.use_deterministic_algorithms(deterministic)


@contextlib.contextmanager
def spinning(count: int):
    """``count`` child processes that spin on a core each until the block ends (then killed by their ids)."""
    children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for child in children:
            child.kill()
            child.wait()


def measure_online_recipe(quick: bool, rounds: int, default_threads: int, spinners: int) -> list[tuple]:
    """``[(what, ratio, fields)]``: the epoch at torch's default thread count over the epoch at one thread,
    interleaved (A B, B A, ...; the median of the per-round ratios)."""
    from lightning_ortho._lightning import pl  # noqa: F401  (imported first: importing Lightning sets its log levels)

    sizes = RECIPE_SIZES[int(quick)]
    quiet = [logging.getLogger(name) for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with spinning(spinners):
            timing = interleave(
                {
                    "default_threads": lambda: fit_epoch(sizes, default_threads),
                    "one_thread": lambda: fit_epoch(sizes, 1, num_threads=1),
                },
                rounds=min(rounds, RECIPE_MAX_ROUNDS),
                warmup=0 if quick else 1,  # a smoke run: seconds, not a measurement
                order="alternate",
            )
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    default_s, one_s = timing.results["default_threads"], timing.results["one_thread"]
    ratios = [a / b for a, b in zip(default_s, one_s, strict=True)]
    what = (
        f"{RECIPE.relative_to(ROOT)} epoch ({', '.join(f'{k} {v}' for k, v in sizes.items())}), torch's default "
        f"threads ({default_threads}) / one thread, {spinners} other core(s) busy"
    )
    fields = {
        "recipe": str(RECIPE.relative_to(ROOT)),
        "sizes": sizes,
        "default_threads": default_threads,
        "spinners": spinners,
        "default_threads_s": median(default_s),
        "one_thread_s": median(one_s),
        "ratio_of_best": min(default_s) / min(one_s),
        "rounds": len(ratios),
    }
    return [(what, median(ratios), fields)]
