"""Gradient noise of any model from the mini-batch gradients it already computes (McCandlish et al. 2018).

Over a window of ``n`` optimizer steps with final gradients ``g_1 .. g_n`` (read in ``on_before_optimizer_step``:
after DDP's all-reduce, after the precision plugin's unscaling, before clipping) and mean batch size ``B``:

* ``G_bar = mean_t g_t`` and ``S = sum_t ||g_t - G_bar||^2 / (n - 1)``: the unbiased estimate of
  ``tr(Sigma_batch)``, the trace of the covariance of one step's (mini-batch) gradient;
* ``|G|^2 ~ ||G_bar||^2 - S / n``: the unbiased estimate of the squared norm of the true gradient
  (``E ||G_bar||^2 = |G|^2 + tr(Sigma_batch) / n``). This is McCandlish et al.'s two-batch-size estimator
  (their appendix A.1) with the small batch one step's ``B`` examples and the big batch the window's ``n B``:
  ``|G|^2 = (n B ||G_bar||^2 - B mean_t ||g_t||^2) / (n B - B)`` simplifies to it;
* ``tr(Sigma) = B S``: the per-example covariance (a mean over ``B`` independent examples has covariance
  ``Sigma / B``), and the simple noise scale ``B_simple = tr(Sigma) / |G|^2``, the batch size above which larger
  batches stop paying off (the critical batch size is of that order). ``B_simple`` does not depend on how the loss
  is scaled (mean or sum over the batch, loss scaling), since both estimates scale together.

Assumptions: the window's gradients are draws at (nearly) the same parameters, i.e. the parameters change little
over ``window_steps`` steps (a large learning rate makes ``S`` include the drift of the gradient along the
trajectory, so it overestimates the noise); examples are independent draws (sampling without replacement from a
small data set makes the noise smaller than this assumes); the loss is a mean or a sum over the batch's examples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from lightning_ortho._deprecation import warn_deprecated
from lightning_ortho._lightning import pl, rank_zero_info, rank_zero_warn
from lightning_ortho.callbacks._gradient_noise_unmeasured import next_window_end, why_unmeasured
from lightning_ortho.callbacks._gradient_window import GradientWindow, batch_rows, noise_scale
from lightning_ortho.callbacks._watched_parameters import WatchedParameters, some
from lightning_ortho.callbacks.monitors.base import Measurement, ModuleSpec, Monitor, Source


class GradientNoiseMonitor(Monitor):
    """Gradient noise per parameter group from the gradients training already computes: no extra forward or
    backward pass (see the module docstring for the estimators and their assumptions).

    A **parameter group** is a submodule's trainable parameters. By default the groups are the whole model
    (logged as ``gradient_noise/<statistic>``) and each top-level submodule with trainable parameters
    (``gradient_noise/<child>/<statistic>``); ``modules=[...]`` names others (names such as ``"encoder.0"`` or
    module classes; groups may overlap). Statistics, every ``every_n_steps`` optimizer steps, of a window of
    ``window_steps`` steps:

    * ``batch_variance``: ``tr(Sigma_batch)``, the variance of one step's gradient summed over coordinates;
    * ``mean_grad_sq``: ``||G_bar||^2``, the squared norm of the window's mean gradient;
    * ``signal``: ``||G_bar||^2 - tr(Sigma_batch) / n``, the unbiased estimate of the true gradient's squared
      norm (it can be negative when the noise hides the signal);
    * ``snr``: ``signal / batch_variance``, the signal-to-noise ratio of one step's gradient (not logged where
      ``batch_variance`` is 0: the same gradient at every step of the window);
    * ``noise_scale``: ``B_simple = B tr(Sigma_batch) / signal`` (not logged where ``signal <= 0``: the noise hides
      the signal and the ratio is undefined); with ``smoothing > 0``, numerator and denominator are exponential
      moving averages over windows (as McCandlish et al. advise: the ratio of two noisy estimates is noisier than
      either).

    A group whose gradient is zero at every step of a window (an unused or gated submodule, steps whose loss is
    masked out) has no gradient noise to measure: it is not measured in that window (nothing logged, its moving
    averages unchanged), and a group that never had a gradient in a fit's windows is named in the end-of-fit
    warning.

    Memory: one running mean per trainable parameter (Welford's update, numerically stable; a copy of the
    parameters in at least float32) and one number per parameter tensor; the partial window is saved in the
    checkpoint so that a resumed run measures the same windows as an uninterrupted one. One window is measured every
    ``every_n_steps`` optimizer steps: the last ``window_steps`` steps before each multiple of ``every_n_steps``
    (steps ``k every_n_steps - window_steps .. k every_n_steps - 1``, counted before each step), whatever the
    batches (gradient accumulation, several optimizer steps per batch under manual optimisation). A window closes
    with the step that reaches the multiple, so its values are logged at the end of the first batch at or past that
    multiple, the batch every monitor measures after (if two close in one batch, the later one); unlike the other
    monitors, nothing is measured after the last batch of fit: a partial window at the end of fit is kept, not
    measured (a fit shorter than ``every_n_steps`` measures nothing: lower ``every_n_steps``). A step whose gradient holds inf or NaN (a step the
    mixed-precision scaler skips) is left out, with one warning, and its window is dropped: it cannot complete in
    its interval, and is never continued in the next one (that would mix gradients an interval apart). When the
    model's trainable parameters change in a fit (layers replaced, e.g. by TransformCompression; parameters frozen
    or unfrozen), the groups are rebuilt from the parameters then, the window in progress is dropped, and one info
    line says so; checked at every epoch start and when a window step's optimizer holds an unknown trainable
    parameter (no cost on other steps).

    DDP: the gradients read are the all-reduced ones, so every process holds the same statistics and the logged
    values equal those of one process on the same global batch (tested). The batch size is
    ``len(first tensor of the batch) * world_size`` summed over the batches of each optimizer step, or
    ``batch_size``. Strategies that shard gradients (FSDP, DeepSpeed) are not supported.

    Args:
        modules: parameter groups (see above); ``None`` for the whole model and its top-level submodules.
        every_n_steps: optimizer steps between measurements (the interval, as for every monitor: values at the end
            of the first training batch at or past each multiple of ``every_n_steps``), at least 2. The per-step
            cost is paid on ``window_steps / every_n_steps`` of the steps (``every_n_steps =
            window_steps`` reads every step). A fit that completes no window says so in a warning at its end (at
            info level for a monitor from ``LIGHTNING_ORTHO_MONITORS`` when the fit was just too short).
        window_steps: optimizer steps whose gradients make one measurement, at least 2 (20 or more gives usable
            estimates) and at most ``every_n_steps``; default ``min(20, every_n_steps)``.
        batch_size: the global batch size of one optimizer step, or ``None`` to infer it from the batches.
        smoothing: factor of the moving averages behind ``noise_scale``, in ``[0, 1)``; 0 uses each window alone.
        plot: at the end of fit, write ``<Class>.png`` of the history into the first logger's directory (needs
            matplotlib: ``pip install "lightning-ortho[plots]"``).
        prog_bar: also show the logged values in the progress bar.
        verbose: print a table of each statistic's last, smallest and largest value at the end of fit.
        source: ``"user"`` (constructed in code or a config) or ``"environment"`` (by the environment switch of
            :mod:`~lightning_ortho.callbacks.factory`), as in :class:`~lightning_ortho.callbacks.monitors.base.Monitor`.
        interval: deprecated (removed in the next minor release): ``every_n_steps`` was the window and ``interval``
            the steps between windows; given, the monitor is ``every_n_steps=interval, window_steps=every_n_steps``,
            with :class:`~lightning_ortho.LightningOrthoDeprecationWarning`.

    Raises:
        ValueError: ``every_n_steps`` or ``window_steps`` below 2, ``window_steps > every_n_steps``, ``interval``
            with ``window_steps``, ``batch_size``
            not a positive int, ``smoothing`` outside ``[0, 1)``; at setup, a named module that does not exist or
            has no trainable parameters.
    """

    prefix = "gradient_noise"
    min_every_n_steps = 2  # the variance needs two gradients per window, and the window fits in the interval

    def __init__(
        self,
        modules: ModuleSpec | None = None,
        every_n_steps: int = 100,
        window_steps: int | None = None,
        batch_size: int | None = None,
        smoothing: float = 0.0,
        plot: bool = False,
        *,
        prog_bar: bool = False,
        verbose: bool = True,
        source: Source = "user",
        interval: int | None = None,
    ) -> None:
        owner = type(self).__name__
        if interval is not None:
            # Before: every_n_steps was the window and interval the steps between windows.
            if window_steps is not None:
                raise ValueError(
                    f"{owner}: interval= is the deprecated name of every_n_steps and cannot go with window_steps=; "
                    "give every_n_steps (the steps between measurements) and window_steps (the window)."
                )
            warn_deprecated(
                f"{owner}(every_n_steps={every_n_steps}, interval={interval}) is deprecated and will be removed in the "
                f"next minor release: every_n_steps is now the interval and window_steps the window; this is "
                f"{owner}(every_n_steps={interval}, window_steps={every_n_steps}).",
                stacklevel=2,
            )
            every_n_steps, window_steps = interval, every_n_steps
        super().__init__(modules, every_n_steps, 1, plot, prog_bar=prog_bar, verbose=verbose, source=source)
        if every_n_steps < self.min_every_n_steps:
            raise ValueError(
                f"{owner}: every_n_steps must be at least 2 (the optimizer steps between measurements, each from a "
                f"window of at least two gradients), got {every_n_steps!r}."
            )
        if window_steps is None:
            window_steps = min(20, every_n_steps)
        if not isinstance(window_steps, int) or isinstance(window_steps, bool) or window_steps < 2:
            raise ValueError(
                f"{owner}: window_steps must be an int of at least 2 (the variance needs two gradients per window; 20 "
                f"or more gives usable estimates), got {window_steps!r}."
            )
        if window_steps > every_n_steps:
            raise ValueError(
                f"{owner}: window_steps={window_steps} is longer than every_n_steps={every_n_steps}: one window is "
                "measured every every_n_steps optimizer steps, from its last window_steps steps. Raise every_n_steps "
                "or lower window_steps."
            )
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
        ):
            raise ValueError(
                f"{owner}: batch_size must be None (inferred from the batches) or the positive global batch size of"
                f" one optimizer step, got {batch_size!r}."
            )
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise ValueError(
                f"{owner}: smoothing must be a number in [0, 1) (0: each window alone; 0.9: average over ~10 windows),"
                f" got {smoothing!r}."
            )
        self.window_steps = window_steps
        self.batch_size = batch_size
        self.smoothing = float(smoothing)
        self._watch = WatchedParameters()  # the parameter groups, followed when the model's parameters change
        self._ema: dict[str, tuple[float, float]] = {}  # group -> (tr(Sigma), |G|^2) moving averages
        self._window_cycle: int | None = None  # global_step // every_n_steps of the window's steps (None: none yet)
        self._fit_skipped = 0  # steps left out for inf/NaN gradients in this fit
        self._without_gradient: set[str] = set()  # groups whose gradient was zero over a window of this fit
        self._window = GradientWindow()  # the window in progress
        self._pending_examples = 0
        self._last_batch_examples = 0
        self._finished: dict[str, dict[str, float]] | None = None  # a closed window's statistics, not yet logged

    def state_key_fields(self) -> dict[str, Any]:
        """Unique per configuration, so a Trainer can hold several (e.g. with and without smoothing)."""
        return {
            **super().state_key_fields(),
            "window_steps": self.window_steps,
            "batch_size": self.batch_size,
            "smoothing": self.smoothing,
        }

    # ------------------------------------------------------------------------------------------- selection
    def candidates(self, pl_module: pl.LightningModule) -> Iterable[tuple[str, nn.Module]]:
        if _trainable(pl_module):
            yield "", pl_module
        for name, child in pl_module.named_children():
            if _trainable(child):
                yield name, child

    def can_measure(self, module: nn.Module) -> str | None:
        return None if _trainable(module) else "it has no trainable parameters."

    def needs_probe(self) -> bool:
        return False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit" or self.idle:
            return
        self._watch.build(pl_module, self._watched)

    @property
    def _groups(self) -> dict[str, list[str]]:
        return self._watch.groups

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._watch.release()  # the parameters are not kept alive past the fit (the next setup builds them again)

    def _follow_parameter_changes(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """Rebuild the groups when the model's trainable parameters changed since they were built (layers replaced,
        e.g. by TransformCompression, or parameters frozen or unfrozen), drop the window in progress (its means
        belong to the old parameters) and say so; return whether they changed. One pass over the parameters."""
        if not self._watch.changed(pl_module):
            return False
        old_groups, dropped = list(self._groups), self._steps
        new, gone = self._regroup(pl_module)
        self._window = GradientWindow()
        groups = ", ".join(f"{g or 'the whole model'!r}: {len(names)} tensors" for g, names in self._groups.items())
        lost = [repr(g) for g in old_groups if g not in self._groups]
        message = (
            f"{type(self).__name__}: the model's trainable parameters changed at step {trainer.global_step} (new:"
            f" {some(new)}; gone: {some(gone)}), e.g. layers replaced by TransformCompression: the parameter groups"
            f" are rebuilt from the parameters now ({groups or 'none left to measure'}"
            + (f"; no trainable parameters left in {', '.join(lost)}" if lost else "")
            + ")"
            + (
                f"; the window in progress ({dropped} step{'s' * (dropped > 1)}, of the old parameters) is dropped"
                if dropped
                else ""
            )
        )
        (rank_zero_info if self._groups else rank_zero_warn)(message + ".")
        return True

    def _regroup(self, pl_module: pl.LightningModule) -> tuple[list[str], list[str]]:
        """Find the watched modules again and rebuild the groups; the names of the parameters new and gone."""
        if self.modules is None:  # the automatic choice, made again (a top-level child may have gained or lost all)
            self._watched = dict(self.candidates(pl_module))
        else:  # the named modules, found again by name (a replaced layer is the one now under its name)
            modules = dict(pl_module.named_modules())
            self._watched = {n: modules[n] for n in self._watched if n in modules and _trainable(modules[n])}
        return self._watch.build(pl_module, self._watched)

    # ------------------------------------------------------------------------------------------ the window
    @property
    def _steps(self) -> int:
        """Optimizer steps in the window in progress."""
        return self._window.steps

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        rows = batch_rows(batch)
        self._last_batch_examples = rows
        self._pending_examples += rows

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Duty cycle: only the last window_steps optimizer steps of every interval are read (the per-step cost, a
        # pass over every gradient, is then paid on window_steps / every_n_steps of the steps). The last ones, so
        # that the values come after the same steps as every monitor's (multiples of every_n_steps).
        examples = self._pending_examples or self._last_batch_examples  # several steps in one batch: the batch's
        self._pending_examples = 0
        cycle, position = divmod(trainer.global_step, self.every_n_steps)
        if position < self.every_n_steps - self.window_steps:
            return
        if self._window_cycle is not None and self._window_cycle != cycle:
            # What is left of an earlier interval's window is incomplete (a step was skipped for inf/NaN, or a
            # restored window): drop it rather than finish it with gradients an interval later.
            self._window = GradientWindow()
        self._window_cycle = cycle
        names, grads, suspect = self._watch.read(optimizer)
        if suspect:  # the model's parameters may have changed (e.g. a re-created optimizer holds new ones)
            if self._follow_parameter_changes(trainer, pl_module):
                names, grads, _ = self._watch.read(optimizer)
            else:
                self._watch.accept(optimizer)
        if not names:
            return
        if not self._accumulate(names, grads):
            return
        window = self._window
        window.steps += 1
        window.examples += self.batch_size if self.batch_size is not None else examples * trainer.world_size
        if window.steps >= self.window_steps:
            self._close_window()

    def _close_window(self) -> None:
        """Freeze the full window's statistics (smoothed), to be logged at the end of the batch; start a new one."""
        finished = {}
        for group in self._groups:
            stats = self.statistics(group)
            if stats is None:
                continue
            if stats["mean_grad_sq"] == 0 and stats["batch_variance"] == 0:
                # Every gradient of the window was zero (mean and spread 0): no noise to measure, and every ratio
                # would be 0/0. Not measured in this window; said at the end of fit if it never had one.
                self._without_gradient.add(group)
                continue
            if self.smoothing:
                trace, signal = stats["batch_size"] * stats["batch_variance"], stats["signal"]
                if group in self._ema:
                    old_trace, old_signal = self._ema[group]
                    trace = self.smoothing * old_trace + (1 - self.smoothing) * trace
                    signal = self.smoothing * old_signal + (1 - self.smoothing) * signal
                self._ema[group] = (trace, signal)
                stats["noise_scale"] = noise_scale(trace, signal)
            finished[group] = stats
        self._finished = finished  # a second window closing in the same batch replaces the first (both smoothed)
        self._window = GradientWindow()

    def _accumulate(self, names: list[str], grads: list[torch.Tensor]) -> bool:
        """Add one step's gradients to the window; ``False`` (with one warning per monitor) where one holds inf or
        NaN: the step is left out."""
        if self._window.accumulate(names, grads):
            return True
        self._fit_skipped += 1
        self._warn_once(
            "nonfinite",
            f"{type(self).__name__}: a gradient holds inf or NaN (a step the mixed-precision scaler skips, or a"
            " diverging run); such steps are left out of the noise statistics, and the window holding one is "
            "dropped (the next window starts with the next interval).",
        )
        return False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._finished is None:
            return
        self.run(trainer, pl_module)
        self._finished = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._fit_skipped, self._without_gradient = 0, set()
        if self._watch.changed(pl_module):
            # Restoring a checkpoint (after setup) may rebuild layers (e.g. compressed ones): the groups follow,
            # quietly, and the restored window stays, since it was measured on the parameters restored with it.
            self._regroup(pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._follow_parameter_changes(trainer, pl_module)  # changes between epochs: once per epoch, one pass

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pass  # values come from complete windows only; a partial one at the end of fit is kept, not measured

    # ---------------------------------------------------------------------------------------- measurement
    def statistics(self, group: str) -> dict[str, float] | None:
        """The current window's statistics of one group (``None`` before two gradients), without smoothing:
        ``batch_variance``, ``mean_grad_sq``, ``signal``, ``snr``, ``noise_scale``, ``batch_size``, ``steps``."""
        return self._window.statistics(self._groups.get(group, []))

    def fit_too_short(self, name: str, trainer: pl.Trainer) -> bool:
        # No window ends inside this fit's steps; were one to end there, a missing value is no matter of length.
        return next_window_end(self._fit_start_step, self.every_n_steps) >= trainer.global_step

    def unmeasured_reason(self, name: str, trainer: pl.Trainer) -> str:
        return why_unmeasured(self, name, trainer)

    def measure(self, name: str, module: nn.Module, probe: torch.Tensor | None) -> dict[str, Measurement]:
        stats = (self._finished or {}).get(name)
        if stats is None:
            return {}
        keys = ("batch_variance", "mean_grad_sq", "signal", "snr", "noise_scale")
        # Every process holds the same all-reduced gradients: the mean over processes changes nothing. A ratio that
        # is not defined (snr without variance, noise_scale without a positive signal) has weight 0: not logged.
        return {key: Measurement(stats[key], "mean", 1.0 if math.isfinite(stats[key]) else 0.0) for key in keys}

    # ------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["window"] = {**self._window.state_dict(), "cycle": self._window_cycle}
        state["ema"] = dict(self._ema)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        window = state_dict.get("window")
        self._window = GradientWindow() if window is None else GradientWindow.from_state(window)
        # The interval the window's steps belong to (None from an older checkpoint: taken as the one resumed in).
        self._window_cycle = None if window is None else window.get("cycle")
        self._ema = dict(state_dict.get("ema", {}))


def _trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())
