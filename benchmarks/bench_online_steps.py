"""One stream, one thread: a step + gradient of every online estimator of lightning_ortho.online against a plain
NumPy implementation of the same algorithm (benchmarks/_numpy_online.py), side by side in one interleaved run.

    python -m benchmarks.bench_online_steps            # H = 32, 64; float64 and float32 (a few minutes)
    python -m benchmarks.bench_online_steps --quick    # H = 8, one round (seconds; the tests use it)

Setup: one stream (``B = 1``), torch on one thread (``--threads 1``) and NumPy's BLAS on one thread
(``threadpoolctl`` where it is installed, else ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS``,
which the script sets to 1 before NumPy loads unless they are given; ``setup.numpy_threads`` says which), glibc keeping freed memory
(``keep_freed_memory``) for both sides. Cell: ``TanhRNNCell(INPUT_SIZE, H)`` with ``INPUT_SIZE = 8``; for
DiagonalRTRL, which takes only cells that declare a diagonal recurrence, ``LinearRecurrentUnit(INPUT_SIZE, H)``
(complex state). Rows, each one step + its gradient as an online learner calls them (``h, state = est.step(x,
state)``, ``est.gradient(state, g)`` with a fixed pool of inputs ``x`` and ``g = dL_t/dh_t``):

* ``forward``: ``cell(x, h)`` under ``torch.no_grad()`` against ``np.tanh(W_h @ h + W_x @ x + b)`` (goal <= 1.5x);
* ``rtrl``: ``RTRL(cell)``; ``uoro``: ``UORO(cell)`` (its defaults: GIR, noise at the state); ``kf_rtrl``:
  ``KFRTRL(cell)``; ``rflo``: ``RFLO(cell, tau=RFLO_TAU)``; ``snap1``: ``SnAp(cell, order=1)``; ``tbptt``:
  ``TruncatedBPTT(cell, k=TBPTT_K)`` (its gradient at every step); ``diagonal_rtrl``: ``DiagonalRTRL(lru)``
  (goal <= 1.0x each).

Timing: ``benchmarks._common.interleave``, ours and NumPy's alternating (A B, B A, ...) after warm-up steps and one
untimed round; a call runs ``steps_per_call`` steps of its own running stream, repeated for at least ``min_time``
seconds per round. ``ratio`` is the median over rounds of each round's ours / NumPy (drift of a shared machine
cancels), beside the ratio of the two medians and of the best rounds; the times are medians per step.

Agreement: before timing, every row runs ``check_steps`` steps of ours and of the NumPy reference from the same
state, inputs and parameters (UORO's and KF-RTRL's NumPy noise replays what the torch generator of the estimator
draws: :class:`GeneratorNoise`) and records the largest difference of the new state and of every gradient entry,
relative to the reference's largest entry (at least 1): at most ``1e-10`` in float64 and ``1e-4`` in float32 (a few
hundred roundings of float32's ``6e-8``). The timings compare the same computation only where it holds.

Writes benchmarks/results/bench_online_steps-HARDWARE.json; its table: bench_online_steps_render.py.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: NumPy's BLAS reads these when it loads: run as a script, they are set before its import (without threadpoolctl
#: they are what keeps it on one thread); imported by the tests or the report, the process is left as it is.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
if __name__ == "__main__":
    for _variable in THREAD_VARIABLES:
        os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import _numpy_online as reference  # noqa: E402
from benchmarks._common import (  # noqa: E402
    benchmark_parser,
    configured,
    interleave,
    keep_freed_memory,
    median,
    parse_args,
    print_claims,
    reject,
    write_result,
)
from benchmarks.bench_online_steps_render import LABELS  # noqa: E402
from lightning_ortho.online import (  # noqa: E402
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

INPUT_SIZE = 8
RFLO_TAU = 2.0
TBPTT_K = 8
#: the rows' estimators, in table order ("forward": the cell's step alone)
ESTIMATORS = tuple(LABELS)
#: ours / NumPy at most this (goal 1 of the speed work)
GOALS = {name: (1.5 if name == "forward" else 1.0) for name in ESTIMATORS}
DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: largest relative difference between ours and the NumPy reference over the agreement steps
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
#: (full, quick)
HIDDEN = ((32, 64), (8,))
ROUNDS = (15, 1)
MIN_TIME = (0.05, 0.001)
STEPS_PER_CALL = (16, 2)
CHECK_STEPS = (6, 3)
POOL = 32
SEED = 0


# -- the two sides -------------------------------------------------------------------------------------------------
class GeneratorNoise:
    """The noise a UORO or KF-RTRL state draws, replayed for the NumPy reference: a ``torch.Generator`` seeded as the
    estimator seeds its state's (``generator=seed``), and the same calls in the same order and dtype (UORO: ``randn``
    of the ``H`` entries of ``nu``, then ``randint`` of one bit for ``tau``; KF-RTRL: ``randint`` of two bits for
    ``c1, c2``; a bit ``b`` is the sign ``2 b - 1``)."""

    def __init__(self, seed: int, dtype: torch.dtype) -> None:
        self.generator, self.dtype = torch.Generator().manual_seed(seed), dtype

    def normal(self, n: int) -> np.ndarray:
        return torch.randn(1, n, generator=self.generator, dtype=self.dtype)[0].numpy()

    def signs(self, n: int) -> np.ndarray:
        bits = torch.randint(0, 2, (1, n), generator=self.generator, dtype=self.dtype)[0]
        return (2 * bits - 1).numpy()


def make_cell(name: str, hidden: int, dtype: torch.dtype, seed: int = SEED) -> torch.nn.Module:
    """``TanhRNNCell(INPUT_SIZE, hidden)`` (``LinearRecurrentUnit`` for ``"diagonal_rtrl"``) in ``dtype``."""
    torch.manual_seed(seed)
    cell = LinearRecurrentUnit(INPUT_SIZE, hidden) if name == "diagonal_rtrl" else TanhRNNCell(INPUT_SIZE, hidden)
    return cell.to(dtype)


def make_estimator(name: str, cell: torch.nn.Module, seed: int | None = None):
    """Ours for row ``name`` (``None`` for ``"forward"``); ``seed`` fixes UORO's and KF-RTRL's noise."""
    if name == "forward":
        return None
    return {
        "rtrl": lambda: RTRL(cell),
        "uoro": lambda: UORO(cell, generator=seed),
        "kf_rtrl": lambda: KFRTRL(cell, generator=seed),
        "rflo": lambda: RFLO(cell, tau=RFLO_TAU),
        "snap1": lambda: SnAp(cell, order=1),
        "tbptt": lambda: TruncatedBPTT(cell, TBPTT_K),
        "diagonal_rtrl": lambda: DiagonalRTRL(cell),
    }[name]()


def numpy_parameters(cell: torch.nn.Module) -> dict[str, np.ndarray]:
    """The cell's parameters as NumPy arrays of their dtype (copies: the reference owns them)."""
    return {name: p.detach().numpy().copy() for name, p in cell.named_parameters()}


def make_reference(name: str, cell: torch.nn.Module, noise=None):
    """The NumPy implementation of row ``name`` on a copy of ``cell``'s parameters; ``noise`` (UORO, KF-RTRL):
    a :class:`~benchmarks._numpy_online.Noise`-like source (default NumPy's generator)."""
    params = numpy_parameters(cell)
    if name == "diagonal_rtrl":
        return reference.DiagonalRTRL(params)
    numpy_cell = reference.TanhRNN(params["weight_hh"], params["weight_ih"], params["bias"])
    noise = noise if noise is not None else reference.Noise(SEED, numpy_cell.dtype)
    return {
        "forward": lambda: reference.Forward(numpy_cell),
        "rtrl": lambda: reference.RTRL(numpy_cell),
        "uoro": lambda: reference.UORO(numpy_cell, noise),
        "kf_rtrl": lambda: reference.KFRTRL(numpy_cell, noise),
        "rflo": lambda: reference.RFLO(numpy_cell, RFLO_TAU),
        "snap1": lambda: reference.SnAp1(numpy_cell),
        "tbptt": lambda: reference.TruncatedBPTT(numpy_cell, TBPTT_K),
    }[name]()


def make_data(name: str, hidden: int, dtype: torch.dtype, count: int, seed: int = SEED + 1):
    """``(h0 (1, H), inputs (count, 1, I), grads (count, 1, H))`` in ``dtype`` (complex ``h0`` and ``g`` for the
    linear recurrent unit's state)."""
    generator = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(shape, generator=generator, dtype=dtype)  # noqa: E731
    h0, inputs, grads = 0.5 * draw(1, hidden), draw(count, 1, INPUT_SIZE), draw(count, 1, hidden)
    if name == "diagonal_rtrl":
        h0, grads = torch.complex(h0, 0.5 * draw(1, hidden)), torch.complex(grads, draw(count, 1, hidden))
    return h0, inputs, grads


def _numpy_rows(values: torch.Tensor) -> list[np.ndarray]:
    """One contiguous NumPy vector per entry of ``values`` ``(count, 1, n)``."""
    return [np.ascontiguousarray(v[0].numpy()) for v in values]


# -- agreement -----------------------------------------------------------------------------------------------------
def agreement(
    name: str, hidden: int, dtype: torch.dtype, steps: int, *, perturb: float = 0.0, replay_noise: bool = True
) -> float:
    """The largest difference between ours and the NumPy reference over ``steps`` steps from the same state (the
    new state ``h``, and every gradient entry), each relative to the reference's largest entry of that tensor (at
    least 1). The tests show that the check fails where the two compute different numbers: ``perturb`` moves the
    reference's first parameter by that much, ``replay_noise=False`` gives it NumPy's own noise.
    """
    cell = make_cell(name, hidden, dtype)
    estimator = make_estimator(name, cell, seed=SEED)
    ref = make_reference(name, cell, GeneratorNoise(SEED, dtype) if replay_noise else None)
    if perturb:
        first = next(iter(numpy_parameters(cell)))
        target = ref.params if name == "diagonal_rtrl" else vars(ref.cell)
        target[first] += perturb
    h0, inputs, grads = make_data(name, hidden, dtype, steps)
    ref.initial(h0[0].numpy())
    state = estimator.initial_state(h0) if estimator is not None else None
    h, worst = h0, 0.0
    for t in range(steps):
        if estimator is None:
            with torch.no_grad():
                h = cell(inputs[t], h)
            pairs = [(h[0], ref.step(inputs[t][0].numpy()))]
        else:
            h, state = estimator.step(inputs[t], state)
            pairs = [(h[0], ref.step(inputs[t][0].numpy()))]
            ours, theirs = estimator.gradient(state, grads[t]), ref.gradient(grads[t][0].numpy())
            if set(ours) != set(theirs):
                raise AssertionError(f"{name}: the reference returns {sorted(theirs)}, ours {sorted(ours)}")
            pairs += [(ours[key], theirs[key]) for key in ours]
        for mine, other in pairs:
            other = torch.as_tensor(np.asarray(other))
            if mine.shape != other.shape:
                raise AssertionError(f"{name}: shapes {tuple(mine.shape)} (ours) and {tuple(other.shape)} (NumPy)")
            scale = max(1.0, float(other.abs().max()))
            worst = max(worst, float((mine.detach().to(other.dtype) - other).abs().max()) / scale)
    return worst


# -- timing --------------------------------------------------------------------------------------------------------
def _ours(name: str, cell, estimator, h0, inputs, grads, steps: int) -> Callable[[], None]:
    """A call of ``steps`` steps (+ gradients) of our running stream."""
    count, clock = len(inputs), [0]
    if estimator is None:
        hidden = [h0]

        def forward() -> None:
            h, t = hidden[0], clock[0]
            with torch.no_grad():
                for _ in range(steps):
                    h = cell(inputs[t % count], h)
                    t += 1
            hidden[0], clock[0] = h, t

        return forward
    states = [estimator.initial_state(h0)]

    def online() -> None:
        state, t = states[0], clock[0]
        for _ in range(steps):
            _, state = estimator.step(inputs[t % count], state)
            estimator.gradient(state, grads[t % count])
            t += 1
        states[0], clock[0] = state, t

    return online


def _theirs(name: str, ref, h0, inputs, grads, steps: int) -> Callable[[], None]:
    """A call of ``steps`` steps (+ gradients) of the NumPy reference's running stream."""
    count, clock = len(inputs), [0]
    ref.initial(h0)
    if name == "forward":

        def forward() -> None:
            t = clock[0]
            for _ in range(steps):
                ref.step(inputs[t % count])
                t += 1
            clock[0] = t

        return forward

    def online() -> None:
        t = clock[0]
        for _ in range(steps):
            ref.step(inputs[t % count])
            ref.gradient(grads[t % count])
            t += 1
        clock[0] = t

    return online


def measure(name: str, hidden: int, dtype_name: str, *, rounds: int, min_time: float, steps: int, check: int) -> dict:
    """One row: the agreement check, then ours against NumPy's in interleaved rounds."""
    dtype = DTYPES[dtype_name]
    error = agreement(name, hidden, dtype, check)
    cell = make_cell(name, hidden, dtype)
    estimator = make_estimator(name, cell)
    ref = make_reference(name, cell)
    h0, inputs, grads = make_data(name, hidden, dtype, POOL)
    calls = {
        "ours": _ours(name, cell, estimator, h0, list(inputs), list(grads), steps),
        "numpy": _theirs(name, ref, h0[0].numpy().copy(), _numpy_rows(inputs), _numpy_rows(grads), steps),
    }
    for call in calls.values():  # warm-up: lazy initialisation, allocator, TruncatedBPTT's window full
        for _ in range(-(-(TBPTT_K + 2) // steps)):
            call()
    timing = interleave(calls, rounds=rounds, warmup=1, min_time=min_time, order="alternate")
    ratio = median(timing.paired_ratios("ours", "numpy"))
    goal = GOALS[name]
    kind = type(cell).__name__
    return {
        "estimator": name,
        "what": LABELS[name],
        "cell": f"{kind}({INPUT_SIZE}, {hidden})",
        "H": hidden,
        "dtype": dtype_name,
        "B": 1,
        "ours_ms": 1e3 * timing.median("ours") / steps,
        "numpy_ms": 1e3 * timing.median("numpy") / steps,
        "ratio": ratio,
        "ratio_of_medians": timing.ratio("ours", "numpy", statistic="median"),
        "ratio_of_best": timing.ratio("ours", "numpy"),
        "goal": goal,
        "holds": ratio <= goal,
        "rounds": timing.rounds("ours"),
        "steps_per_call": steps,
        "agreement": {
            "steps": check,
            "max_error": error,
            "tolerance": TOLERANCE[dtype_name],
            "agrees": error <= TOLERANCE[dtype_name],
        },
    }


# -- claims --------------------------------------------------------------------------------------------------------
def claims_from(rows: list[dict]) -> list[dict]:
    """Per estimator: ours / NumPy within its goal at every H and dtype (the figure: the largest ratio); per dtype:
    every NumPy reference computes our numbers (the figure: the largest difference)."""
    claims = []
    for name in ESTIMATORS:
        mine = [r for r in rows if r["estimator"] == name]
        if not mine:
            continue
        worst = max(mine, key=lambda r: r["ratio"])
        where = ", ".join(f"H = {h}" for h in sorted({r["H"] for r in mine}))
        dtypes = " and ".join(dict.fromkeys(r["dtype"] for r in mine))
        claims.append(
            {
                "claim": f"{LABELS[name]} step{'' if name == 'forward' else ' + gradient'}, one stream, one thread: "
                f"ours / NumPy <= {GOALS[name]:g}x at {where}, {dtypes} (the largest ratio)",
                "figure": round(worst["ratio"], 3),
                "holds": all(r["holds"] for r in mine),
            }
        )
    for dtype_name in DTYPES:
        mine = [r for r in rows if r["dtype"] == dtype_name]
        if not mine:
            continue
        worst = max(r["agreement"]["max_error"] for r in mine)
        claims.append(
            {
                "claim": f"every NumPy reference computes our state and gradients, {dtype_name}: largest relative "
                f"difference over {mine[0]['agreement']['steps']} steps <= {TOLERANCE[dtype_name]:g}",
                "figure": float(f"{worst:.3g}"),
                "holds": all(r["agreement"]["agrees"] for r in mine),
            }
        )
    return claims


# -- threads -------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def numpy_on_one_thread() -> Iterator[str]:
    """NumPy's BLAS on one thread for the block; yields how (``threadpoolctl``, or the environment variables that
    were read when NumPy loaded)."""
    try:
        from threadpoolctl import threadpool_limits  # noqa: PLC0415  (optional: not a dependency)
    except ImportError:
        read = {v: os.environ.get(v) for v in THREAD_VARIABLES}
        yield "environment at NumPy's import: " + ", ".join(f"{k}={v}" for k, v in read.items())
        return
    with threadpool_limits(limits=1):
        yield "threadpoolctl.threadpool_limits(1)"


# -- main ----------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("bench_online_steps", __doc__, threads=1)
    parser.add_argument(
        "--estimators", nargs="+", choices=ESTIMATORS, default=list(ESTIMATORS), help="the rows to measure"
    )
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES), help="the dtypes")
    args = parse_args(parser, argv)
    reject(parser, args, device="bench_online_steps compares one CPU stream with NumPy")
    quick = int(args.quick)
    rounds = args.rounds or ROUNDS[quick]
    min_time, steps, check = MIN_TIME[quick], STEPS_PER_CALL[quick], CHECK_STEPS[quick]
    with configured(args) as device, numpy_on_one_thread() as numpy_threads:
        started = time.perf_counter()
        allocator = keep_freed_memory()
        rows = []
        for dtype_name in args.dtypes:
            for hidden in HIDDEN[quick]:
                for name in args.estimators:
                    row = measure(name, hidden, dtype_name, rounds=rounds, min_time=min_time, steps=steps, check=check)
                    rows.append(row)
                    verdict = "holds" if row["holds"] else "DOES NOT HOLD"
                    agrees = row["agreement"]
                    print(
                        f"{dtype_name} H={hidden:3d} {row['what']:14s} {row['ours_ms']:8.4f} / {row['numpy_ms']:8.4f}"
                        f" ms = {row['ratio']:5.2f}x (goal <= {row['goal']:g}x: {verdict}); agreement"
                        f" {agrees['max_error']:.1e}{'' if agrees['agrees'] else ' OVER TOLERANCE'}",
                        flush=True,
                    )
        claims = claims_from(rows)
        extra = {
            "setup": {
                "input_size": INPUT_SIZE,
                "cell": f"TanhRNNCell({INPUT_SIZE}, H); LinearRecurrentUnit({INPUT_SIZE}, H) for DiagonalRTRL",
                "B": 1,
                "rflo_tau": RFLO_TAU,
                "tbptt_k": TBPTT_K,
                "threads": args.threads,
                "numpy_threads": numpy_threads,
                "numpy": np.__version__,
                "rounds": rounds,
                "min_time_s": min_time,
                "steps_per_call": steps,
                "check_steps": check,
                "allocator": allocator or "default",
            },
            "total_seconds": round(time.perf_counter() - started, 1),
        }
        path = write_result("bench_online_steps", device, rows, claims, args, extra=extra)
    print_claims(claims)
    print(f"wrote {path} ({extra['total_seconds']} s)")
    return path


if __name__ == "__main__":
    main()
