"""Shared helpers of the benchmark scripts: the command line, hardware names, interleaved timing, the result files.

Every script is a module of this package, run from the repository root as ``python -m benchmarks.NAME`` with the
options of :func:`benchmark_parser` (``--quick``, ``--rounds``, ``--threads``, ``--device``, ``--output``,
``--output-suffix``) and its own, and writes ``OUTPUT/NAME-HARDWARE.json`` with the shape
``{"benchmark", "hardware", "torch", "date", "command", "rows": [...], "claims": [...]}``. Its markdown table is
``render(data) -> str`` of ``benchmarks/NAME_render.py``, which ``python -m benchmarks.report`` finds by the
benchmark's name.

Timing: :func:`interleave` is the one timing loop of every script (the training-time reproductions measure whole
runs through Lightning callbacks instead).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import json
import os
import platform
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

RESULTS = Path(__file__).resolve().parent / "results"


# -- command line --------------------------------------------------------------------------------------------------
def benchmark_parser(module: str, description: str | None, *, threads: int | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks.MODULE``: the shared options, to which the script adds its own.

    ``--threads`` defaults to ``threads`` (``None``: torch's own count, left alone). Parse with :func:`parse_args`,
    which records the command line for the result file.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{module}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shared = parser.add_argument_group("options of every benchmark")
    shared.add_argument("--quick", action="store_true", help="tiny sizes, seconds: a smoke run (the tests use it)")
    shared.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default: the script's)")
    shared.add_argument(
        "--threads",
        type=int,
        default=threads,
        help="torch threads for the run (default: " + (str(threads) if threads else "torch's own count") + ")",
    )
    shared.add_argument("--device", default="cpu", help="cpu or cuda (where the script supports it)")
    shared.add_argument(
        "--output", type=Path, default=RESULTS, help="folder of the result files (default: benchmarks/results)"
    )
    shared.add_argument(
        "--output-suffix", default=None, help="appended to the result file names (default: -quick with --quick)"
    )
    parser.set_defaults(module=module)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` plus ``command`` (how to rerun it) and ``suffix`` (of the result file names).

    Raises:
        SystemExit: bad options (argparse's message), or ``--rounds``/``--threads`` below 1.
    """
    args = parser.parse_args(argv)
    for name in ("rounds", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    args.command = command_line(args.module, sys.argv[1:] if argv is None else argv)
    args.suffix = args.output_suffix if args.output_suffix is not None else ("-quick" if args.quick else "")
    return args


def reject(parser: argparse.ArgumentParser, args: argparse.Namespace, *, rounds: str = "", device: str = "") -> None:
    """Stop with argparse's usage error where the script cannot honour ``--rounds`` / a non-CPU ``--device``;
    ``rounds`` / ``device`` say why (empty: the script supports it)."""
    if rounds and args.rounds is not None:
        parser.error(f"--rounds does not apply: {rounds}")
    if device and torch.device(args.device).type != "cpu":
        parser.error(f"--device {args.device}: {device}")


def command_line(module: str, argv: list[str]) -> str:
    """``python -m benchmarks.MODULE ARGS``: the command that reruns this benchmark from the repository root."""
    return shlex.join(["python", "-m", f"benchmarks.{module}", *argv])


@contextlib.contextmanager
def configured(args: argparse.Namespace) -> Iterator[torch.device]:
    """Run under ``args``: ``--threads`` set (and the previous count given back at the end, since tests call
    ``main`` in their own process), Python's ``random`` seeded (the interleaving order); yields the device."""
    previous = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(0)
    try:
        yield torch.device(args.device)
    finally:
        torch.set_num_threads(previous)


# -- hardware ------------------------------------------------------------------------------------------------------
def hardware_name(device: torch.device) -> str:
    """``cpu2`` (CPU with 2 threads) or a slug of the GPU name such as ``h200``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        match = re.search(r"(h100|h200|a100|a10g?|l4|l40s?|v100|t4|rtx ?\d{4}|b200)", name)
        return (match.group(1) if match else re.sub(r"[^a-z0-9]+", "-", name)).replace(" ", "")
    return f"cpu{torch.get_num_threads()}"


def hardware_description(device: torch.device) -> str:
    """The GPU's name, or the CPU's model (Linux's ``/proc/cpuinfo``), architecture and threads: ratios move from
    one CPU to another (cache sizes, vector width), so a result says which one it was measured on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{cpu_model()}, {threads} thread{'s' * (threads != 1)} ({os.cpu_count()} cores visible)"


def cpu_model() -> str:
    """``"AMD EPYC (x86_64)"``: the model name Linux reports, else what ``platform`` knows."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    machine = platform.machine()
    if found:
        return f"{found.group(1).strip()} ({machine})"
    return platform.processor() or machine


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """The ``synchronize`` argument of :func:`interleave` for ``device`` (``None`` on the CPU)."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def keep_freed_memory() -> str | None:
    """Ask glibc's allocator to keep freed memory instead of returning it to the OS; returns a description, or
    ``None`` where that is not possible (not glibc).

    PyTorch's CPU tensors come from ``malloc``; blocks above glibc's mmap threshold are unmapped on ``free`` and
    the next allocation page-faults them back in. On this 2-core VM that cost 2 us per 4 KiB page, i.e. ~80% of
    an eager elementwise pipeline on 1.5 MB tensors (measured: 4,000 faults and 8.4 ms vs 0 faults and 1.5 ms
    per aux_invertible 1x1 convolution). It is the same effect PyTorch's CPU performance guide addresses with
    jemalloc/tcmalloc. Every method of a benchmark runs under the same setting.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30)
        ok = ok and libc.mallopt(m_top_pad, 64 << 20)
    except (OSError, AttributeError):
        return None
    return "glibc mallopt: mmap and trim thresholds 1 GiB, top pad 64 MiB" if ok else None


# -- timing --------------------------------------------------------------------------------------------------------
#: A timed callable: a function of no argument, or ordered phases ``{"forward": f, "backward": g}`` where the first
#: takes no argument and each next one takes the previous one's result (each phase timed on its own).
Call = Callable[[], object] | Mapping[str, Callable[..., object]]
TOTAL = "total"


def median(values: list[float]) -> float:
    return float(statistics.median(values))


@dataclass
class Timing:
    """What :func:`interleave` measured: for every name and phase (``"total"``: the phases' sum), the seconds per
    call of each round it ran in; ``results[name]``: the last call's result in each round (the last phase's)."""

    seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    results: dict[str, list[object]] = field(default_factory=dict)

    def values(self, name: str, phase: str = TOTAL) -> list[float]:
        return self.seconds[name][phase]

    def best(self, name: str, phase: str = TOTAL) -> float:
        """The fastest round (the machine's noise only ever adds time)."""
        return min(self.seconds[name][phase])

    def median(self, name: str, phase: str = TOTAL) -> float:
        return median(self.seconds[name][phase])

    def rounds(self, name: str) -> int:
        return len(self.seconds[name][TOTAL])

    def ratio(self, name: str, reference: str, phase: str = TOTAL, statistic: Literal["best", "median"] = "best"):
        """``name``'s time as a multiple of ``reference``'s (of their best rounds, or of their medians)."""
        pick = self.best if statistic == "best" else self.median
        return pick(name, phase) / pick(reference, phase)

    def paired_ratios(self, name: str, reference: str, phase: str = TOTAL) -> list[float]:
        """Round by round, ``name``'s time over ``reference``'s in the same round (drift of the machine cancels)."""
        return [a / b for a, b in zip(self.values(name, phase), self.values(reference, phase), strict=True)]


def _run_once(call: Call, synchronize: Callable[[], None] | None) -> tuple[dict[str, float], object]:
    phases = call.items() if isinstance(call, Mapping) else [(TOTAL, call)]
    seconds, result = {}, None
    for index, (phase, function) in enumerate(phases):
        if synchronize is not None:
            synchronize()
        start = time.perf_counter()
        result = function() if index == 0 else function(result)
        if synchronize is not None:
            synchronize()
        seconds[phase] = time.perf_counter() - start
    return seconds, result


def time_call(
    call: Call,
    *,
    min_time: float = 0.0,
    number: int = 1,
    synchronize: Callable[[], None] | None = None,
) -> tuple[dict[str, float], object]:
    """Seconds per call of ``call`` (per phase, and ``"total"``) over at least ``number`` calls and at least
    ``min_time`` seconds of timed phases, and the last call's result."""
    totals: dict[str, float] = {}
    count, spent, result = 0, 0.0, None
    while count < number or spent < min_time:
        seconds, result = _run_once(call, synchronize)
        for phase, value in seconds.items():
            totals[phase] = totals.get(phase, 0.0) + value
        spent += sum(seconds.values())
        count += 1
    per_call = {phase: value / count for phase, value in totals.items()}
    if TOTAL not in per_call:
        per_call[TOTAL] = sum(per_call.values())
    return per_call, result


def interleave(
    calls: Mapping[str, Call],
    *,
    rounds: int,
    warmup: int = 1,
    min_time: float | Mapping[str, float] = 0.0,
    number: int = 1,
    order: Literal["shuffle", "alternate", "fixed"] = "shuffle",
    synchronize: Callable[[], None] | None = None,
    budget: float | None = None,
    after_round: Callable[[int, Timing], None] | None = None,
    rng: random.Random | None = None,
) -> Timing:
    """Time named callables side by side: ``rounds`` rounds, each calling every name once in turn.

    Args:
        calls: name -> a function of no argument, or ordered phases (see :data:`Call`).
        rounds: rounds; a round times each name over at least ``number`` calls and ``min_time`` seconds (a float
            for all, or per name) and records the seconds per call.
        warmup: untimed rounds first, in the given order (allocator, lazy initialisation, library workspaces).
        order: ``"shuffle"`` (a random order each round, from ``rng``, default Python's seeded ``random``),
            ``"alternate"`` (the given order, reversed every other round: A B, B A, ...) or ``"fixed"``.
        synchronize: called before and after each timed phase (``torch.cuda.synchronize`` for a GPU).
        budget: a name whose recorded seconds per call add up to ``budget`` stops after two rounds.
        after_round: called with the round's index and the timing so far (progress lines).

    Returns:
        :class:`Timing`; ``best`` is the fastest round, ``median`` the median one.
    """
    shuffle = rng.shuffle if rng is not None else random.shuffle  # the module's generator: configured() seeds it
    timing = Timing({name: {} for name in calls}, {name: [] for name in calls})
    for _ in range(warmup):
        for name, call in calls.items():
            limit = min_time.get(name, 0.0) if isinstance(min_time, Mapping) else min_time
            time_call(call, min_time=limit, number=number, synchronize=synchronize)
    names = list(calls)
    for index in range(rounds):
        active = [n for n in names if index < 2 or budget is None or sum(timing.seconds[n].get(TOTAL, [])) < budget]
        if order == "shuffle":
            shuffle(active)
        elif order == "alternate" and index % 2:
            active.reverse()
        for name in active:
            limit = min_time.get(name, 0.0) if isinstance(min_time, Mapping) else min_time
            seconds, result = time_call(calls[name], min_time=limit, number=number, synchronize=synchronize)
            for phase, value in seconds.items():
                timing.seconds[name].setdefault(phase, []).append(value)
            timing.results[name].append(result)
        if after_round is not None:
            after_round(index, timing)
    return timing


# -- results -------------------------------------------------------------------------------------------------------
def result_path(name: str, device: torch.device, args: argparse.Namespace, extension: str = ".json") -> Path:
    """``OUTPUT/NAME-HARDWARE{suffix}{extension}`` of this run (``NAME`` may carry a tag: ``NAME_TAG``)."""
    return Path(args.output) / f"{name}-{hardware_name(device)}{args.suffix}{extension}"


def write_result(
    name: str,
    device: torch.device,
    rows: list[dict],
    claims: list[dict],
    args: argparse.Namespace,
    *,
    extra: dict | None = None,
    stem: str | None = None,
) -> Path:
    """Write the result JSON of benchmark ``name`` (with ``extra`` top-level fields, which may override
    ``command``) to :func:`result_path` of ``stem`` (default ``name``; a tagged run of the same benchmark, which
    the report renders in the same results-page section) and return its path."""
    path = result_path(stem or name, device, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "hardware": hardware_name(device),
        "hardware_description": hardware_description(device),
        "torch": torch.__version__.split("+")[0],
        "date": _dt.date.today().isoformat(),
        "command": args.command,
        **(extra or {}),
        "rows": rows,
        "claims": claims,
    }
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def claim(text: str, figure: object, holds: bool) -> dict:
    """One entry of a result's ``claims``."""
    return {"claim": text, "figure": figure, "holds": bool(holds)}


def print_claims(claims: list[dict]) -> None:
    for entry in claims:
        print(f"[{'holds' if entry['holds'] else 'DOES NOT HOLD'}] {entry['claim']}: {entry['figure']}")


def pyplot():  # noqa: ANN201 - matplotlib is optional, so no annotation that would import it
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or ``None`` where matplotlib is not installed (the
    scripts then skip their plots)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
