"""The GPU suite: one time-budgeted run of the library's speed benchmarks on an accelerator (about 10 minutes on a
GPU), ready to run when one is available; on the CPU ``--quick`` makes it a smoke run (the tests use it).

    python -m benchmarks.gpu_suite                              # --device cuda, --budget-s 600
    python -m benchmarks.gpu_suite --device cpu --quick         # seconds of sections, tiny sizes
    python -m benchmarks.gpu_suite --budget-s 900 --out benchmarks/results --sections online_steps ddp

Sections, in this order (``--sections`` picks some):

1. ``small``: the rows of benchmarks/bench_small.py that time the library's calls (``aux_linear``, ``uoro_bptt``,
   ``uoro_bptt_orthogonal``, ``orthogonal_rnn``, ``uoro_bandwidth``: the same functions of benchmarks/_small_rows.py,
   at its sizes, on the device); its ``compress`` (a CPU algorithm in a child process) and ``online_recipe`` (CPU
   thread counts) rows do not apply to a device and are listed as not run, with the reason.
2. ``orthogonal``: benchmarks/bench_orthogonal.py's grid of orthogonal maps beside ``nn.Linear`` (``measure`` of
   benchmarks/_orthogonal_rows.py, one ``(d, B)`` at a time) and the FCNN epochs (its ``measure_fcnn``) on random
   data of MNIST's shape (the suite downloads nothing; geotorch's columns only where benchmarks/.peers already
   holds the pinned version).
3. ``online_steps``: one step + gradient (``est.step(x, state)`` then ``est.gradient(state, grad_h)`` with a fixed
   ``grad_h``) of every estimator: UORO (its defaults), KF-RTRL, RFLO (``tau = 2``), RTRL, SnAp-1, truncated BPTT
   (``k = 10``) on ``TanhRNNCell(32, H)``, and DiagonalRTRL on ``LinearRecurrentUnit(32, H)`` (the shipped cell it
   takes), float32, at B = 1, 64 and 1,024 streams and H = 64 .. 1,024. Per row: warm-up steps (which also predict
   the row's cost), then ``rounds`` timed runs of enough steps for ``ROW_SECONDS`` each, the device synchronised
   before and after every run; median and best milliseconds per step, the state's size, and on CUDA the peak
   memory above what was allocated before (``torch.cuda.max_memory_allocated``). A row whose estimated memory
   (:func:`estimated_bytes`) exceeds the limit (``--memory-limit-gb``; by default 80 % of the GPU's free memory,
   on the CPU half the available memory, at most 8 GiB) is skipped with the estimate; so is SnAp where deriving its
   pattern (dense ``(H, P)`` float64 Jacobians, on the CPU) would not fit, and any row that runs out of memory (and
   the larger H of its estimator and B after it).
4. ``compiled_chunk``: a chunk of ``OnlineRNNModule(compile=True)`` (one compiled region per chunk; CUDA graphs,
   ``mode="reduce-overhead"``, on CUDA where capturable) against the eager module on the same data from the same
   seed: milliseconds per time step of both, the first (compiling) chunk apart, and the largest difference of the
   parameters after the fit. Where the constructor has no ``compile`` argument the section says so and runs nothing.
5. ``ddp``: a two-process DDP fit of recipes/online_adding.yaml (``nccl`` on CUDA, one GPU per process: with fewer
   than two GPUs the section says it is not available; ``gloo`` on the CPU) for a few chunks: milliseconds per time
   step on each rank, that both ranks finished, and that their parameters agree.

Sections 4 and 5 run in child processes (benchmarks/_gpu_suite_children.py), stopped at their share of the budget,
so that a crash or a hang there cannot take the suite down.

Budget: ``--budget-s`` seconds for the whole run. Before each section the time left is shared among the sections
still to run (weights ``WEIGHTS``; time a section does not use passes on); a section whose share is below its
minimum (``MIN_SECONDS``) is recorded ``"status": "skipped: budget"`` and not started, and rows of a section that
would overrun its share are recorded ``"skipped": "budget: ..."`` (the section's status then says how many). Every
section is timed with the device synchronised (``torch.cuda.synchronize``) around each timed call.

Writes ``OUTPUT/gpu_suite-DEVICE.json`` (``gpu_suite-cuda.json`` on a GPU; ``-quick`` appended for ``--quick``)
with the device's name (``torch.cuda.get_device_name`` on a GPU, the CPU's model otherwise), the torch (and CUDA)
version, and per section its ``status`` (``ok``, ``partial: ...``, ``skipped: budget``, ``not available: ...``
or ``failed: ...``), its seconds and its figures. Exit status 1 where a section failed (the file is written first).
"""

from __future__ import annotations

import datetime as _dt
import gc
import inspect
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import _orthogonal_rows as orthogonal_rows
from benchmarks import _peers
from benchmarks import _small_rows as small_rows
from benchmarks._common import (
    benchmark_parser,
    configured,
    hardware_description,
    hardware_name,
    interleave,
    parse_args,
    synchronize,
    synchronizer,
)
from benchmarks._online_problem import TBPTT_K
from benchmarks.bench_small_render import measured
from lightning_ortho.online import (
    KFRTRL,
    RFLO,
    RTRL,
    UORO,
    DiagonalRTRL,
    LinearRecurrentUnit,
    SnAp,
    TanhRNNCell,
    TruncatedBPTT,
)

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("small", "orthogonal", "online_steps", "compiled_chunk", "ddp")
#: share of the time left that each section gets (of the sections still to run)
WEIGHTS = {"small": 0.12, "orthogonal": 0.2, "online_steps": 0.38, "compiled_chunk": 0.15, "ddp": 0.15}
#: seconds a section needs at least (full, quick): with less it is skipped
MIN_SECONDS = {
    "small": (10.0, 1.0),
    "orthogonal": (10.0, 1.0),
    "online_steps": (10.0, 1.0),
    "compiled_chunk": (60.0, 10.0),
    "ddp": (30.0, 10.0),
}
DEFAULT_BUDGET_S = 600.0
NOT_AVAILABLE_COMPILE = "not available: OnlineRNNModule has no compile option"

# -- sizes (full, quick) -------------------------------------------------------------------------------------------
#: timing rounds of the small and orthogonal sections
ROUNDS = (3, 1)
SMALL_ROWS = ("aux_linear", "uoro_bptt", "uoro_bptt_orthogonal", "orthogonal_rnn", "uoro_bandwidth")
SMALL_NOT_RUN = {
    "compress": "compress_linear is a CPU algorithm timed in a child process: not a device row",
    "online_recipe": "compares CPU thread counts: not a device row",
}
ORTHOGONAL_GRID = (
    (orthogonal_rows.FULL_DIMS, orthogonal_rows.FULL_BATCHES),
    ((16, 32), (8, 64)),
)
ORTHOGONAL_MIN_TIME = (0.05, 0.002)
FCNN_SIZE = (orthogonal_rows.FCNN_FULL, (16, 256))
FCNN_ROUNDS = (2, 1)
#: streams, hidden sizes and input size of the online steps
STREAMS = ((1, 64, 1024), (1, 8))
HIDDEN = ((64, 128, 256, 512, 1024), (8, 16))
INPUT_SIZE = (32, 4)
#: seconds of steps per timed run of a row, and bounds on the steps of a run
ROW_SECONDS = (0.2, 0.002)
MIN_STEPS, MAX_STEPS = 3, (500, 20)
RFLO_TAU = 2.0
#: the CPU's memory limit of a row at most (the available memory's half otherwise); the GPU's: of its free memory
CPU_MEMORY_LIMIT, GPU_MEMORY_SHARE = 8 << 30, 0.8


# -- the budget ----------------------------------------------------------------------------------------------------
@dataclass
class Deadline:
    """A point in time (``time.monotonic``); :meth:`left` seconds to it."""

    end: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return self.end - time.monotonic()


def allowance(left: float, section: str, remaining: list[str]) -> float:
    """The seconds ``section`` gets of the ``left`` ones: its weight's share among the sections still to run."""
    return left * WEIGHTS[section] / sum(WEIGHTS[name] for name in remaining)


def _budget_skip(predicted: float, deadline: Deadline) -> str | None:
    left = deadline.left()
    return f"budget: predicted {predicted:.3g} s, {max(left, 0.0):.3g} s left" if predicted > left else None


def _partial(rows: list[dict]) -> str:
    """A section's status from its rows: ``"ok"``, or how many of them the budget skipped."""
    skipped = sum(1 for r in rows if str(r.get("skipped", "")).startswith("budget"))
    return f"partial: {skipped} of {len(rows)} rows skipped: budget" if skipped else "ok"


# -- the device ----------------------------------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` on a GPU, the CPU's description (model, threads) otherwise."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else hardware_description(device)


def memory_limit(device: torch.device) -> int:
    """Bytes a row of the online steps may use: ``GPU_MEMORY_SHARE`` of the GPU's free memory, or on the CPU half
    the memory Linux says is available (at most ``CPU_MEMORY_LIMIT``)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(GPU_MEMORY_SHARE * free)
    return min(CPU_MEMORY_LIMIT, host_available_bytes() // 2)


def host_available_bytes() -> int:
    """``MemAvailable`` of /proc/meminfo (bytes), or 8 GiB where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _free_memory(device: torch.device) -> None:
    """Give the GPU's cached blocks back between rows (a collection first: tensors held in reference cycles). Not on
    the CPU, where freed tensors are gone already and a collection of the process's heap costs most of a second."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


# -- section 1: bench_small's rows ---------------------------------------------------------------------------------
def run_small(device: torch.device, quick: bool, deadline: Deadline, rounds: int) -> dict:
    """bench_small's device rows at its sizes (``quick``: its quick sizes), each started only while the deadline
    allows; rows that would start after it are recorded as skipped."""
    q = int(quick)
    min_time = small_rows.MIN_TIME[q]
    measures: dict[str, Callable[[], list[dict]]] = {
        "aux_linear": lambda: small_rows.measure_aux_linear(
            small_rows.AUX_DIMS[q], small_rows.AUX_INFO_DIMS[q], small_rows.AUX_BATCH[q], rounds, min_time, device
        ),
        "uoro_bptt": lambda: small_rows.measure_uoro_bptt(
            small_rows.UORO_HIDDEN[q], small_rows.STEPS[q], rounds, device
        ),
        "uoro_bptt_orthogonal": lambda: small_rows.measure_uoro_bptt_orthogonal(
            small_rows.ORTHOGONAL_HIDDEN[q], small_rows.STEPS[q], rounds, device
        ),
        "orthogonal_rnn": lambda: small_rows.measure_orthogonal_rnn(*small_rows.RNN_SHAPE[q], rounds, min_time, device),
        "uoro_bandwidth": lambda: small_rows.measure_uoro_bandwidth(
            small_rows.BANDWIDTH_HIDDEN[q], rounds, min_time, device
        ),
    }
    rows: list[dict] = []
    for section in SMALL_ROWS:
        if deadline.left() <= 0:
            rows.append({"section": section, "skipped": "budget: the section's share was spent"})
            continue
        for row in measures[section]():
            rows.append(row)
            print(f"  small: {row['what']}: {measured(row)}", flush=True)
    return {"status": _partial(rows), "rows": rows, "not_run": dict(SMALL_NOT_RUN), "rounds": rounds}


# -- section 2: bench_orthogonal's rows ----------------------------------------------------------------------------
def _geotorch() -> tuple[object | None, str | None]:
    """geotorch where benchmarks/.peers already holds the pinned version (the suite installs nothing), else why not."""
    if not _peers._installed(_peers.GEOTORCH, _peers.PEERS):
        return None, (
            f"{_peers.GEOTORCH} is not in benchmarks/.peers (the GPU suite installs nothing: "
            "python -m benchmarks.bench_orthogonal --quick installs it where the registry can be reached)"
        )
    return _peers.load_geotorch()


def run_orthogonal(device: torch.device, quick: bool, deadline: Deadline, rounds: int) -> dict:
    """bench_orthogonal's grid, one ``(d, B)`` at a time while the deadline allows, then the FCNN epochs on random
    data of MNIST's shape."""
    q = int(quick)
    dims, batches = ORTHOGONAL_GRID[q]
    geotorch, missing = _geotorch()
    rows: list[dict] = []
    for d in dims:
        for batch in batches:
            if deadline.left() <= 0:
                rows += [
                    {"d": d, "batch": batch, "method": m, "skipped": "budget: the section's share was spent"}
                    for m in orthogonal_rows.METHODS
                ]
                continue
            rows += orthogonal_rows.measure(
                (d,), (batch,), rounds, ORTHOGONAL_MIN_TIME[q], device, geotorch=geotorch, geotorch_missing=missing
            )
            _free_memory(device)
    (d, images), fcnn_rounds = FCNN_SIZE[q], FCNN_ROUNDS[q]
    generator = torch.Generator().manual_seed(0)
    data = (
        torch.rand(images, d, generator=generator),
        torch.randint(0, orthogonal_rows.FCNN_CLASSES, (images,), generator=generator),
        "random uniform pixels and labels (the GPU suite downloads nothing)",
    )
    fcnn: dict = {"d": d, "images": images, "rounds": fcnn_rounds, "data": data[2]}
    if deadline.left() <= 0:
        fcnn["skipped"] = "budget: the section's share was spent"
        base = {"section": "fcnn_epoch", "d": d, "batch": orthogonal_rows.FCNN_BATCH, "images": images}
        rows += [base | {"method": m, "skipped": fcnn["skipped"]} for m in orthogonal_rows.FCNN_METHODS]
    else:
        fcnn_rows, _ = orthogonal_rows.measure_fcnn(
            d, images, fcnn_rounds, device, geotorch=geotorch, geotorch_missing=missing, data=data
        )
        rows += fcnn_rows
    peer = {"requirement": _peers.GEOTORCH, "triv": orthogonal_rows.GEOTORCH_METHODS}
    peer.update({"skipped": missing} if missing else {"version": geotorch.__version__})
    return {
        "status": _partial(rows),
        "rows": rows,
        "claims": orthogonal_rows.claims_from(rows),
        "fcnn": fcnn,
        "peers": {"geotorch": peer},
        "rounds": rounds,
    }


# -- section 3: the online steps -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimator:
    """One row kind of the online steps: its label, the cell it runs on (``"tanh"``: ``TanhRNNCell(I, H)``,
    ``"lru"``: ``LinearRecurrentUnit(I, H)``), how to build it from the cell, and the exponent of ``H`` in its cost
    per step (the budget's prediction from the row at the previous ``H``)."""

    label: str
    cell: str
    build: Callable
    cost_exponent: int


#: key -> the estimator of the online steps' rows, in the order of the rows
ESTIMATORS = {
    "uoro": Estimator("UORO (state projection, GIR)", "tanh", lambda cell: UORO(cell, generator=0), 2),
    "kf_rtrl": Estimator("KF-RTRL", "tanh", lambda cell: KFRTRL(cell, generator=0), 3),
    "rflo": Estimator(f"RFLO (tau={RFLO_TAU:g})", "tanh", lambda cell: RFLO(cell, tau=RFLO_TAU), 2),
    "rtrl": Estimator("RTRL", "tanh", RTRL, 4),
    "snap1": Estimator("SnAp-1", "tanh", lambda cell: SnAp(cell, order=1), 3),
    "tbptt": Estimator(f"TruncatedBPTT (k={TBPTT_K})", "tanh", lambda cell: TruncatedBPTT(cell, TBPTT_K), 2),
    "diagonal_rtrl": Estimator("DiagonalRTRL", "lru", DiagonalRTRL, 1),
}
CELLS = {"tanh": TanhRNNCell, "lru": LinearRecurrentUnit}


def parameter_count(cell: str, hidden: int, input_size: int) -> int:
    """``P`` of ``TanhRNNCell(I, H)`` (``H^2 + H I + H``) or ``LinearRecurrentUnit(I, H)`` (its eight tensors:
    ``nu_log``, ``theta_log``, ``gamma_log`` (H each), ``B_re``, ``B_im`` (H x I), ``C_re``, ``C_im`` (I x H),
    ``D`` (I))."""
    if cell == "lru":
        return 3 * hidden + 4 * hidden * input_size + input_size
    return hidden * hidden + hidden * input_size + hidden


def estimated_bytes(key: str, streams: int, hidden: int, input_size: int) -> int:
    """Device memory one step + gradient of ``key`` is expected to need at float32, with room for the step's
    temporaries: RTRL's influence ``(B, H, P)`` and its update (x4); UORO's ``w_tilde`` ``(B, P)`` (x8); RFLO's
    trace ``(B, H, H + I + 1)`` (x6); KF-RTRL's factor ``(B, H, H)`` (x8); SnAp-1's kept entries ``(B, P)`` (x8);
    truncated BPTT's window ``k (B, H + I)`` and its replay (x16); DiagonalRTRL's complex traces ``(B, P)`` (x16)."""
    size = 4
    p = parameter_count(ESTIMATORS[key].cell, hidden, input_size)
    b, h, i = streams, hidden, input_size
    floats = {
        "rtrl": 4 * b * h * p,
        "uoro": 8 * b * p,
        "rflo": 6 * b * h * (h + i + 1),
        "kf_rtrl": 8 * b * h * h + 8 * b * (h + i + 1),
        "snap1": 8 * b * p,
        "tbptt": 16 * TBPTT_K * b * (h + i),
        "diagonal_rtrl": 16 * b * p,
    }[key]
    return size * (floats + 16 * b * (h + i))


def snap_probe_bytes(hidden: int, input_size: int) -> int:
    """Host memory SnAp's pattern derivation takes: the dense ``(H, P)`` parameter Jacobian in float64 from
    ``torch.func.jacrev`` (about three copies: the vmapped products, the result, the comparison)."""
    return 3 * 8 * hidden * parameter_count("tanh", hidden, input_size)


def _memory_skip(key: str, streams: int, hidden: int, input_size: int, limit: int) -> str | None:
    need = estimated_bytes(key, streams, hidden, input_size)
    if need > limit:
        return f"memory: about {need / 2**30:.1f} GiB estimated, limit {limit / 2**30:.1f} GiB"
    if key == "snap1":
        probe, host = snap_probe_bytes(hidden, input_size), min(CPU_MEMORY_LIMIT, host_available_bytes() // 2)
        if probe > host:
            return (
                f"memory: deriving SnAp's pattern holds dense (H, P) float64 Jacobians on the CPU, about "
                f"{probe / 2**30:.1f} GiB, limit {host / 2**30:.1f} GiB"
            )
    return None


def _state_bytes(state) -> int:
    return state.h.nbytes + sum(t.nbytes for t in state.tensors.values() if isinstance(t, torch.Tensor))


def time_online_step(
    key: str, streams: int, hidden: int, input_size: int, device: torch.device, quick: bool, deadline: Deadline
) -> dict:
    """One row: build the cell and estimator (seed 0) on ``device``, warm up, then time ``rounds`` runs of steps
    (step + gradient), synchronised. Returns the row's figures; raises what the estimator raises."""
    q = int(quick)
    spec = ESTIMATORS[key]
    torch.manual_seed(0)
    cell = CELLS[spec.cell](input_size, hidden).to(device)
    before = 0
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    built = time.perf_counter()
    estimator = spec.build(cell)
    build_s = time.perf_counter() - built
    pool = torch.randn(8, streams, input_size, device=device)
    h0 = torch.zeros(streams, hidden, device=device)
    state = [estimator.initial_state(h0)]
    grad_h = torch.randn_like(state[0].h)  # complex for the LRU's complex state
    count = [0]

    def steps(n: int) -> None:
        for _ in range(n):
            _, state[0] = estimator.step(pool[count[0] % len(pool)], state[0])
            estimator.gradient(state[0], grad_h)
            count[0] += 1

    warm = TBPTT_K + 2 if key == "tbptt" else 2
    synchronize(device)
    started = time.perf_counter()
    steps(warm)
    synchronize(device)
    per_step = (time.perf_counter() - started) / warm
    rounds = ROUNDS[q]
    n = max(MIN_STEPS, min(MAX_STEPS[q], math.ceil(ROW_SECONDS[q] / max(per_step, 1e-9))))
    row = {"P": sum(p.numel() for p in cell.parameters()), "build_s": build_s, "warm_up_ms_per_step": 1e3 * per_step}
    budget = _budget_skip(rounds * n * per_step, deadline)
    if budget:
        return row | {"skipped": budget}
    timing = interleave({key: lambda: steps(n)}, rounds=rounds, warmup=0, synchronize=synchronizer(device))
    row |= {
        "steps": n,
        "rounds": rounds,
        "ms_per_step": 1e3 * timing.median(key) / n,
        "best_ms_per_step": 1e3 * timing.best(key) / n,
        "state_mb": _state_bytes(state[0]) / 2**20,
        "peak_memory_mb": None,
    }
    if device.type == "cuda":
        row["peak_memory_mb"] = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    return row


def run_online_steps(device: torch.device, quick: bool, deadline: Deadline, limit: int | None = None) -> dict:
    """Every estimator at every (H, B), smallest H first (so the budget cuts the largest): each row checked against
    the memory limit (``limit`` bytes; default :func:`memory_limit`), then against the deadline with a prediction
    from the same estimator's row at the previous H (its time per step scaled by ``(H / H_prev)^exponent``), then
    timed."""
    q = int(quick)
    input_size = INPUT_SIZE[q]
    limit = memory_limit(device) if limit is None else limit
    rows: list[dict] = []
    previous: dict[tuple[str, int], tuple[int, float]] = {}  # (key, B) -> (H, warm-up seconds per step)
    exhausted: dict[tuple[str, int], int] = {}  # (key, B) -> the H that ran out of memory: larger ones would too
    for hidden in HIDDEN[q]:
        for streams in STREAMS[q]:
            for key, spec in ESTIMATORS.items():
                row = {
                    "estimator": key,
                    "label": spec.label,
                    "cell": CELLS[spec.cell].__name__,
                    "B": streams,
                    "H": hidden,
                    "I": input_size,
                    "dtype": "float32",
                    "estimated_mb": estimated_bytes(key, streams, hidden, input_size) / 2**20,
                }
                reason = _memory_skip(key, streams, hidden, input_size, limit)
                if reason is None and (key, streams) in exhausted:
                    reason = f"memory: out of memory at H = {exhausted[(key, streams)]} already"
                elif reason is None and (key, streams) in previous:
                    last_h, last_s = previous[(key, streams)]
                    predicted = last_s * (hidden / last_h) ** spec.cost_exponent
                    warm = TBPTT_K + 2 if key == "tbptt" else 2
                    reason = _budget_skip((warm + ROUNDS[q] * MIN_STEPS) * predicted, deadline)
                elif reason is None and deadline.left() <= 0:
                    reason = "budget: the section's share was spent"
                if reason is None:
                    try:
                        row |= time_online_step(key, streams, hidden, input_size, device, quick, deadline)
                    except Exception as error:  # recorded in the row: one failing size must not end the section
                        if not _is_out_of_memory(error):
                            row["failed"] = f"{type(error).__name__}: {error}"[:500]
                        else:
                            row["skipped"] = f"memory: out of memory ({type(error).__name__})"
                            exhausted[(key, streams)] = hidden
                    finally:
                        _free_memory(device)
                    if "warm_up_ms_per_step" in row:
                        previous[(key, streams)] = (hidden, row["warm_up_ms_per_step"] / 1e3)
                else:
                    row["skipped"] = reason
                rows.append(row)
                shown = (
                    f"{row['ms_per_step']:.3f} ms/step"
                    if "ms_per_step" in row
                    else row.get("skipped") or f"FAILED {row.get('failed')}"
                )
                print(f"  online: {spec.label:30s} B={streams:5d} H={hidden:5d}  {shown}", flush=True)
    failed = [r for r in rows if "failed" in r]
    status = f"failed: {len(failed)} of {len(rows)} rows failed" if failed else _partial(rows)
    return {
        "status": status,
        "rows": rows,
        "memory_limit_mb": limit / 2**20,
        "rounds": ROUNDS[q],
        "row_seconds": ROW_SECONDS[q],
        "what": "est.step(x, state) then est.gradient(state, grad_h), a fixed grad_h; float32; TanhRNNCell(I, H), "
        "LinearRecurrentUnit(I, H) for DiagonalRTRL",
    }


# -- sections 4 and 5: child processes -----------------------------------------------------------------------------
def free_port() -> int:
    """A free TCP port for the DDP rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_child(section: str, device: torch.device, quick: bool, out: Path, seconds: float) -> dict:
    """``python -m benchmarks._gpu_suite_children SECTION`` in a session of its own (so that the processes it starts
    can be stopped with it), stopped after ``seconds``. Returns ``{"returncode", "seconds", "output"}`` (the last
    lines of its output) and ``"stopped"`` when it was stopped."""
    command = [sys.executable, "-m", "benchmarks._gpu_suite_children", section, "--device", str(device)]
    command += ["--out", str(out), *(["--quick"] if quick else [])]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    started = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    result: dict = {}
    try:
        output, _ = child.communicate(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child's session: it and the ranks it started, nothing else
        output, _ = child.communicate()
        result["stopped"] = f"budget: stopped after {seconds:.3g} s"
    result |= {
        "returncode": child.returncode,
        "seconds": time.perf_counter() - started,
        "output": "\n".join(output.strip().splitlines()[-60:]),
    }
    return result


def compile_available() -> bool:
    """Whether ``OnlineRNNModule``'s constructor takes a ``compile`` argument."""
    from lightning_ortho.models import OnlineRNNModule

    return "compile" in inspect.signature(OnlineRNNModule).parameters


def unavailable(section: str, device: torch.device) -> str | None:
    """The status of a section that cannot run here whatever the budget (``"not available: ..."``), else ``None``:
    the compiled chunk without ``OnlineRNNModule(compile=...)``, DDP with ``nccl`` on fewer than two GPUs."""
    if section == "compiled_chunk" and not compile_available():
        return NOT_AVAILABLE_COMPILE
    if section == "ddp" and device.type == "cuda" and torch.cuda.device_count() < 2:  # nccl: one GPU per process
        return (
            f"not available: DDP with nccl needs 2 GPUs (one per process), {torch.cuda.device_count()} visible; "
            "the two-process gloo fit runs on the CPU (--device cpu)"
        )
    return None


def run_compiled_chunk(device: torch.device, quick: bool, deadline: Deadline) -> dict:
    missing = unavailable("compiled_chunk", device)
    if missing:
        return {"status": missing}
    with tempfile.TemporaryDirectory(prefix="gpu_suite-") as folder:
        child = run_child("compiled", device, quick, Path(folder), deadline.left())
        found = Path(folder) / "compiled.json"
        figures = json.loads(found.read_text()) if found.is_file() else None
    if figures is not None and child["returncode"] == 0:
        return {"status": "ok", **figures, "child_seconds": child["seconds"]}
    if "stopped" in child:
        return {"status": "skipped: " + child["stopped"], "output": child["output"]}
    return {"status": f"failed: the child exited with {child['returncode']}", "output": child["output"]}


def run_ddp(device: torch.device, quick: bool, deadline: Deadline) -> dict:
    from benchmarks._gpu_suite_children import SIZES, backend

    missing = unavailable("ddp", device)
    if missing:
        return {"status": missing}
    with tempfile.TemporaryDirectory(prefix="gpu_suite-") as folder:
        child = run_child("ddp", device, quick, Path(folder), deadline.left())
        ranks = {}
        waited = time.monotonic() + 10.0  # rank 1 may still be writing when rank 0 (the child) has exited
        while len(ranks) < 2 and time.monotonic() < waited:
            ranks = {r: Path(folder) / f"ddp-rank{r}.json" for r in (0, 1)}
            ranks = {r: json.loads(p.read_text()) for r, p in ranks.items() if p.is_file()}
            if len(ranks) < 2:
                time.sleep(0.2)
    sizes = SIZES[int(quick)]
    result: dict = {
        "backend": backend(device),
        "processes": 2,
        "recipe": "recipes/online_adding.yaml",
        "sizes": sizes,
        "child_seconds": child["seconds"],
        "returncode": child["returncode"],
        "ranks": [ranks[r] for r in sorted(ranks)],
        "both_ranks_finished": len(ranks) == 2 and all(r.get("finished") for r in ranks.values()),
    }
    if ranks:
        per_rank = []
        for report in ranks.values():
            steady = report["chunk_seconds"][1:] or report["chunk_seconds"]
            per_rank.append(1e3 * statistics.median(steady) / report["steps_per_chunk"])
        result["ms_per_step"] = max(per_rank)  # the slower rank sets the pace
        result["ms_per_step_per_rank"] = per_rank
    if len(ranks) == 2:
        result["parameters_equal_across_ranks"] = ranks[0]["parameters_sha1"] == ranks[1]["parameters_sha1"]
    if "stopped" in child:
        status = "skipped: " + child["stopped"]
    elif child["returncode"] != 0 or not result["both_ranks_finished"]:
        status = f"failed: exit {child['returncode']}, ranks finished: {sorted(ranks)}"
    elif not result["parameters_equal_across_ranks"]:
        status = "failed: the ranks' parameters differ after the fit"
    else:
        status = "ok"
    if status != "ok":
        result["output"] = child["output"]
    return {"status": status, **result}


# -- the run -------------------------------------------------------------------------------------------------------
def run_section(
    section: str, device: torch.device, quick: bool, deadline: Deadline, rounds: int, limit: int | None
) -> dict:
    if section == "small":
        return run_small(device, quick, deadline, rounds)
    if section == "orthogonal":
        return run_orthogonal(device, quick, deadline, rounds)
    if section == "online_steps":
        return run_online_steps(device, quick, deadline, limit)
    if section == "compiled_chunk":
        return run_compiled_chunk(device, quick, deadline)
    return run_ddp(device, quick, deadline)


def run_suite(
    device: torch.device, quick: bool, budget_s: float, sections, rounds: int, limit: int | None = None
) -> tuple[dict, float]:
    """``({section: result}, seconds)``: each of ``sections`` in order within its share of ``budget_s``; ``limit``:
    the online steps' memory limit in bytes (default :func:`memory_limit`)."""
    total = Deadline.after(budget_s)
    started = time.perf_counter()
    results: dict[str, dict] = {}
    chosen = [s for s in SECTIONS if s in sections]
    for index, section in enumerate(chosen):
        share = allowance(max(total.left(), 0.0), section, chosen[index:])
        need = MIN_SECONDS[section][int(quick)]
        missing = unavailable(section, device)
        if missing:  # said as such, whatever the budget; its share passes on
            results[section] = {"status": missing}
            print(f"{section}: {missing}", flush=True)
            continue
        if share < need:
            results[section] = {"status": "skipped: budget", "allowance_s": share, "needs_s": need}
            print(f"{section}: skipped: budget ({share:.3g} s of the {need:g} s it needs)", flush=True)
            continue
        print(f"{section}: up to {share:.0f} s", flush=True)
        begun = time.perf_counter()
        try:
            result = run_section(section, device, quick, Deadline.after(share), rounds, limit)
        except Exception as error:  # recorded: one failing section must not end the suite
            result = {
                "status": f"failed: {type(error).__name__}: {error}"[:500],
                "traceback": traceback.format_exc()[-3000:],
            }
        finally:
            _free_memory(device)
        status, seconds = result.pop("status"), time.perf_counter() - begun
        results[section] = {"status": status, "seconds": seconds, "allowance_s": share, **result}
        print(f"{section}: {results[section]['status']} ({results[section]['seconds']:.1f} s)", flush=True)
    return results, time.perf_counter() - started


def result_path(output: Path, device: torch.device, suffix: str) -> Path:
    """``OUTPUT/gpu_suite-DEVICE{suffix}.json`` (``DEVICE``: ``cuda``, ``cpu``)."""
    return Path(output) / f"gpu_suite-{device.type}{suffix}.json"


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("gpu_suite", __doc__)
    parser.set_defaults(device="cuda")
    parser.add_argument("--out", dest="output", type=Path, help="the same as --output")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="the sections to run")
    parser.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="memory one online-steps row may take (default: 80%% of the GPU's free memory; on the CPU half the "
        "available memory, at most 8 GiB)",
    )
    args = parse_args(parser, argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s:g}")
    if args.memory_limit_gb is not None and args.memory_limit_gb <= 0:
        parser.error(f"--memory-limit-gb must be positive, got {args.memory_limit_gb:g}")
    limit = None if args.memory_limit_gb is None else int(args.memory_limit_gb * 2**30)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here; run with --device cpu --quick for a smoke run")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"--device {args.device}: the suite runs on cuda or cpu")
    with configured(args) as device:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        rounds = args.rounds or ROUNDS[int(args.quick)]
        sections, seconds = run_suite(device, args.quick, args.budget_s, args.sections, rounds, limit)
        payload = {
            "benchmark": "gpu_suite",
            "device": device.type,
            "device_name": device_name(device),
            "hardware": hardware_name(device),
            "hardware_description": hardware_description(device),
            "torch": torch.__version__.split("+")[0],
            "cuda": torch.version.cuda,
            "date": _dt.date.today().isoformat(),
            "command": args.command,
            "quick": args.quick,
            "budget_s": args.budget_s,
            "total_seconds": round(seconds, 1),
            "sections": sections,
        }
        path = result_path(args.output, device, args.suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    for name, result in sections.items():
        print(f"[{result['status']}] {name}")
    print(f"wrote {path} ({payload['total_seconds']} s)")
    return path


if __name__ == "__main__":
    written = main()
    failed = [n for n, r in json.loads(written.read_text())["sections"].items() if r["status"].startswith("failed")]
    sys.exit(1 if failed else 0)
