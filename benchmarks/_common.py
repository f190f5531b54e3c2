"""Shared helpers of the benchmark scripts: hardware names, interleaved timing, the JSON result format.

Every script writes ``benchmarks/results/NAME-HARDWARE.json`` with the shape described in design.md:
``{"benchmark", "hardware", "torch", "date", "command", "rows": [...], "claims": [...]}``.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import json
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def hardware_name(device: torch.device) -> str:
    """``cpu2`` (CPU with 2 threads) or a slug of the GPU name such as ``h200``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        match = re.search(r"(h100|h200|a100|a10g?|l4|l40s?|v100|t4|rtx ?\d{4}|b200)", name)
        return (match.group(1) if match else re.sub(r"[^a-z0-9]+", "-", name)).replace(" ", "")
    return f"cpu{torch.get_num_threads()}"


def hardware_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads ({os.cpu_count()} cores visible)"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward_backward(
    forward: Callable[[], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    device: torch.device,
    *,
    min_time: float = 0.2,
) -> tuple[float, float]:
    """Seconds per call of the forward pass and of the backward pass that follows it, timed separately in
    the same loop (so forward + backward is their sum, never a difference of two noisy numbers)."""
    number, forward_total, backward_total = 0, 0.0, 0.0
    while number == 0 or forward_total + backward_total < min_time:
        synchronize(device)
        start = time.perf_counter()
        output = forward()
        synchronize(device)
        middle = time.perf_counter()
        backward(output)
        synchronize(device)
        forward_total += middle - start
        backward_total += time.perf_counter() - middle
        number += 1
        del output
    return forward_total / number, backward_total / number


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def command_line() -> str:
    """The command that is running, with the script path relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(RESULTS.parent.parent)
    except ValueError:
        pass
    return shlex.join(["python", script.as_posix(), *sys.argv[1:]])


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


def write_result(
    name: str,
    device: torch.device,
    rows: list[dict],
    claims: list[dict],
    *,
    suffix: str = "",
    extra: dict | None = None,
) -> Path:
    """Write the result JSON (with ``extra`` top-level fields) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "hardware": hardware_name(device),
        "hardware_description": hardware_description(device),
        "torch": torch.__version__.split("+")[0],
        "date": _dt.date.today().isoformat(),
        "command": command_line(),
        **(extra or {}),
        "rows": rows,
        "claims": claims,
    }
    path = RESULTS / f"{name}-{hardware_name(device)}{suffix}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


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
