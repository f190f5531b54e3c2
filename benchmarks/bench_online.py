"""Time per step and peak memory of the online gradient estimators of lightning_ortho.online against backprop
through time, on a tanh RNN with a linear readout and a loss at every step.

    python -m benchmarks.bench_online           # H in {32, 64, 128, 512}, T in {10^2, 10^3, 10^4} (12 minutes, one core)
    python -m benchmarks.bench_online --quick   # tiny H and T, seconds (used by the tests)

Model: ``TanhRNNCell(INPUT_SIZE, H)``, ``nn.Linear(H, OUTPUTS)`` readout, loss ``MSE(readout(h_t), y_t)`` at every
step, ``BATCH`` independent streams; inputs and targets cycle through a fixed pool of POOL random draws (so the
data does not grow with T). Methods, each with what one *step* is:

* ``forward``: ``cell(x_t, h)`` under ``torch.no_grad()`` -- the baseline of ``ratio_to_forward_step``;
* ``bptt``: full backprop through time: a forward pass over the sequence with autograd recording (cell, readout,
  loss), then one backward pass of the summed loss; time per step = total / steps;
* ``uoro`` with ``projection`` state / preactivation / parameter / none (GIR rescaling), ``rtrl`` and ``tbptt``
  (``TruncatedBPTT(cell, k=TBPTT_K)``): ``est.step``, the readout loss, ``dL_t/dh_t`` (and the readout's
  gradient) by autograd, ``est.gradient`` and adding it to the accumulated gradient. TruncatedBPTT's
  ``gradient`` replays its window of ``k`` steps with autograd at every step, so its step is about ``k``
  forward+backward steps.

Time (rows with ``"section": "time"``): per H, every method keeps its own running stream; methods are
interleaved in a random order within each round and each runs enough steps for about ROUND_SECONDS per round
(BPTT at least BPTT_MIN_STEPS, the sequence it backpropagates through). The best round's mean time per step is
reported (``time_per_step_ms``; the machine's noise only ever adds time) beside the median
(``time_per_step_median_ms``); ratios are ratios of best rounds. Online estimators cost the same per step at any T
(their state has a fixed size), so a few hundred steps measure them; glibc keeps freed memory
(``keep_freed_memory``) as in the other CPU benchmarks.

Peak memory (rows with ``"section": "memory"``): every (method, H, T) runs in a fresh process forked from a
fork server that has only imported torch and lightning_ortho.online, with glibc's mmap and trim thresholds fixed
at 128 KiB (blocks of 128 KiB or more are mapped on allocation and unmapped on free; the default dynamic
threshold made the same configuration's peak vary by 2.5x between runs). That process
builds the cell, readout and data pool and runs the method for WARM_UP_STEPS steps on a throw-away estimator
state (lazy imports, kernel and autograd-engine buffers: one-off costs that are not the method's memory), frees
it and gives the free heap pages back to the OS (``malloc_trim``); then it reads its resident set (VmRSS),
resets the kernel's high-water mark (``echo 5 > /proc/self/clear_refs``), runs the method for T steps from a
fresh estimator state (BPTT: the whole sequence, then its backward pass), and reports ``peak_memory_mb`` =
high-water mark (VmHWM) - that baseline. Why this measure: PyTorch keeps no allocator statistics for CPU tensors,
and the profiler's memory events on 10^4 steps cost more than the steps; the kernel's high-water mark sees every
allocation of the run, transients included, at page (4 KiB) resolution and at no cost, and a fresh process per
configuration means no heap left over from another one (``ru_maxrss`` is not used: it cannot be reset and it
keeps the peak of the process image before exec). What it counts beyond tensors (allocator slack and
fragmentation, Python objects, the autograd graph's nodes) is memory the method really costs: it grows by
0.1-0.3 MB over the first thousands of steps even where the bytes in use stay the same, and blocks under
128 KiB (BPTT's per-step activations) land in the heap, whose layout differs between runs (BPTT at H = 512,
T = 1000 measures 33 or 67 MB).
``state_mb`` is the size of the estimator's state after the last step (its tensors), for comparison, and
``in_use_mb`` / ``heap_mb`` are glibc's ``mallinfo2`` at the end of the run above the baseline: bytes still
allocated (state, accumulated gradients; BPTT has freed its graph) and the size of the heap, in-use plus free
chunks (what fragmentation grows).

Configurations that would take more than MEMORY_BUDGET_S seconds (median time per step of the time section x T;
five times that for UORO (state)), and RTRL above RTRL_MAX_BYTES of influence matrix, are skipped with the
reason.

Targets: UORO's peak memory at T = 10^4 within 1.1x of T = 10^2; a UORO step (state projection) within
3x of a forward step; RTRL's O(H^4) time (fitted exponent of time per step vs H); BPTT's memory growing with T.
Writes benchmarks/results/bench_online-HARDWARE.json (+ .png); results table: bench_online_render.py.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import math
import multiprocessing
import os
import re
import time
from pathlib import Path

import torch

from benchmarks._common import (
    TOTAL,
    benchmark_parser,
    configured,
    interleave,
    keep_freed_memory,
    parse_args,
    print_claims,
    pyplot,
    reject,
    result_path,
    time_call,
    write_result,
)
from benchmarks._online_problem import (  # noqa: F401  (the problem and the methods, shared with bench_small)
    BATCH,
    INPUT_SIZE,
    METHODS,
    OUTPUTS,
    POOL,
    TBPTT_K,
    Problem,
    Runner,
    make_estimator,
)

FULL_TIME_HIDDEN, FULL_MEMORY_HIDDEN, FULL_LENGTHS = (32, 64, 128, 512), (32, 128, 512), (100, 1000, 10000)
QUICK_TIME_HIDDEN, QUICK_MEMORY_HIDDEN, QUICK_LENGTHS = (8, 16), (8,), (20, 200)
#: Methods whose memory --quick measures (a fresh process each: about a second per configuration).
QUICK_MEMORY_METHODS = ("forward", "bptt", "uoro_state")
#: Seconds of steps per method per timing round, and the bounds on the number of steps.
ROUND_SECONDS, MIN_STEPS, MAX_STEPS, BPTT_MIN_STEPS = 0.5, 3, 1000, 200
#: Estimated seconds (time per step x T) above which a memory configuration is skipped; UORO (state), the
#: estimator of the memory target, gets MEMORY_BUDGET_FACTORS times more.
MEMORY_BUDGET_S = 60.0
MEMORY_BUDGET_FACTORS = {"uoro_state": 5.0}
#: RTRL's influence matrix B x H x P floats; a step also materialises the parameter Jacobian of the same size.
RTRL_MAX_BYTES = 1 << 30
#: glibc's mmap and trim thresholds in the processes that measure memory (see _static_malloc_thresholds).
MALLOC_THRESHOLD = 128 << 10
#: Steps of the method run (and freed) before the baseline of a memory measurement.
WARM_UP_STEPS = TBPTT_K + 2


def label(method: str, projection: str | None = None) -> str:
    return {
        "forward": "forward step (no_grad)",
        "bptt": "BPTT (full)",
        "tbptt": f"TruncatedBPTT (k={TBPTT_K})",
        "rtrl": "RTRL",
    }.get(method, f"UORO ({projection})")


def parameters_of(hidden: int, input_size: int = INPUT_SIZE) -> int:
    return hidden * hidden + hidden * input_size + hidden


def skip_reason(key: str, hidden: int, batch: int = BATCH, input_size: int = INPUT_SIZE) -> str | None:
    """Why ``key`` is not run at all at this H (its influence matrix would not fit), or ``None``."""
    if key == "rtrl":
        influence = batch * hidden * parameters_of(hidden, input_size) * 4
        if influence > RTRL_MAX_BYTES:
            return (
                f"RTRL's influence matrix at H={hidden} is B x H x P = {batch} x {hidden} x "
                f"{parameters_of(hidden, input_size):,} floats = {influence / 2**30:.1f} GiB (a step also builds the "
                f"parameter Jacobian of that size and costs B H^2 P = {batch * hidden**2 * parameters_of(hidden, input_size):.1e} "
                "multiply-adds)"
            )
    return None


# -- time ----------------------------------------------------------------------------------------------------------
def measure_time(
    hiddens, rounds: int, round_seconds: float, bptt_min_steps: int, max_steps: int = MAX_STEPS
) -> list[dict]:
    rows = []
    for hidden in hiddens:
        problem = Problem(hidden)
        runners, steps = {}, {}
        for key in METHODS:
            reason = skip_reason(key, hidden)
            if reason:
                rows.append(_base_row("time", key, hidden) | {"skipped": reason})
                continue
            runners[key] = Runner(key, problem)
            runners[key].run(TBPTT_K + 2)  # warm-up: allocator, lazy init, TruncatedBPTT's window full
            estimate = time_call(lambda key=key: runners[key].run(MIN_STEPS))[0][TOTAL] / MIN_STEPS
            want = max(MIN_STEPS, min(max_steps, math.ceil(round_seconds / estimate)))
            steps[key] = max(want, bptt_min_steps) if key == "bptt" else want
        # one call = steps[key] steps of the runner's stream; the warm-up above replaces interleave's
        timing = interleave(
            {key: lambda key=key: runners[key].run(steps[key]) for key in runners}, rounds=rounds, warmup=0
        )
        for key in runners:
            row = _base_row("time", key, hidden) | {"T": steps[key], "rounds": timing.rounds(key)}
            row["time_per_step_ms"] = 1e3 * timing.best(key) / steps[key]
            row["time_per_step_median_ms"] = 1e3 * timing.median(key) / steps[key]
            if "forward" in runners:
                row["ratio_to_forward_step"] = (timing.best(key) / steps[key]) / (
                    timing.best("forward") / steps["forward"]
                )
            if "bptt" in runners:
                row["ratio_to_bptt_step"] = (timing.best(key) / steps[key]) / (timing.best("bptt") / steps["bptt"])
            rows.append(row)
            print(
                f"time   H={hidden:4d} {label(*METHODS[key]):26s} {row['time_per_step_ms']:10.3f} ms/step"
                + (f"  x{row['ratio_to_forward_step']:.1f} of forward" if "ratio_to_forward_step" in row else ""),
                flush=True,
            )
    return rows


def _base_row(section: str, key: str, hidden: int) -> dict:
    method, projection = METHODS[key]
    row = {"section": section, "method": method, "projection": projection, "H": hidden, "B": BATCH}
    if method == "tbptt":
        row["k"] = TBPTT_K
    return row


# -- memory --------------------------------------------------------------------------------------------------------
def _status_kb(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def _static_malloc_thresholds() -> None:
    """Fix glibc's mmap and trim thresholds at 128 KiB (its initial values; setting them turns off their dynamic
    growth): every block of 128 KiB or more is a mapping of its own, unmapped when freed, so the high-water mark
    follows the live large tensors instead of where the heap happened to put them. With the dynamic threshold the
    peak of UORO (state) at H = 512 measured anywhere from 38 to 105 MB in repeated runs of the same configuration."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, MALLOC_THRESHOLD)
        libc.mallopt(m_trim_threshold, MALLOC_THRESHOLD)
    except (OSError, AttributeError):
        pass


def _return_free_memory() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``), so that memory freed by the warm-up is
    not resident any more and reusing it shows in the high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _malloc_bytes() -> tuple[int, int] | None:
    """``(bytes in use, bytes of heap)`` of glibc's main arena and its mmapped chunks (``mallinfo2``), or ``None``."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd, info.arena + info.hblkhd


def memory_worker(key: str, hidden: int, steps: int, threads: int) -> dict:
    """Run in a fresh process: peak resident memory of ``steps`` steps of ``key`` above the post-setup baseline."""
    torch.set_num_threads(threads)
    _static_malloc_thresholds()
    problem = Problem(hidden)
    problem.warm_up()
    warm = Runner(key, problem)  # the method's own code path once: lazy imports, kernel and autograd buffers
    warm.run(WARM_UP_STEPS)
    del warm
    gc.collect()
    _return_free_memory()
    malloc_before = _malloc_bytes()
    baseline = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = time.perf_counter()
    runner = Runner(key, problem)
    runner.run(steps)
    seconds = time.perf_counter() - start
    peak = _status_kb("VmHWM")
    malloc_after = _malloc_bytes()
    state = runner.state_bytes()
    result = {
        "peak_memory_mb": (peak - baseline) / 1024,
        "baseline_rss_mb": baseline / 1024,
        "state_mb": None if state is None else state / 2**20,
        "run_s": seconds,
        "run_time_per_step_ms": 1e3 * seconds / steps,
    }
    if malloc_before and malloc_after:
        result["in_use_mb"] = (malloc_after[0] - malloc_before[0]) / 2**20
        result["heap_mb"] = (malloc_after[1] - malloc_before[1]) / 2**20
    return result


def _worker_entry(connection, args: tuple) -> None:
    try:
        connection.send(("ok", memory_worker(*args)))
    except BaseException as error:  # reported to the parent, which records the configuration as failed
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


def run_isolated(ctx, args: tuple, timeout: float) -> dict:
    """``memory_worker(*args)`` in a fresh process forked from the fork server.

    Raises:
        TimeoutError: no answer within ``timeout`` seconds (the process is killed).
        RuntimeError: the process raised, or died without answering (killed for memory).
    """
    # The function is pickled by reference: take it from the package module (not __main__ under python -m), which
    # the child imports from the same sys.path.
    entry = importlib.import_module("benchmarks.bench_online")._worker_entry
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=entry, args=(sender, args), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            process.kill()
            raise TimeoutError(f"no answer after {timeout:.0f} s")
        try:
            status, value = receiver.recv()
        except EOFError:
            process.join()
            raise RuntimeError(f"the process died without answering (exit code {process.exitcode})") from None
    finally:
        process.join()
        receiver.close()
    if status != "ok":
        raise RuntimeError(value)
    return value


def memory_support() -> str | None:
    """``None`` where the high-water mark can be read and reset, else why not."""
    try:
        _status_kb("VmHWM")
        if not os.access("/proc/self/clear_refs", os.W_OK):
            return "/proc/self/clear_refs is not writable (cannot reset the peak-RSS mark)"
    except (OSError, AttributeError) as error:
        return f"needs Linux /proc/self/status and clear_refs ({type(error).__name__}: {error})"
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "needs the forkserver start method of multiprocessing"
    return None


def _fork_server():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "lightning_ortho.online"])
    return ctx


def measure_memory(hiddens, lengths, time_rows: list[dict], budget_s: float, methods=tuple(METHODS)) -> list[dict]:
    rows = []
    unsupported = memory_support()
    per_step = {  # the median round: a long run meets the machine's noise, which the best round avoids
        (r["method"], r["projection"], r["H"]): r["time_per_step_median_ms"] / 1e3
        for r in time_rows
        if "skipped" not in r
    }
    ctx = None if unsupported else _fork_server()
    threads = torch.get_num_threads()
    for hidden in hiddens:
        for steps in lengths:
            for key in methods:
                method, projection = METHODS[key]
                row = _base_row("memory", key, hidden) | {"T": steps}
                reason = unsupported or skip_reason(key, hidden)
                estimate = per_step.get((method, projection, hidden))
                allowed = budget_s * MEMORY_BUDGET_FACTORS.get(key, 1.0)
                if reason is None and estimate is not None and steps > min(lengths) and estimate * steps > allowed:
                    reason = (
                        f"would take about {estimate * steps:.0f} s ({1e3 * estimate:.1f} ms per step x {steps} steps), "
                        f"over the {allowed:.0f} s budget of one configuration"
                    )
                if reason:
                    rows.append(row | {"skipped": reason})
                    print(
                        f"memory H={hidden:4d} T={steps:6d} {label(method, projection):26s} skipped: {reason}",
                        flush=True,
                    )
                    continue
                timeout = max(120.0, 10 * (estimate or 1.0) * steps)
                try:
                    row |= run_isolated(ctx, (key, hidden, steps, threads), timeout)
                except (RuntimeError, TimeoutError) as error:  # killed for memory, timed out: a finding, not a crash
                    row["skipped"] = f"the measuring process failed: {error}"
                rows.append(row)
                shown = f"{row['peak_memory_mb']:9.2f} MB" if "peak_memory_mb" in row else row["skipped"]
                print(f"memory H={hidden:4d} T={steps:6d} {label(method, projection):26s} {shown}", flush=True)
    return rows


# -- claims --------------------------------------------------------------------------------------------------------
def fitted_exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(time) against log(H)."""
    xs = [math.log(h) for h, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def claims_from(rows: list[dict]) -> list[dict]:
    claims = []
    memory = {
        (r["method"], r["projection"], r["H"], r["T"]): r["peak_memory_mb"]
        for r in rows
        if r.get("section") == "memory" and "peak_memory_mb" in r
    }
    lengths = sorted({t for *_, t in memory})
    timing = [r for r in rows if r.get("section") == "time" and "skipped" not in r]

    def memory_ratio(method, projection, hidden):
        measured = [t for t in lengths if (method, projection, hidden, t) in memory]
        if len(measured) < 2:
            return None
        low, high = (
            memory[(method, projection, hidden, measured[0])],
            memory[(method, projection, hidden, measured[-1])],
        )
        return measured[0], measured[-1], high / max(low, 1e-9)

    for hidden in sorted({h for _, _, h, _ in memory}):
        found = memory_ratio("uoro", "state", hidden)
        if found:
            low, high, ratio = found
            claims.append(
                {
                    "claim": f"UORO (state) peak memory at T={high} <= 1.1x T={low}, H={hidden}",
                    "figure": round(ratio, 3),
                    "holds": ratio <= 1.1,
                }
            )
    for row in timing:
        if (row["method"], row["projection"]) == ("uoro", "state") and "ratio_to_forward_step" in row:
            claims.append(
                {
                    "claim": f"UORO (state) step <= 3x a forward step, H={row['H']}",
                    "figure": round(row["ratio_to_forward_step"], 2),
                    "holds": row["ratio_to_forward_step"] <= 3,
                }
            )
    rtrl = sorted((r["H"], r["time_per_step_ms"]) for r in timing if r["method"] == "rtrl")
    if len(rtrl) >= 2:
        exponent = fitted_exponent(rtrl)
        claims.append(
            {
                "claim": "RTRL time per step grows like H^4 (B H^2 P multiply-adds): fitted exponent over H = "
                + ", ".join(str(h) for h, _ in rtrl)
                + " >= 3",
                "figure": round(exponent, 2),
                "holds": exponent >= 3,
            }
        )
        if len(rtrl) >= 3:  # at small H the per-step overhead hides the H^4 term: the slope at the top of the range
            (low, low_ms), (high, high_ms) = rtrl[-2], rtrl[-1]
            local = math.log(high_ms / low_ms) / math.log(high / low)
            claims.append(
                {
                    "claim": f"... its local exponent between the two largest H ({low} -> {high}) >= 3",
                    "figure": round(local, 2),
                    "holds": local >= 3,
                }
            )
    for hidden in sorted({h for _, _, h, _ in memory}):
        found = memory_ratio("bptt", None, hidden)
        if found:
            low, high, ratio = found
            claims.append(
                {
                    "claim": f"BPTT peak memory grows with T: T={high} >= 10x T={low}, H={hidden}",
                    "figure": round(ratio, 1),
                    "holds": ratio >= 10,
                }
            )
    return claims


# -- plot ----------------------------------------------------------------------------------------------------------
def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    import matplotlib.ticker

    memory = [r for r in rows if r.get("section") == "memory" and "peak_memory_mb" in r]
    hiddens = sorted({r["H"] for r in memory})
    fig, axes = plt.subplots(1, 1 + len(hiddens), figsize=(5 * (1 + len(hiddens)), 4), squeeze=False)
    timing = [r for r in rows if r.get("section") == "time" and "skipped" not in r]
    ax = axes[0][0]
    for method, projection in METHODS.values():
        pts = sorted(
            (r["H"], r["time_per_step_ms"]) for r in timing if (r["method"], r["projection"]) == (method, projection)
        )
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                marker="o",
                label=label(method, projection),
                ls="--" if method == "forward" else "-",
            )
    ax.set(xscale="log", yscale="log", xlabel="H", ylabel="time per step (ms)", title=f"time per step, B = {BATCH}")
    hiddens_timed = sorted({r["H"] for r in timing})
    ax.set_xticks(hiddens_timed, [str(h) for h in hiddens_timed])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.legend(fontsize=7)
    for ax, hidden in zip(axes[0][1:], hiddens, strict=True):
        for method, projection in METHODS.values():
            pts = sorted(
                (r["T"], max(r["peak_memory_mb"], 1e-2))
                for r in memory
                if r["H"] == hidden and (r["method"], r["projection"]) == (method, projection)
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label(method, projection))
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="T (steps)",
            ylabel="peak memory above baseline (MB)",
            title=f"H = {hidden}",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("bench_online", __doc__)
    parser.add_argument("--memory-budget", type=float, default=None, help="seconds per memory configuration")
    args = parse_args(parser, argv)
    reject(parser, args, device="bench_online runs on the CPU only")
    with configured(args) as device:
        started = time.perf_counter()
        allocator = keep_freed_memory()
        if args.quick:
            time_hidden, memory_hidden, lengths = QUICK_TIME_HIDDEN, QUICK_MEMORY_HIDDEN, QUICK_LENGTHS
            rounds, round_seconds, bptt_steps, max_steps = args.rounds or 2, 0.01, 20, 50
        else:
            time_hidden, memory_hidden, lengths = FULL_TIME_HIDDEN, FULL_MEMORY_HIDDEN, FULL_LENGTHS
            rounds, round_seconds, bptt_steps, max_steps = args.rounds or 5, ROUND_SECONDS, BPTT_MIN_STEPS, MAX_STEPS
        budget = args.memory_budget if args.memory_budget is not None else MEMORY_BUDGET_S
        rows = measure_time(time_hidden, rounds, round_seconds, bptt_steps, max_steps)
        methods = QUICK_MEMORY_METHODS if args.quick else tuple(METHODS)
        rows += measure_memory(memory_hidden, lengths, rows, budget, methods)
        claims = claims_from(rows)
        extra = {
            "setup": {
                "cell": f"TanhRNNCell(input_size={INPUT_SIZE}, H)",
                "readout": f"nn.Linear(H, {OUTPUTS}), MSE loss at every step",
                "B": BATCH,
                "tbptt_k": TBPTT_K,
                "uoro": "rescaling='gir'",
                "timing_rounds": rounds,
                "memory_budget_s": budget,
                "allocator": allocator or "default",
            },
            "memory_method": (
                "a fresh process per configuration: its peak resident set during the run (VmHWM, reset just before) "
                "minus its resident set after setup and a freed warm-up run; glibc mmap threshold fixed at 128 KiB"
            ),
        }
        extra["total_seconds"] = round(time.perf_counter() - started, 1)
        path = write_result("bench_online", device, rows, claims, args, extra=extra)
        plot(rows, result_path("bench_online", device, args, ".png"))
    print_claims(claims)
    print(f"wrote {path} ({extra['total_seconds']:.0f} s)")
    return path


if __name__ == "__main__":
    main()
