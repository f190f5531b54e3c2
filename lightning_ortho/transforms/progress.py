"""Progress of a long computation counted in steps (block choices, stages): a rich bar and a time estimate.

The time model (:class:`WorkPlan`): the work is a sequence of segments, each a run of steps of one kind (the greedy
block choices, the re-picks of one sweep, the stages of one round), and every segment after the first starts with
one pass over the data (codes and sums); ``passes_before`` passes come before the first step and ``passes_after``
after the last. Steps of one kind cost about the same, up to a known ``weight`` (e.g. a wider candidate set);
steps of different kinds need not (a greedy pick and a sweep re-pick differ), so each kind is timed on its own:

    estimate = elapsed + sum over the steps left (weight x t[kind]) + (passes left) x t[pass],

with ``t[kind]`` the median of the intervals between consecutive steps of that kind inside a segment (a stall of the
machine does not set the pace) and ``t[pass]`` the median interval across a segment boundary less the new segment's
first step. Until a boundary is timed, ``t[pass]`` is the time before the first step (set-up included) over
``passes_before``. When the work may stop early (convergence), the estimate is an upper bound.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lightning_ortho.transforms.b_dla import NARROW_CANDIDATES, WIDE_CANDIDATES

#: Within-segment intervals of a kind that make it timed (fewer when its segments are shorter), and the most kept.
TIMING_STEPS, KEPT_STEPS = 3, 31


def show_progress(progress: bool | None, console: Console) -> bool:
    """``progress`` itself when a bool; for ``None`` (auto): whether ``console`` is an interactive terminal or a
    Jupyter notebook (never a file or captured output, so logs and test output stay free of bars).

    Raises:
        TypeError: ``progress`` is neither a bool nor ``None``.
    """
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (auto: on a terminal), got {progress!r}.")
    if progress is None:
        return (console.is_terminal and not console.is_dumb_terminal) or console.is_jupyter
    return progress


def format_duration(seconds: float) -> str:
    """``"42 s"``, ``"7 min"`` or ``"3.5 h"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Segment:
    """``steps`` consecutive steps of one ``kind``, each costing ``weight`` times a timed step of that kind."""

    kind: str
    steps: int
    weight: float = 1.0


@dataclass(frozen=True)
class WorkPlan:
    """The planned work (module docstring): ``segments`` in order, what a step is (``unit``), the data passes before
    the first step and after the last, and whether convergence may end it before its last segment."""

    segments: tuple[Segment, ...]
    unit: str = "steps"
    passes_before: int = 0
    passes_after: int = 0
    may_stop_early: bool = False

    @property
    def total(self) -> int:
        """Planned steps in all."""
        return sum(segment.steps for segment in self.segments)


@dataclass(frozen=True)
class Estimate:
    """A time estimate of a :class:`WorkPlan` (seconds from the start of the work).

    Attributes:
        seconds: the whole work; an upper bound when ``upper_bound``.
        at_least: the work that cannot be skipped: elapsed plus the rest of the current segment.
        elapsed: seconds spent so far.
        step_seconds: the timed seconds per step of each kind (weight 1).
        pass_seconds: seconds per data pass.
        upper_bound: the work may stop early (convergence), so ``seconds`` is at most what it takes.
        final: every kind of step still to come has been timed, and a pass too if one is still to come between
            segments; otherwise the untimed kinds are priced at the slowest timed kind (provisional).
    """

    seconds: float
    at_least: float
    elapsed: float
    step_seconds: dict[str, float]
    pass_seconds: float
    upper_bound: bool
    final: bool


class WorkProgress:
    """Counts the planned steps of a computation, shows them as a rich bar, and estimates the total time.

    Use as a context manager and call :meth:`advance` after each step (it takes no argument, so it can be passed
    as a learner's ``on_step``); at a normal exit the bar ends full, at the steps done (or at the plan's total if
    none was reported). The estimate follows the module docstring: ``on_estimate(estimate)`` is called when the
    current kind of step is first timed, and again when the estimate becomes final (:attr:`Estimate.final`: e.g.
    for B_m-DLA once the first sweep re-picks are timed), at most twice; :attr:`estimate` keeps the last one.

    Args:
        plan: the :class:`WorkPlan`, or a number of uniform steps.
        description: text in front of the bar.
        show: draw the bar on ``console`` (see :func:`show_progress`).
        console: where to draw (default: a new ``Console(stderr=True)``).
        on_estimate: see above.
        clock: seconds as a float (default ``time.perf_counter``; tests inject their own).
    """

    def __init__(
        self,
        plan: WorkPlan | int,
        description: str,
        *,
        show: bool,
        console: Console | None = None,
        on_estimate: Callable[[Estimate], object] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.plan = plan if isinstance(plan, WorkPlan) else WorkPlan((Segment("step", int(plan)),))
        self.total, self.unit, self.completed = self.plan.total, self.plan.unit, 0
        self.estimate: Estimate | None = None
        self.on_estimate = on_estimate
        self._clock = clock if clock is not None else lambda: time.perf_counter()
        self._starts = [0]
        for segment in self.plan.segments:
            self._starts.append(self._starts[-1] + segment.steps)
        self._samples: dict[str, list[float]] = {segment.kind: [] for segment in self.plan.segments}
        self._boundaries: list[tuple[int, float]] = []  # (segment, interval across its first step)
        self._first = math.nan  # set-up, passes_before passes and the first step
        self._start = self._last = 0.0
        self._bar: Progress | None = None
        self._task = None
        if show:
            self._bar = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console if console is not None else Console(stderr=True),
            )
            self._task = self._bar.add_task(description, total=self.total)

    def __enter__(self) -> WorkProgress:
        self._start = self._last = self._clock()
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            if error is None:  # done: an early stop (convergence) ends the bar where it is, no count ends it full
                self._bar.update(self._task, total=self.completed or self.total, completed=self.completed or self.total)
            self._bar.stop()

    @property
    def estimated_seconds(self) -> float | None:
        """``estimate.seconds`` of the last estimate, ``None`` before the first."""
        return None if self.estimate is None else self.estimate.seconds

    def _segment_of(self, step: int) -> int:
        """Index of the segment holding the 0-based ``step`` (the last one for steps beyond the plan)."""
        for index in range(len(self.plan.segments)):
            if step < self._starts[index + 1]:
                return index
        return len(self.plan.segments) - 1

    def advance(self, steps: int = 1) -> None:
        """Record ``steps`` more completed steps (and update the bar and the estimate)."""
        now = self._clock()
        interval, self._last, step = now - self._last, now, self.completed
        self.completed += steps
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed)
        if not self.plan.segments or steps < 1:
            return
        index = self._segment_of(step)
        segment = self.plan.segments[index]
        if step == 0:
            self._first = interval
        elif step == self._starts[index]:
            self._boundaries.append((index, interval))
        elif len(self._samples[segment.kind]) < KEPT_STEPS:
            self._samples[segment.kind].append(interval / (steps * segment.weight))
        if self.estimate is None or not self.estimate.final:
            self._update_estimate(now)

    def _step_times(self) -> dict[str, float]:
        """Seconds per step of each timed kind (module docstring); a kind whose segments hold one step is timed,
        at zero, once one of its segments has started (its step is then counted with the pass)."""
        times = {}
        current = self._segment_of(max(self.completed - 1, 0))
        started = {segment.kind for segment in self.plan.segments[: current + 1]}
        for kind, samples in self._samples.items():
            longest = max(s.steps for s in self.plan.segments if s.kind == kind)
            if kind in started and len(samples) >= min(TIMING_STEPS, longest - 1):
                times[kind] = statistics.median(samples) if samples else 0.0
        return times

    def _pass_time(self, times: dict[str, float]) -> float:
        segments = self.plan.segments
        passes = [
            max(gap - segments[index].weight * times[segments[index].kind], 0.0)
            for index, gap in self._boundaries
            if segments[index].kind in times
        ]
        if passes:
            return statistics.median(passes)
        first = segments[0]
        before = self._first - first.weight * times.get(first.kind, 0.0)
        return max(before, 0.0) / self.plan.passes_before if self.plan.passes_before else 0.0

    def _update_estimate(self, now: float) -> None:
        times = self._step_times()
        segments, current = self.plan.segments, self._segment_of(max(self.completed - 1, 0))
        if segments[current].kind not in times:
            return
        left_here = max(self._starts[current + 1] - self.completed, 0)
        later = segments[current + 1 :]
        to_come = {s.kind for s in later} | ({segments[current].kind} if left_here else set())
        slowest = max(times.values())
        price = {kind: times.get(kind, slowest) for kind in self._samples}
        pass_time = self._pass_time(times)
        elapsed = now - self._start
        at_least = elapsed + left_here * segments[current].weight * price[segments[current].kind]
        rest = sum(pass_time + s.steps * s.weight * price[s.kind] for s in later)
        final = to_come <= times.keys() and (bool(self._boundaries) or not later)
        first_one = self.estimate is None
        self.estimate = Estimate(
            seconds=at_least + rest + self.plan.passes_after * pass_time,
            at_least=at_least,
            elapsed=elapsed,
            step_seconds=dict(times),
            pass_seconds=pass_time,
            upper_bound=self.plan.may_stop_early and bool(later),
            final=final,
        )
        if self.on_estimate is not None and (first_one or final):
            self.on_estimate(self.estimate)


def estimate_reporter(
    where: str,
    subject: str,
    work: str,
    plan: WorkPlan,
    *,
    slow_seconds: Callable[[], float],
    advice: str,
    log: logging.Logger,
) -> Callable[[Estimate], None]:
    """An ``on_estimate`` for :class:`WorkProgress`: logs each estimate at INFO (``"<where>: <subject>: about ..."``)
    and warns once when it is long, ``"<where>: <work> will take ... <advice>"``: when the final estimate exceeds
    ``slow_seconds()``, or earlier when the work that cannot be skipped (:attr:`Estimate.at_least`) already does
    (a lower bound: never a false alarm from extrapolating one kind of step to another)."""
    warned = []

    def on_estimate(estimate: Estimate) -> None:
        paces = ", ".join(f"{kind} {seconds:.3g} s" for kind, seconds in estimate.step_seconds.items())
        bound = "at most" if estimate.upper_bound else "about"
        status = "" if estimate.final else "; provisional: not every kind of step is timed yet"
        log.info(
            "%s: %s: %s %.3g s (per step: %s; per data pass %.3g s%s).",
            *(where, subject, bound, estimate.seconds, paces, estimate.pass_seconds, status),
        )
        if warned or slow_seconds() >= (estimate.seconds if estimate.final else estimate.at_least):
            return
        warned.append(estimate)
        if estimate.final:
            length = f"{'up to' if estimate.upper_bound else 'about'} {format_duration(estimate.seconds)}"
        else:
            length = f"at least {format_duration(estimate.at_least)}"
        stop = "; it stops early once converged, so it may take less" if estimate.upper_bound else ""
        warnings.warn(
            f"{where}: {work} will take {length} ({plan.total:,} {plan.unit}; per step: {paces}; per "
            f"data pass {estimate.pass_seconds:.3g} s{stop}). {advice}",
            stacklevel=2,
        )

    return on_estimate


# ------------------------------------------------------------------------------------------------ the learners' plans
#: Sweeps (b, shear) or rounds (m) of each learner when ``iterations`` is not given.
DEFAULT_ITERATIONS = {"b": 10, "m": 1, "shear": 15}

#: The B_m-DLA stopping rule (step 5 of learn_b_transform) looks at sweeps 3 onwards, so sweeps 4, 5, ... may run
#: with the wide candidate set (15 cores instead of 8): priced at that ratio, an upper bound on a pick's cost.
_NARROW_SWEEPS, _WIDE_PICK_COST = 3, len(WIDE_CANDIDATES) / len(NARROW_CANDIDATES)


def plan_work(family: str, m: int | None, q: int | None, iterations: int | None) -> WorkPlan:
    """The work of learning a transform of ``family`` (``"b"``, ``"m"`` or ``"shear"``) in the learner's unit steps,
    as each learner reports them through its ``on_step`` (for the time estimate of :class:`WorkProgress`).

    B and shears: the greedy init (``m`` block choices, kind ``"greedy"``), then ``iterations`` sweeps of ``m``
    re-picks each (kind ``"sweep"``), each sweep after one pass over the data (for S-DLA the pass also builds the
    sweep's suffix products). B's convergence rule may stop its sweeps early (the plan is then an upper bound); S-DLA
    without a ``tol`` (as :func:`~lightning_ortho.transforms.compression.compress_linear` runs it) always runs
    them all. M: ``rounds`` rounds of ``q`` stages (each a maximum-weight perfect matching), each round after one
    pass. Two passes (the principal basis, the first codes) come before the first step and two after the last (the
    final error and codes).
    """
    sweeps = iterations or DEFAULT_ITERATIONS[family]
    if family == "m":
        return WorkPlan(tuple(Segment("stage", q) for _ in range(sweeps)), "stages", passes_before=2, passes_after=2)
    wide = _WIDE_PICK_COST if family == "b" else 1.0
    rounds = tuple(Segment("sweep", m, 1.0 if k < _NARROW_SWEEPS else wide) for k in range(sweeps))
    early = family == "b" and sweeps > _NARROW_SWEEPS  # the B rule cannot stop before sweep 3 is done
    return WorkPlan((Segment("greedy", m), *rounds), "block choices", 2, 2, may_stop_early=early)


def planned_steps(family: str, m: int | None, q: int | None, iterations: int | None) -> tuple[int, str]:
    """``(steps, unit)`` of :func:`plan_work`: B and shears ``m (1 + iterations)`` block choices, M ``q rounds``
    stages."""
    plan = plan_work(family, m, q, iterations)
    return plan.total, plan.unit
