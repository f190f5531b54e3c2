"""One window of a gradient noise monitor: the running mean and spread (Welford's update) of each parameter's
gradient over the window's optimizer steps, and a parameter group's noise statistics from them (the estimators and
their assumptions are those of :mod:`~lightning_ortho.callbacks.gradient_noise`)."""

from __future__ import annotations

import math
from typing import Any

import torch


class GradientWindow:
    """The gradients of the optimizer steps of one window, accumulated per parameter.

    Memory: one running mean per parameter (in at least float32, on the gradient's device) and one number per
    parameter tensor.

    Attributes:
        means: ``{parameter: running mean of its gradient}``.
        m2: ``{parameter: sum_t ||g_t - G_bar||^2}`` (Welford).
        counts: ``{parameter: gradients in the window}``.
        steps: optimizer steps in the window.
        examples: their global batch sizes, summed.
        skipped: steps left out of the window for a gradient holding inf or NaN.
    """

    def __init__(self) -> None:
        self.means: dict[str, torch.Tensor] = {}
        self.m2: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.steps = 0
        self.examples = 0
        self.skipped = 0

    def accumulate(self, names: list[str], grads: list[torch.Tensor]) -> bool:
        """Add one gradient per named parameter by Welford's update of its mean: ``delta = g - mean``,
        ``mean += delta / n``, ``m2 += (n - 1) / n ||delta||^2`` (``= delta . (g - new mean)``).

        Returns:
            ``False`` where a gradient holds inf or NaN: nothing is added, and the step counts in :attr:`skipped`.
        """
        means = []
        for name, g in zip(names, grads, strict=True):
            mean = self.means.get(name)
            dtype = torch.promote_types(g.dtype, torch.float32)
            if mean is None:
                mean = torch.zeros_like(g, dtype=dtype)
            elif mean.device != g.device:  # loaded from a checkpoint
                mean = mean.to(g.device)
            means.append(mean)
        grads = [g.to(m.dtype) for g, m in zip(grads, means, strict=True)]
        deltas = torch._foreach_sub(grads, means)
        squares = torch.stack([n.double() for n in torch._foreach_norm(deltas)]).square().tolist()  # one sync
        if not all(math.isfinite(s) for s in squares):
            self.skipped += 1
            return False
        by_count: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for name, mean, delta, square in zip(names, means, deltas, squares, strict=True):
            count = self.counts.get(name, 0) + 1
            self.counts[name] = count
            self.m2[name] = self.m2.get(name, 0.0) + (count - 1) / count * square
            self.means[name] = mean
            pair = by_count.setdefault(count, ([], []))
            pair[0].append(mean)
            pair[1].append(delta)
        for count, (group_means, group_deltas) in by_count.items():
            torch._foreach_add_(group_means, group_deltas, alpha=1.0 / count)
        return True

    def statistics(self, names: list[str]) -> dict[str, float] | None:
        """The statistics of the group of parameters ``names`` (those with two gradients or more in the window;
        ``None`` where there is none, or no step), without smoothing: ``batch_variance``, ``mean_grad_sq``,
        ``signal``, ``snr``, ``noise_scale``, ``batch_size``, ``steps``."""
        names = [n for n in names if self.counts.get(n, 0) >= 2]
        if not names or not self.steps:
            return None
        means = [self.means[n] for n in names]
        mean_sq = sum(float(v) ** 2 for v in torch._foreach_norm(means))
        variance = sum(self.m2[n] / (self.counts[n] - 1) for n in names)
        signal = mean_sq - sum(self.m2[n] / (self.counts[n] - 1) / self.counts[n] for n in names)
        batch = self.examples / self.steps
        return {
            "batch_variance": variance,
            "mean_grad_sq": mean_sq,
            "signal": signal,
            "snr": _ratio(signal, variance),
            "noise_scale": noise_scale(batch * variance, signal),
            "batch_size": batch,
            "steps": float(self.steps),
        }

    def state_dict(self) -> dict[str, Any]:
        """The window as a checkpoint holds it (means on the CPU)."""
        return {
            "means": {n: m.detach().cpu().clone() for n, m in self.means.items()},
            "m2": dict(self.m2),
            "counts": dict(self.counts),
            "steps": self.steps,
            "examples": self.examples,
            "skipped": self.skipped,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GradientWindow:
        """The window of a checkpoint's :meth:`state_dict` (the means move to the gradients' device at the next
        :meth:`accumulate`)."""
        window = cls()
        window.means = dict(state["means"])
        window.m2, window.counts = dict(state["m2"]), dict(state["counts"])
        window.steps, window.examples, window.skipped = state["steps"], state["examples"], state["skipped"]
        return window


def batch_rows(batch: Any) -> int:
    """Rows of the first tensor in a batch (a tensor, or nested in lists, tuples and dicts); 0 if none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            rows = batch_rows(item)
            if rows:
                return rows
    return 0


def _ratio(numerator: float, denominator: float) -> float:
    if denominator > 0:
        return numerator / denominator
    return math.nan if numerator == 0 else math.copysign(math.inf, numerator)


def noise_scale(trace: float, signal: float) -> float:
    """``tr(Sigma) / |G|^2``; ``inf`` where the signal estimate is not positive (the noise hides it; not logged)."""
    return trace / signal if signal > 0 else math.inf
