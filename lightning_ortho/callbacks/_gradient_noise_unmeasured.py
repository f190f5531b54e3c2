"""Why a gradient noise monitor got no value for a parameter group in a fit, and what to change (said in the
end-of-fit warning): a gradient that was zero at every step, windows dropped for inf or NaN gradients, or a fit that
completed no window of ``window_steps`` steps before a multiple of ``every_n_steps``."""

from __future__ import annotations

from typing import Any

from lightning_ortho._lightning import pl


def next_window_end(fit_start_step: int, every_n_steps: int) -> int:
    """The last step of the first window that ends in a fit starting at ``fit_start_step`` or later
    (``k every_n_steps - 1 >=`` the fit's first step, ``k >= 1``)."""
    k = max(1, -(-(fit_start_step + 1) // every_n_steps))
    return k * every_n_steps - 1


def why_unmeasured(monitor: Any, name: str, trainer: pl.Trainer) -> str:
    """Why ``monitor`` (a :class:`~lightning_ortho.callbacks.gradient_noise.GradientNoiseMonitor`) has no value for
    the group ``name`` in this fit, and what to change."""
    if name in monitor._without_gradient:
        return (
            "its parameters had a zero gradient at every step of each window of this fit (they do not reach the "
            "loss: an unused or gated submodule, or steps whose loss is masked out), so there is no gradient noise "
            "to measure; leave it out of modules if that is intended"
        )
    start, end = monitor._fit_start_step, trainer.global_step  # this fit ran the steps start .. end - 1
    steps, window, every = end - start, monitor.window_steps, monitor.every_n_steps
    what = (
        f"no window of window_steps={window} optimizer steps was completed in this fit's {steps} steps (steps "
        f"{start}..{end - 1}; a window is the last window_steps steps of every every_n_steps={every}"
    )
    if not monitor.fit_too_short(name, trainer):
        if monitor._fit_skipped:
            return (
                f"{what}): {monitor._fit_skipped} of them had inf or NaN gradients and were left out, which drops "
                "their window; a mixed-precision scaler skips steps while it lowers its scale, most often in the "
                "first steps: train longer, or check the run for divergence"
            )
        return f"{what}; a window restored incomplete from a checkpoint is dropped)"
    window_end = next_window_end(start, every)
    advice = [f"train to at least {window_end + 1} optimizer steps"]
    if every > window and steps >= window:  # long enough for a window, but it fell between two
        advice.append(f"use a shorter every_n_steps (every_n_steps={window} reads every step)")
    if monitor.min_every_n_steps <= steps < window:  # shorter than one window, long enough for a smaller one
        advice.append(f"use a smaller window_steps (at least {monitor.min_every_n_steps})")
    return f"{what}, and the next one ends at step {window_end}): " + ", or ".join(advice)
