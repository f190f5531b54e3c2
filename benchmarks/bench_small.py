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

from benchmarks._common import (
    benchmark_parser,
    configured,
    keep_freed_memory,
    parse_args,
    print_claims,
    reject,
    write_result,
)
from benchmarks._small_processes import measure_compress, measure_online_recipe
from benchmarks._small_rows import (
    AUX_BATCH,
    AUX_DIMS,
    AUX_INFO_DIMS,
    BANDWIDTH_HIDDEN,
    COMPRESS_BUDGET,
    COMPRESS_GOALS,
    COMPRESS_SIZES,
    MIN_TIME,
    ORTHOGONAL_HIDDEN,
    QUICK_COMPRESS_BUDGET,
    QUICK_ROUNDS,
    RNN_SHAPE,
    ROUNDS,
    SECTIONS,
    STEPS,
    UORO_HIDDEN,
    measure_aux_linear,
    measure_orthogonal_rnn,
    measure_uoro_bandwidth,
    measure_uoro_bptt,
    measure_uoro_bptt_orthogonal,
    table_row,
)
from benchmarks.bench_small_render import measured


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
                table_row("compress", what, seconds, goal=COMPRESS_GOALS.get(n), **fields)
                for n, what, seconds, fields in measure_compress(COMPRESS_SIZES[quick], budget, args.threads)
            ],
            "online_recipe": lambda: [
                table_row("online_recipe", what, ratio, **fields)
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
                    print(f"{row['what']}: {measured(row)}  (goal {row['goal'] or 'none'}) {holds}", flush=True)
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
