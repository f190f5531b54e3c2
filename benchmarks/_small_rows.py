"""The rows of benchmarks/bench_small.py that time the library's calls, with their goals and sizes: each
``measure_*`` returns table lines (:func:`table_row`), on the CPU for bench_small and on a GPU for
benchmarks/gpu_suite.py, which runs the same rows at the same sizes. The protocol of each row is in bench_small's
docstring."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks._common import interleave, median, synchronizer
from benchmarks._online_problem import Problem, Runner
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


def table_row(
    section: str, what: str, figure: float | None, *, goal: float | str | None = "section", **measured
) -> dict:
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
        rows.append(table_row("aux_linear", what, pair["ratio_median_of_rounds"], goal=goal, d=d, batch=batch, **pair))
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
    return table_row(section, what, pair["ratio_median_of_rounds"], steps=steps, **fields, **pair, **per_step)


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
    return [table_row("orthogonal_rnn", what, pair["ratio_median_of_rounds"], H=hidden, T=steps, batch=batch, **pair)]


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
            table_row(
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
