"""Fast where users live: lightning_ortho's public API at small sizes, where per-call overhead dominates, side by side
with what a user would otherwise run, in one interleaved run (one thread unless a row says otherwise).

    python -m benchmarks.bench_small                  # every row (a few minutes, plus compress_linear's own time)
    python -m benchmarks.bench_small --quick          # tiny sizes, seconds (used by the tests)
    python -m benchmarks.bench_small --rows aux_linear uoro_bptt --rounds 31
    python -m benchmarks.bench_small --compress-budget 600

Rows (``section``; the figure; the goal):

* ``aux_linear``: ``AuxiliaryReflection(d)`` against ``nn.Linear(d, d)``, forward+backward
  (``layer(x).sum().backward()``, ``x`` of shape (128, d) that requires grad, as inside a network), d = 64, 128,
  256 (goal <= 1.5x) and 512, 784 (for information);
* ``uoro_bptt``: a step of ``UORO(cell)`` (its defaults: state projection, GIR) against a step of backprop through
  time, ``TanhRNNCell(32, H)``, 8 streams, H = 32, 128 (goal <= 2x); the protocol of bench_online's ``Runner``: UORO
  is ``est.step``, the readout's loss and ``dL/dh`` in closed form (``readout="closed_form"``: the library's
  ``readout_step``, as ``OnlineRNNModule`` runs its online step), ``est.gradient`` and accumulating it; BPTT a forward
  pass over STEPS steps with autograd recording, then one backward pass, per step;
* ``uoro_bptt_orthogonal``: the same on ``OrthogonalRNNCell(32, 64, transition="aux")`` (goal <= 3x);
* ``orthogonal_rnn``: ``OrthogonalRNN(1, 170, transition="aux")`` against ``transition="cayley"``, forward+backward
  of the final state (``rnn(x)[1].sum().backward()``) on 64 steps x batch 128 (goal <= 1.0x);
* ``compress``: seconds of ``compress_linear(nn.Linear(n, n))`` at its defaults, n = 256 (goal <= 20 s) and 784
  (<= 120 s; not with ``--quick``), each in a child process stopped after ``--compress-budget`` seconds
  (recorded ``"skipped": "over budget ..."``; the goal then does not hold);
* ``online_recipe``: one training epoch of recipes/online_adding.yaml at small size (OnlineRNNModule, UORO, H = 32,
  fewer chunks, no validation) through ``Trainer.fit``, the process at torch's default thread count against the same
  at one thread (``torch.set_num_threads(1)``, ``num_threads=1``), while a spinning child process keeps another core
  busy (goal <= 1.3x);
* ``uoro_bandwidth``: ``est.step`` of ``UORO(cell)`` on ``TanhRNNCell(32, H)``, 8 streams, H = 512, 1024: the bytes
  its ``w_tilde`` update must read and write (``2 x 8 x P x 4``, P parameters) per second of a step, over the
  bandwidth of ``dst.copy_(src)`` of the same size measured in the same rounds (goal >= 0.5).

Timing: ``benchmarks._common.interleave``, the two sides of a row alternating (A B, B A, ...) after a warm-up
round; a ratio is the median over rounds of that round's ratio (drift of a shared machine cancels), with the best
rounds' ratio beside it. Writes benchmarks/results/bench_small-HARDWARE.json: ``rows`` (one per table line: ``what``,
``figure``, ``goal``, ``holds`` and the times) and ``claims`` (one per row with a goal).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from benchmarks._common import (
    benchmark_parser,
    configured,
    interleave,
    keep_freed_memory,
    median,
    parse_args,
    print_claims,
    reject,
    synchronizer,
    write_result,
)
from benchmarks._online_problem import Problem, Runner
from benchmarks._render import claims_table
from benchmarks.bench_small_processes import measure_compress, measure_online_recipe
from lightning_ortho.nn import AuxiliaryReflection, OrthogonalRNN, OrthogonalRNNCell
from lightning_ortho.online import UORO, TanhRNNCell

#: section -> (goal operator, goal value, unit of the figure)
GOALS = {
    "aux_linear": ("<=", 1.5, "x"),
    "uoro_bptt": ("<=", 2.0, "x"),
    "uoro_bptt_orthogonal": ("<=", 3.0, "x"),
    "orthogonal_rnn": ("<=", 1.0, "x"),
    "compress": ("<=", None, "s"),  # per n: COMPRESS_GOALS
    "online_recipe": ("<=", 1.3, "x"),
    "uoro_bandwidth": (">=", 0.5, ""),
}
SECTIONS = tuple(GOALS)
COMPRESS_GOALS = {256: 20.0, 784: 120.0}

#: (full, quick) sizes of each row
AUX_DIMS, AUX_INFO_DIMS, AUX_BATCH = ((64, 128, 256), (64,)), ((512, 784), ()), (128, 16)
UORO_HIDDEN, ORTHOGONAL_HIDDEN, STEPS = ((32, 128), (16,)), (64, 16), (100, 5)
RNN_SHAPE = ((170, 64, 128), (16, 8, 8))  # hidden, steps, batch
COMPRESS_SIZES = ((256, 784), (32,))
BANDWIDTH_HIDDEN = ((512, 1024), (64,))
ROUNDS, QUICK_ROUNDS = 15, 1
#: seconds each side runs for per round (several calls of a short one), full and quick
MIN_TIME = (0.05, 0.002)
COMPRESS_BUDGET, QUICK_COMPRESS_BUDGET = 300.0, 60.0


def _row(section: str, what: str, figure: float | None, *, goal: float | str | None = "section", **measured) -> dict:
    """One table line; ``holds`` is computed from ``figure`` and ``goal``: the section's (``"section"``), a number,
    ``None`` (no goal) or ``"(information)"`` (no goal, a line shown for information)."""
    op, default, unit = GOALS[section]
    goal = default if goal == "section" else goal
    row = {"section": section, "what": what, "figure": figure, "unit": unit, "goal": None, "holds": None}
    if goal == "(information)":
        return row | {"goal": goal} | measured
    if goal is not None:
        row["goal"] = f"{op} {goal:g}{unit}"
        if figure is not None:
            row["holds"] = figure <= goal if op == "<=" else figure >= goal
        elif "budget_s" in measured and measured["budget_s"] >= goal:  # stopped after more than the goal's time
            row["holds"] = False
    return row | measured


def _pair(timing, a: str, b: str) -> dict:
    """A over B: the median of the per-round ratios (the figure), the best rounds' ratio, and both medians."""
    return {
        "ratio_median_of_rounds": median(timing.paired_ratios(a, b)),
        "ratio_of_best": timing.ratio(a, b),
        f"{a}_ms": 1e3 * timing.median(a),
        f"{b}_ms": 1e3 * timing.median(b),
        "rounds": timing.rounds(a),
    }


# -- rows ----------------------------------------------------------------------------------------------------------
def measure_aux_linear(
    dims, info_dims, batch: int, rounds: int, min_time: float, device: torch.device | str = "cpu"
) -> list[dict]:
    rows = []
    for d in (*dims, *info_dims):
        torch.manual_seed(0)
        x = torch.randn(batch, d, requires_grad=True, device=device)
        aux, linear = AuxiliaryReflection(d).to(device), nn.Linear(d, d).to(device)
        timing = interleave(
            {"aux": lambda: aux(x).sum().backward(), "linear": lambda: linear(x).sum().backward()},
            rounds=rounds,
            min_time=min_time,
            order="alternate",
            synchronize=synchronizer(torch.device(device)),
        )
        pair = _pair(timing, "aux", "linear")
        what = f"AuxiliaryReflection({d}) / nn.Linear({d}, {d}), forward+backward, batch {batch}"
        goal = "(information)" if d in info_dims else "section"
        rows.append(_row("aux_linear", what, pair["ratio_median_of_rounds"], goal=goal, d=d, batch=batch, **pair))
    return rows


def _uoro_against_bptt(section: str, what: str, problem: Problem, steps: int, rounds: int, **fields) -> dict:
    """The Runner's online step (estimator step, readout loss and ``dL/dh`` in closed form, estimator gradient,
    accumulation) against a BPTT step; beside it, for the breakdown, the estimator's own ``step`` + ``gradient``
    (with a fixed ``dL/dh``) on a stream of its own, in the same rounds; on the problem's device."""
    torch.manual_seed(0)
    online = Runner("uoro_state", problem, estimator=UORO(problem.cell), readout="closed_form")
    runners = {"uoro": online, "bptt": Runner("bptt", problem)}
    estimator = UORO(problem.cell)
    state = [estimator.initial_state(problem.h0)]
    inputs = [problem.data(t)[0] for t in range(steps)]
    grad_h = torch.randn_like(problem.h0)

    def estimator_only() -> None:
        for x in inputs:
            state[0] = estimator.step(x, state[0])[1]
            estimator.gradient(state[0], grad_h)

    calls = {name: (lambda runner=runner: runner.run(steps)) for name, runner in runners.items()}
    calls["estimator"] = estimator_only
    for call in calls.values():  # warm-up: allocator, lazy initialisation, the estimator's first steps
        call()
    timing = interleave(calls, rounds=rounds, warmup=0, order="alternate", synchronize=synchronizer(problem.h0.device))
    pair = _pair(timing, "uoro", "bptt")
    per_step = {
        "uoro_ms_per_step": pair["uoro_ms"] / steps,
        "bptt_ms_per_step": pair["bptt_ms"] / steps,
        "estimator_ms_per_step": 1e3 * timing.median("estimator") / steps,
        "estimator_over_bptt": median(timing.paired_ratios("estimator", "bptt")),
    }
    return _row(section, what, pair["ratio_median_of_rounds"], steps=steps, **fields, **pair, **per_step)


def measure_uoro_bptt(hiddens, steps: int, rounds: int, device: torch.device | str = "cpu") -> list[dict]:
    rows = []
    for hidden in hiddens:
        what = f"UORO(TanhRNNCell(32, {hidden})) step + gradient (closed-form readout) / BPTT step, 8 streams"
        problem = Problem(hidden, device=device)
        rows.append(_uoro_against_bptt("uoro_bptt", what, problem, steps, rounds, H=hidden))
    return rows


def measure_uoro_bptt_orthogonal(
    hidden: int, steps: int, rounds: int, device: torch.device | str = "cpu"
) -> list[dict]:
    torch.manual_seed(0)
    cell = OrthogonalRNNCell(32, hidden, transition="aux")
    what = (
        f'UORO(OrthogonalRNNCell(32, {hidden}, transition="aux")) step + gradient (closed-form readout) / BPTT step,'
        " 8 streams"
    )
    problem = Problem(hidden, cell=cell, device=device)
    return [_uoro_against_bptt("uoro_bptt_orthogonal", what, problem, steps, rounds, H=hidden)]


def measure_orthogonal_rnn(
    hidden: int, steps: int, batch: int, rounds: int, min_time: float, device: torch.device | str = "cpu"
) -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(batch, steps, 1, device=device)
    rnns = {kind: OrthogonalRNN(1, hidden, transition=kind).to(device) for kind in ("aux", "cayley")}
    timing = interleave(
        {kind: (lambda rnn=rnn: rnn(x)[1].sum().backward()) for kind, rnn in rnns.items()},
        rounds=rounds,
        min_time=min_time,
        order="alternate",
        synchronize=synchronizer(torch.device(device)),
    )
    pair = _pair(timing, "aux", "cayley")
    what = (
        f'OrthogonalRNN(1, {hidden}, transition="aux") / transition="cayley", forward+backward, '
        f"{steps} steps x batch {batch}"
    )
    return [_row("orthogonal_rnn", what, pair["ratio_median_of_rounds"], H=hidden, T=steps, batch=batch, **pair)]


def measure_uoro_bandwidth(hiddens, rounds: int, min_time: float, device: torch.device | str = "cpu") -> list[dict]:
    rows = []
    for hidden in hiddens:
        torch.manual_seed(0)
        cell = TanhRNNCell(32, hidden).to(device)
        estimator = UORO(cell)
        inputs = torch.randn(16, 8, 32, device=device)
        state = [estimator.initial_state(torch.zeros(8, hidden, device=device))]
        step_index = [0]

        def step(estimator=estimator, inputs=inputs, state=state, step_index=step_index):
            state[0] = estimator.step(inputs[step_index[0] % len(inputs)], state[0])[1]
            step_index[0] += 1

        step()
        w_tilde = state[0].tensors["w_tilde"]
        source, target = torch.randn_like(w_tilde), torch.empty_like(w_tilde)
        timing = interleave(
            {"step": step, "copy": lambda source=source, target=target: target.copy_(source)},
            rounds=rounds,
            min_time=min_time,
            order="alternate",
            synchronize=synchronizer(torch.device(device)),
        )
        moved = 2 * w_tilde.nbytes  # read w_tilde once, write it once
        step_rates = [moved / s for s in timing.values("step")]
        copy_rates = [moved / s for s in timing.values("copy")]
        ratios = [a / b for a, b in zip(step_rates, copy_rates, strict=True)]
        what = f"UORO(TanhRNNCell(32, {hidden})).step, 8 streams: w_tilde update bandwidth / copy bandwidth"
        rows.append(
            _row(
                "uoro_bandwidth",
                what,
                median(ratios),
                H=hidden,
                parameters=int(w_tilde.shape[1]),
                w_tilde_mb=w_tilde.nbytes / 2**20,
                step_ms=1e3 * timing.median("step"),
                copy_ms=1e3 * timing.median("copy"),
                step_gb_per_s=median(step_rates) / 1e9,
                copy_gb_per_s=median(copy_rates) / 1e9,
                ratio_of_best=timing.best("copy") / timing.best("step"),
                rounds=timing.rounds("step"),
            )
        )
    return rows


# -- claims --------------------------------------------------------------------------------------------------------
def claims_from(rows: list[dict]) -> list[dict]:
    """One claim per row with a goal: ``"WHAT: goal OP X"``, the measured figure (``"> BUDGET s"`` for a run
    stopped over its budget), whether it holds."""
    claims = []
    for row in rows:
        if row["goal"] in (None, "(information)") or row["holds"] is None:
            continue
        figure = round(row["figure"], 3) if row["figure"] is not None else f"> {row['budget_s']:g} s"
        claims.append({"claim": f"{row['what']}: goal {row['goal']}", "figure": figure, "holds": row["holds"]})
    return claims


# -- report --------------------------------------------------------------------------------------------------------
def _measured(row: dict) -> str:
    if row["figure"] is None:
        return f"skipped: {row['skipped']}" if "skipped" in row else ""
    return f"{row['figure']:.1f} s" if row["unit"] == "s" else f"{row['figure']:.2f}{row['unit']}"


def _details(row: dict) -> str:
    section = row["section"]
    if section in ("aux_linear", "orthogonal_rnn"):
        a, b = ("aux", "linear") if section == "aux_linear" else ("aux", "cayley")
        return f"{row[f'{a}_ms']:.3g} / {row[f'{b}_ms']:.3g} ms; best rounds {row['ratio_of_best']:.2f}x"
    if section.startswith("uoro_bptt"):
        text = (
            f"{row['uoro_ms_per_step']:.3g} / {row['bptt_ms_per_step']:.3g} ms per step; "
            f"best rounds {row['ratio_of_best']:.2f}x"
        )
        if "estimator_over_bptt" in row:  # the breakdown: the rest is the readout step and accumulating
            text += (
                f"; the estimator's own step + gradient {row['estimator_ms_per_step']:.3g} ms "
                f"({row['estimator_over_bptt']:.2f}x BPTT)"
            )
        return text
    if section == "online_recipe":
        return (
            f"{row['default_threads_s']:.2f} s at {row['default_threads']} threads / {row['one_thread_s']:.2f} s at 1, "
            f"{row['spinners']} spinning process(es)"
        )
    if section == "uoro_bandwidth":
        return (
            f"{row['step_gb_per_s']:.2f} / {row['copy_gb_per_s']:.2f} GB/s ({row['w_tilde_mb']:.1f} MB w_tilde, "
            f"step {row['step_ms']:.3g} ms)"
        )
    return ""


def render(data: dict) -> str:
    """The results-page table: one line per row (what, measured figure, goal, holds, the times behind it)."""
    lines = [
        f"**{data['hardware']}** ({data.get('hardware_description', '')}), torch {data['torch']}, {data['date']}: "
        f"`{data['command']}` ({data.get('total_seconds', '?')} s). Ratios: median over interleaved rounds of each "
        "round's ratio.",
        "",
        "| what | measured | goal | holds | details |",
        "|---|---:|---|:---:|---|",
    ]
    for row in data["rows"]:
        holds = "" if row["holds"] is None else "yes" if row["holds"] else "**no**"
        lines.append(f"| {row['what']} | {_measured(row)} | {row['goal'] or ''} | {holds} | {_details(row)} |")
    return "\n".join(lines + claims_table(data["claims"]))


# -- main ----------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("bench_small", __doc__, threads=1)
    parser.add_argument("--rows", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="the rows to measure")
    parser.add_argument(
        "--compress-budget",
        type=float,
        default=None,
        help=f"seconds one compress_linear may take before it is stopped (default {COMPRESS_BUDGET:g}; "
        f"{QUICK_COMPRESS_BUDGET:g} quick)",
    )
    parser.add_argument("--spinners", type=int, default=1, help="busy processes during the online_recipe row")
    args = parse_args(parser, argv)
    reject(parser, args, device="bench_small measures per-call overhead on the CPU")
    default_threads = torch.get_num_threads()  # before --threads: the online_recipe row's "default threads"
    quick = int(args.quick)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    min_time = MIN_TIME[quick]
    budget = args.compress_budget or (QUICK_COMPRESS_BUDGET if args.quick else COMPRESS_BUDGET)
    with configured(args) as device:
        started = time.perf_counter()
        allocator = keep_freed_memory()
        measures = {
            "aux_linear": lambda: measure_aux_linear(
                AUX_DIMS[quick], AUX_INFO_DIMS[quick], AUX_BATCH[quick], rounds, min_time
            ),
            "uoro_bptt": lambda: measure_uoro_bptt(UORO_HIDDEN[quick], STEPS[quick], rounds),
            "uoro_bptt_orthogonal": lambda: measure_uoro_bptt_orthogonal(
                ORTHOGONAL_HIDDEN[quick], STEPS[quick], rounds
            ),
            "orthogonal_rnn": lambda: measure_orthogonal_rnn(*RNN_SHAPE[quick], rounds, min_time),
            "compress": lambda: [
                _row("compress", what, seconds, goal=COMPRESS_GOALS.get(n), **fields)
                for n, what, seconds, fields in measure_compress(COMPRESS_SIZES[quick], budget, args.threads)
            ],
            "online_recipe": lambda: [
                _row("online_recipe", what, ratio, **fields)
                for what, ratio, fields in measure_online_recipe(args.quick, rounds, default_threads, args.spinners)
            ],
            "uoro_bandwidth": lambda: measure_uoro_bandwidth(BANDWIDTH_HIDDEN[quick], rounds, min_time),
        }
        rows: list[dict] = []
        for section in SECTIONS:
            if section in args.rows:
                for row in measures[section]():
                    rows.append(row)
                    holds = {None: "", True: "holds", False: "DOES NOT HOLD"}[row["holds"]]
                    print(f"{row['what']}: {_measured(row)}  (goal {row['goal'] or 'none'}) {holds}", flush=True)
        claims = claims_from(rows)
        extra = {
            "setup": {
                "threads": args.threads,
                "default_threads": default_threads,
                "rounds": rounds,
                "min_time_s": min_time,
                "compress_budget_s": budget,
                "allocator": allocator or "default",
            },
            "total_seconds": round(time.perf_counter() - started, 1),
        }
        path = write_result("bench_small", device, rows, claims, args, extra=extra)
    print_claims(claims)
    print(f"wrote {path} ({extra['total_seconds']} s)")
    return path


if __name__ == "__main__":
    main()
