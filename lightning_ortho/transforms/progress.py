"""Progress of a long computation counted in steps (block choices, stages): a rich bar and a time estimate."""

from __future__ import annotations

import time
from collections.abc import Callable
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


class WorkProgress:
    """Counts ``total`` planned steps of a computation, shows them as a rich bar, and estimates the total time.

    Use as a context manager and call :meth:`advance` after each step (it takes no argument, so it can be passed
    as a learner's ``on_step``); at a normal exit the bar ends full, at the steps done (or at ``total`` if none was
    reported). The time per step is measured between the first and the second step (the first
    one also pays for the set-up before it); from then on :attr:`estimated_seconds` is ``elapsed + per-step time x
    remaining steps``, and ``on_estimate(estimated_seconds, seconds_per_step)`` is called once.

    Args:
        total: planned steps (``>= 0``; the computation may stop earlier, e.g. at convergence).
        description: text in front of the bar. unit: what a step is (``"block choices"``).
        show: draw the bar on ``console`` (see :func:`show_progress`).
        console: where to draw (default: a new ``Console(stderr=True)``).
        on_estimate: see above.
    """

    def __init__(
        self,
        total: int,
        description: str,
        unit: str,
        *,
        show: bool,
        console: Console | None = None,
        on_estimate: Callable[[float, float], object] | None = None,
    ) -> None:
        self.total, self.unit, self.completed = total, unit, 0
        self.estimated_seconds: float | None = None
        self.on_estimate = on_estimate
        self._times: list[float] = []
        self._start = 0.0
        self._bar: Progress | None = None
        self._task = None
        if show:
            self._bar = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(unit),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console if console is not None else Console(stderr=True),
            )
            self._task = self._bar.add_task(description, total=total)

    def __enter__(self) -> WorkProgress:
        self._start = time.perf_counter()
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

    def advance(self, steps: int = 1) -> None:
        """Record ``steps`` more completed steps (and update the bar and the estimate)."""
        self.completed += steps
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed)
        if len(self._times) < 2:
            self._times.append(time.perf_counter())
            if len(self._times) == 2:
                per_step = self._times[1] - self._times[0]
                remaining = max(self.total - self.completed, 0)
                self.estimated_seconds = self._times[1] - self._start + per_step * remaining
                if self.on_estimate is not None:
                    self.on_estimate(self.estimated_seconds, per_step)
