"""What every monitor shares: choosing modules, a fixed probe captured by forward hooks, a measurement every
``every_n_steps`` optimizer steps reduced across processes, logging the way Lightning logs, a history that survives
checkpoints, and a report at the end of fit.

A monitor subclass says which modules it watches (:meth:`Monitor.candidates`) and what it measures on one module
and its probe (:meth:`Monitor.measure`, returning :class:`Measurement` values with their reduction across
processes); the base does the rest. Probes are the first ``probe_size`` rows of the first input each monitored
module receives in a training step (a forward hook, removed once it has fired: see
:mod:`~lightning_ortho.callbacks.monitors.probes`, also for the modules probed in eval mode), so a monitor never asks
the model for data and works on models it has never seen.

When a monitor measures: at the end of the first training batch at or past each multiple of ``every_n_steps``
optimizer steps, and at the end of the last batch of the fit (the rule in full:
:mod:`~lightning_ortho.callbacks.monitors.schedule`). A monitor that measured nothing, or never measured
some watched module, in a fit says so in one warning at the end of fit, with the reason and what to change (at info
level for a monitor from the environment switch when the fit was only too short). Each process keeps its own probe
(its own shard of the data); statistics are reduced across processes as the measurement declares (``"mean"``
weighted by probe rows, ``"sum"``, ``"min"``, ``"max"``), so a DDP run logs what one process logs on the union of the
probes.

Logging: see :mod:`~lightning_ortho.callbacks.monitors.values` (at the step of the batch's ``self.log`` values,
under ``<name>/<module>/<statistic>``, with ``name`` the monitor's short name :attr:`Monitor.prefix`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lightning_ortho._lightning import Callback, pl
from lightning_ortho.callbacks.monitors.probes import hook_watched_modules, missing_probe_reason
from lightning_ortho.callbacks.monitors.report import check_plotting, report_at_fit_end, warn_unmeasured
from lightning_ortho.callbacks.monitors.schedule import crossed_a_multiple, last_batch_of_fit
from lightning_ortho.callbacks.monitors.selection import outermost_modules, select_modules
from lightning_ortho.callbacks.monitors.source import (
    Source,
    gate_hooks,
    select_or_stand_aside,
    stands_aside_for_a_users_monitor,
)
from lightning_ortho.callbacks.monitors.values import (
    Measurement,
    Reduction,
    log_values,
    logging_step,
    reduce_measurement,
)
from lightning_ortho.nn.eval_mode import eval_mode

#: What ``modules`` holds: submodule names and/or module classes (a YAML config's ``modules: [torch.nn.Linear]`` is
#: resolved to the class by jsonargparse, whose LightningCLI reads this annotation).
ModuleSpec = Sequence[type[nn.Module] | str]

__all__ = [
    "Measurement",
    "ModuleSpec",
    "Monitor",
    "Reduction",
    "Source",
    "last_batch_of_fit",
    "logging_step",
    "outermost_modules",
]


def _check_positive_int(value: object, name: str, owner: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}.")
    return value


class Monitor(Callback):
    """Base class of the monitors (see the module docstring).

    Args:
        modules: which submodules to watch: ``None`` (every module the subclass can measure), or a list of names
            (``"encoder.0"``) and/or module classes (in a YAML config, ``modules: [torch.nn.Linear]``); a name must
            exist, and a class must match at least one module.
        every_n_steps: measure at the end of the first training batch at or past each multiple of
            ``every_n_steps`` optimizer steps (``global_step``: a multiple crossed inside a batch of several
            optimizer steps is measured at that batch's end; under gradient accumulation, at the end of the batch
            that steps), and at the end of the last training batch of fit, however the fit ends (max_epochs,
            max_steps, an early stop, max_time); never before the first optimizer step. At least
            :attr:`min_every_n_steps`.
        probe_size: rows of the probe batch (the first rows of each module's first input in a training step; a
            named module in any mode, an automatically chosen one in training mode).
        plot: at the end of fit (not under ``fast_dev_run``), write ``<Class>.png`` of the history into the first
            logger's directory (``trainer.log_dir``), and add it to TensorBoard as a figure where a
            ``TensorBoardLogger`` is in use. Needs matplotlib: ``pip install "lightning-ortho[plots]"``.
        prog_bar: also show the logged values in the progress bar.
        verbose: print a table of each statistic's last, smallest and largest value at the end of fit.
        source: ``"user"`` (constructed in code or a config) or ``"environment"`` (by the switch of
            :mod:`~lightning_ortho.callbacks.factory`): such a monitor stands aside for the fit (every ``on_*`` hook
            does nothing, :attr:`idle` is true) when the Trainer has a user's monitor of its class, and when the
            model has nothing it can measure (one warning instead of the error); its ``state_key`` is
            ``"<Class>{'source': 'environment'}"``; a fit too short for it to measure is said at info level.

    Raises:
        ValueError: bad arguments (in ``__init__``); at setup, no module to monitor, or a name that does not exist.
        ImportError: ``plot=True`` without matplotlib.
    """

    #: The monitor's short name: the first part of its logged keys, ``<prefix>/<module>/<statistic>``.
    prefix = "monitor"
    #: The smallest ``every_n_steps`` the monitor accepts (the environment switch of
    #: :mod:`~lightning_ortho.callbacks.factory` raises a smaller setting to it, with a warning).
    min_every_n_steps = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        gate_hooks(cls)

    def __init__(
        self,
        modules: ModuleSpec | None = None,
        every_n_steps: int = 50,
        probe_size: int = 8,
        plot: bool = False,
        *,
        prog_bar: bool = False,
        verbose: bool = True,
        source: Source = "user",
    ) -> None:
        owner = type(self).__name__
        if modules is not None and (
            isinstance(modules, str)
            or not isinstance(modules, Sequence)
            or not modules
            or not all(isinstance(m, str) and m or isinstance(m, type) and issubclass(m, nn.Module) for m in modules)
        ):
            raise ValueError(
                f"{owner}: modules must be None (every module it can measure) or a non-empty list of submodule names "
                f"(such as 'encoder.0') and/or module classes (such as torch.nn.Linear), got {modules!r}."
            )
        if source not in ("user", "environment"):
            raise ValueError(f"{owner}: source must be 'user' or 'environment', got {source!r}.")
        self.modules = None if modules is None else list(modules)
        self.every_n_steps = _check_positive_int(every_n_steps, "every_n_steps", owner)
        self.probe_size = _check_positive_int(probe_size, "probe_size", owner)
        self.plot = bool(plot)
        if self.plot:
            check_plotting(owner)
        self.prog_bar, self.verbose, self.source = bool(prog_bar), bool(verbose), source
        self.history: list[dict[str, Any]] = []
        self.probes: dict[str, torch.Tensor] = {}
        self._idle = False
        self._watched: dict[str, nn.Module] = {}
        self._hooks: list[RemovableHandle] = []  # subclasses' hooks, removed at teardown
        self._probe_hooks: dict[str, RemovableHandle] = {}  # removed as soon as each probe is taken
        self._last_step = -1
        #: Modules dropped at their first forward (auto-selected ones whose output cannot be measured): the reason.
        self.skipped: dict[str, str] = {}
        self._explicit: set[str] = set()
        self._first_checked: set[str] = set()
        self._eval_only: set[str] = set()  # auto-selected modules seen in a training step only in eval mode
        self._measured: set[str] = set()  # modules that got values in this fit
        self._fit_start_step = 0
        self._batch_end_step = 0  # global_step at the end of the last training batch (or the fit's start)
        self._batch_log_step: int | None = None  # that batch's logging step (None before the fit's first batch)
        self._fit_runs = 0  # measurements attempted in this fit

    @property
    def idle(self) -> bool:
        """True while a monitor from the environment stands aside for this fit (see ``source``)."""
        return self._idle

    @property
    def short_fit_is_info(self) -> bool:
        """Whether a fit too short to measure anything (and nothing else wrong) is reported at info level instead
        of as a warning: for monitors from the environment switch, turned on for every run, smoke tests included."""
        return self.source == "environment"

    def __getstate__(self) -> dict[str, Any]:
        # The watched modules and hook handles of the last fit are the model's, not the callback's (a parametrized
        # module cannot even be pickled, and ddp_spawn pickles the callbacks): setup finds them again.
        return {**self.__dict__, "_watched": {}, "_hooks": [], "_probe_hooks": {}}

    # --------------------------------------------------------------------------------------------- subclass API
    def candidates(self, pl_module: pl.LightningModule) -> Iterable[tuple[str, nn.Module]]:
        """``(name, module)`` pairs this monitor can measure (used when ``modules`` is ``None``, and to check
        named modules)."""
        raise NotImplementedError

    def can_measure(self, module: nn.Module) -> str | None:
        """``None`` if ``module`` can be measured, else the reason (said in the error for a named module)."""
        return None

    def measure(self, name: str, module: nn.Module, probe: torch.Tensor | None) -> dict[str, Measurement]:
        """The statistics of one module on its probe (this process's)."""
        raise NotImplementedError

    def first_forward_problem(self, name: str, module: nn.Module, args: tuple, output: object) -> str | None:
        """Checked once on each watched module's first forward (what it returns is only known then): ``None`` if
        it can be measured, else the reason. A named module with a problem is a clear error (before any optimizer
        step); an auto-selected one is dropped into ``skipped``. Default: no check."""
        return None

    def nothing_to_log(self, name: str) -> bool:
        """Whether the watched module ``name`` has nothing to log because every statistic of it is constant by
        construction (said in :meth:`notes`; not a module that went unmeasured). Default: no."""
        return False

    def needs_probe(self) -> bool:
        """Whether :meth:`measure` needs a probe (monitors of parameters alone do not)."""
        return True

    def notes(self) -> dict[str, str]:
        """Facts about the watched modules that do not change while training (how a statistic is computed, say):
        printed under the end-of-fit table instead of logged as constant metrics. Default: none."""
        return {}

    def state_key_fields(self) -> dict[str, Any]:
        """The settings that tell two monitors of this class apart in a checkpoint (see :attr:`state_key`)."""
        modules = None if self.modules is None else [m if isinstance(m, str) else m.__qualname__ for m in self.modules]
        return {"modules": modules, "every_n_steps": self.every_n_steps}

    # -------------------------------------------------------------------------------------------- selection
    def select(self, pl_module: pl.LightningModule) -> dict[str, nn.Module]:
        """The watched modules by name (see ``modules``).

        Raises:
            ValueError: no module matches, or a named module does not exist or cannot be measured.
        """
        return select_modules(self, pl_module)

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Choose the watched modules and hook the probes (fit only). A monitor from the environment stands aside
        here (see ``source``); a subclass that extends ``setup`` returns when :attr:`idle` is then true."""
        if stage != "fit":
            return
        self._idle = stands_aside_for_a_users_monitor(self, trainer)
        watched = None if self._idle else select_or_stand_aside(self, pl_module)
        if watched is None:
            self._idle = True
            return
        self._watched = watched
        self._remove_hooks()
        self._explicit = set(self._watched) if self.modules is not None else set()
        self._eval_only = set()
        check_first_forward = type(self).first_forward_problem is not Monitor.first_forward_problem
        hook_watched_modules(self, trainer, check_first_forward)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in [*self._hooks, *self._probe_hooks.values()]:
            handle.remove()
        self._hooks, self._probe_hooks = [], {}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, crossed = trainer.global_step, self.crossed_a_multiple(trainer)
        if step == self._last_step or not (
            crossed or (step > self._fit_start_step and last_batch_of_fit(trainer, batch_idx))
        ):
            return
        self._last_step = step
        self.run(trainer, pl_module)

    def crossed_a_multiple(self, trainer: pl.Trainer) -> bool:
        """Called once at the end of every training batch: whether the optimizer steps of the batch that just
        ended reached or passed a multiple of ``every_n_steps`` (the measuring rule of
        :mod:`~lightning_ortho.callbacks.monitors.schedule`). It also keeps that batch's logging step, for a
        measurement after the loop (:meth:`measure_last_step`)."""
        step, before = trainer.global_step, self._batch_end_step
        self._batch_end_step, self._batch_log_step = step, logging_step(trainer)
        return crossed_a_multiple(before, step, self.every_n_steps)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The last step of a fit is measured however the fit ended. Most often on_train_batch_end already did (so the
        # value is in the epoch-end checkpoint and seen by the last validation); here the rest: an early stop, a
        # max_time stop, or a last batch the loop could not tell in advance.
        self.measure_last_step(trainer, pl_module)

    def measure_last_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Measure at the end of fit when this fit trained and its last step has no measurement yet (every process
        reaches this, so the reductions match); logged at the last batch's step."""
        step = trainer.global_step
        if step > self._fit_start_step and step != self._last_step:
            self._last_step = step
            # The last batch's own logging step: after the loop, the loop's counter is one past it only when that
            # batch stepped (under gradient accumulation the last batch of an early stop may not have).
            log_step = self._batch_log_step
            self.run(trainer, pl_module, logging_step(trainer, after_loop=True) if log_step is None else log_step)

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, log_step: int | None = None) -> dict[str, float]:
        """Measure every watched module that has its probe now (in eval mode; afterwards each submodule is back in
        its own mode), reduce across processes, log (at ``log_step``, by default the step of the batch that just
        ended: :func:`logging_step`) and record; returns the logged values."""
        logged: dict[str, float] = {}
        names = [name for name in self._watched if not self.needs_probe() or name in self.probes]
        if trainer.world_size > 1 and self._watched:
            # Every process must run the same reductions: measure the modules whose probe every process has.
            flags = [float(name in names) for name in self._watched]
            flags = torch.tensor(flags, dtype=torch.float64, device=trainer.strategy.root_device)
            flags = trainer.strategy.reduce(flags, reduce_op="min").tolist()
            names = [name for name, flag in zip(self._watched, flags, strict=True) if flag > 0]
        if not names:
            return logged
        self._fit_runs += 1
        with eval_mode(pl_module):
            for name in names:
                measured = self.measure(name, self._watched[name], self.probes.get(name))
                for statistic, measurement in sorted(measured.items()):
                    value = reduce_measurement(trainer, measurement)
                    if value is None:  # not defined for this module (on any process): not logged
                        continue
                    key = f"{self.prefix}/{name}/{statistic}" if name else f"{self.prefix}/{statistic}"
                    logged[key] = value
                    self._measured.add(name)
        log_step = logging_step(trainer) if log_step is None else log_step
        if logged:  # a measurement that gave nothing to log (everything undefined or constant) leaves no record
            log_values(trainer, logged, log_step, self.prog_bar)
            self.history.append({"step": trainer.global_step, "log_step": log_step, "values": logged})
        return logged

    # ---------------------------------------------------------------------------------------- checkpointing
    @property
    def state_key(self) -> str:
        """The key of this monitor's state in a checkpoint: the class name and :meth:`state_key_fields`, e.g.
        ``"InvertibilityMonitor{'modules': None, 'every_n_steps': 50}"``; ``"<Class>{'source': 'environment'}"``
        for a monitor from the environment switch.

        Two monitors of one class that differ in these fields keep separate states, and a checkpoint's state goes
        back to the monitor of the same configuration. A subclass with settings of its own that tell two
        instances apart adds them by overriding :meth:`state_key_fields`, not this property.
        """
        # One key per configuration, so two monitors of one class (on different modules) keep separate states; a
        # monitor from the environment has its own (never the same as a user's of its class).
        if self.source == "environment":
            return self._generate_state_key(source="environment")
        return self._generate_state_key(**self.state_key_fields())

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "probes": dict(self.probes), "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.probes = dict(state_dict.get("probes", {}))
        self._last_step = state_dict.get("last_step", -1)

    # ------------------------------------------------------------------------------------------------ report
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After a checkpoint is restored: the steps of this fit count from here.
        self._fit_start_step = self._batch_end_step = trainer.global_step
        self._batch_log_step = None
        self._measured, self._fit_runs = set(), 0

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove_hooks()
        report_at_fit_end(self, trainer)
        warn_unmeasured(self, trainer)
        if trainer.world_size > 1:
            # Rank zero spends a while on the table and the PNG; without waiting for it, another process could
            # reach its exit first, and a spawned gloo process then sometimes aborted ("terminate called without
            # an active exception").
            trainer.strategy.barrier("monitor_fit_end")

    def unmeasured_reason(self, name: str, trainer: pl.Trainer) -> str:
        """Why the watched module ``name`` got no value in this fit, and what to change (said at the end of fit)."""
        if self.needs_probe() and name not in self.probes:
            return missing_probe_reason(self, name)
        if self._fit_runs:
            return "its measurement gave no value (see the warnings above)"
        steps = trainer.global_step - self._fit_start_step
        return (
            f"no measurement ran in the fit's {steps} optimizer steps (every_n_steps={self.every_n_steps}, and the "
            "last step of a fit; under DDP a module is measured once every process has its probe)"
        )

    def fit_too_short(self, name: str, trainer: pl.Trainer) -> bool:
        """Whether ``name`` got no value in this fit only because the fit was too short to measure it (nothing is
        wrong with the model or the settings). Such a fit is reported at info level where
        :attr:`short_fit_is_info` is set."""
        return False

    def summary(self) -> dict[str, tuple[float, float, float]]:
        """``key -> (last, min, max)`` over the history."""
        table: dict[str, list[float]] = {}
        for record in self.history:
            for key, value in record["values"].items():
                table.setdefault(key, []).append(value)
        return {key: (values[-1], min(values), max(values)) for key, values in table.items()}

    def _warn_once(self, key: str, message: str) -> None:
        warned = self.__dict__.setdefault("_warned", set())
        if key not in warned:
            warned.add(key)
            warnings.warn(message, stacklevel=2)


gate_hooks(Monitor)
