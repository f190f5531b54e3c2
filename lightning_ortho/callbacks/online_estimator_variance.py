"""Bias and variance of an online gradient estimator (UORO, truncated BPTT, ...) against the exact gradient, measured
while a recurrent model trains online, by repeated draws on a probe sequence at the current parameters.

On a probe chunk ``x`` ``(b, T, I)`` with targets, started from a zero state, let ``g`` be the exact gradient of
``L = sum_t L_t`` (``L_t`` the masked loss of step ``t`` over the ``b`` probe streams divided by ``b``, as
:class:`~lightning_ortho.models.OnlineRNNModule` normalises it) with respect to the cell's parameters, computed by
backprop through time over the chunk, and ``g_1 .. g_R`` the estimator's estimates ``sum_t gradient(state_t,
dL_t/dh_t)`` from ``R`` independent noise draws. With ``g_bar`` their mean, ``D`` the ``(R, P)`` deviations from it
and ``C = D^T D / (R - 1)``:

* ``total_variance`` ``V = tr C``: the unbiased estimate of ``tr Cov(g_r)`` (the total variance of the estimate
  summed over the sequence);
* ``squared_bias`` ``||g_bar - g||^2 - V / R``: the unbiased estimate of ``||E g_r - g||^2``
  (``E ||g_bar - g||^2 = ||bias||^2 + tr Cov / R``); zero in expectation for an unbiased estimator (UORO), so it
  scatters around 0, and positive for a biased one (truncated BPTT);
* ``squared_bias_se``: its standard error if the estimator is unbiased, ``sqrt(2 tr(C^2)) / R`` (the mean of the
  draws is about Gaussian with covariance ``C / R``; ``tr(C^2)`` is estimated from ``||D D^T||_F^2`` without the
  bias of the sample covariance), so that
  ``squared_bias / squared_bias_se`` is a z-score of the hypothesis "no bias": within about 3 is consistent with an
  unbiased estimator, far above it is a bias;
* ``relative_variance`` ``V / ||g||^2``, ``relative_bias`` ``squared_bias / ||g||^2``, ``exact_grad_sq`` ``||g||^2``.

A deterministic estimator (one without a noise generator: RTRL, truncated BPTT) is run once: ``V = 0`` and the
standard error is 0.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.monitors.base import Measurement, Monitor, Source
from lightning_ortho.online import OnlineGradientEstimator
from lightning_ortho.online.losses import masked_loss_sum

LOSSES = ("cross_entropy", "mse")


@dataclass
class EstimatorVariance:
    """One measurement: the exact gradient and the estimates, flattened in the order of
    ``cell.named_parameters()`` (``names``, ``shapes``).

    Attributes:
        exact: ``(P,)`` the exact gradient (backprop through time over the probe), float64.
        estimates: ``(R, P)`` one estimate per draw, float64 (``R = 1`` for a deterministic estimator).
        names: parameter names.
        shapes: their shapes.
    """

    exact: torch.Tensor
    estimates: torch.Tensor
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def draws(self) -> int:
        """``R``, the number of estimates (rows of ``estimates``)."""
        return self.estimates.shape[0]

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(P,)`` -> ``{name: tensor of its shape}``."""
        sizes = [math.prod(s) for s in self.shapes]
        return {n: c.reshape(s) for n, c, s in zip(self.names, flat.split(sizes), self.shapes, strict=True)}

    def statistics(self) -> dict[str, float]:
        """``total_variance``, ``squared_bias``, ``squared_bias_se``, ``relative_variance``, ``relative_bias``,
        ``exact_grad_sq`` (module docstring)."""
        r = self.draws
        mean = self.estimates.mean(0)
        bias = mean - self.exact
        raw = float(bias.square().sum())
        if r > 1:
            deviations = self.estimates - mean
            variance = float(deviations.square().sum()) / (r - 1)
            # tr(C^2) without the bias of the sample covariance (Gaussian draws, n = R - 1 degrees of freedom)
            n = r - 1
            plug_in = float((deviations @ deviations.T).square().sum()) / n**2
            trace_c2 = max(n**2 / ((n - 1) * (n + 2)) * (plug_in - variance**2 / n), 0.0) if n > 1 else plug_in
            squared_bias = raw - variance / r
            se = math.sqrt(2 * trace_c2) / r
        else:
            variance, squared_bias, se = 0.0, raw, 0.0
        exact_sq = float(self.exact.square().sum())
        return {
            "total_variance": variance,
            "squared_bias": squared_bias,
            "squared_bias_se": se,
            "relative_variance": variance / exact_sq if exact_sq > 0 else math.nan,
            "relative_bias": squared_bias / exact_sq if exact_sq > 0 else math.nan,
            "exact_grad_sq": exact_sq,
        }


def online_parts(module: nn.Module) -> tuple[nn.Module, nn.Module, OnlineGradientEstimator, str] | str:
    """``(cell, readout, estimator, loss)`` of a model trained online like
    :class:`~lightning_ortho.models.OnlineRNNModule` (found by capability: an ``estimator`` that is an
    :class:`~lightning_ortho.online.OnlineGradientEstimator` of its ``cell``, a ``readout`` module and a
    ``loss_name`` in ``("cross_entropy", "mse")``), or the reason it is not one."""
    estimator = getattr(module, "estimator", None)
    cell, readout, loss = (
        getattr(module, "cell", None),
        getattr(module, "readout", None),
        getattr(module, "loss_name", None),
    )
    if not isinstance(estimator, OnlineGradientEstimator):
        return "it has no `estimator` (an OnlineGradientEstimator such as UORO)"
    if not isinstance(cell, nn.Module) or estimator.cell is not cell:
        return "its `estimator` does not estimate the gradient of its `cell`"
    if not isinstance(readout, nn.Module):
        return "it has no `readout` module (hidden state -> outputs)"
    if loss not in LOSSES:
        return f"its `loss_name` is {loss!r}, not one of {LOSSES}"
    return cell, readout, estimator, loss


def measure_estimator(
    cell: nn.Module,
    readout: nn.Module,
    estimator: OnlineGradientEstimator,
    loss: str,
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    draws: int,
    seed: int = 0,
) -> EstimatorVariance:
    """Run ``estimator`` ``draws`` times (once if it draws no noise) over the probe and compute the exact gradient.

    The draws run side by side as ``draws * b`` streams from one generator seeded with ``seed`` (streams are
    independent in every estimator, so this equals ``draws`` separate runs with different noise); each starts from
    a zero state. Nothing of the caller is changed: no parameter, ``.grad``, estimator setting or random state
    (torch's global generators are forked).

    Args:
        cell: the recurrent cell whose gradient is estimated.
        readout: the module from hidden states to outputs.
        estimator: an :class:`~lightning_ortho.online.OnlineGradientEstimator` of ``cell``.
        loss: ``"cross_entropy"`` or ``"mse"``.
        x: ``(b, T, I)`` inputs.
        y: ``(b, T)`` class indices or ``(b, T, O)`` targets.
        mask: ``(b, T)`` bool, the steps whose loss counts.
        draws: independent noise draws (at least 1; an estimator without noise runs once).
        seed: seed of the generator behind the draws' noise.

    Raises:
        ValueError: ``draws < 1`` or shapes that disagree.
    """
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"measure_estimator: draws must be a positive int, got {draws!r}.")
    if x.dim() != 3 or mask.shape != x.shape[:2] or y.shape[:2] != x.shape[:2]:
        raise ValueError(
            f"measure_estimator: need x (b, T, I), y (b, T[, O]) and mask (b, T); got {tuple(x.shape)},"
            f" {tuple(y.shape)}, {tuple(mask.shape)}."
        )
    parameter = next(cell.parameters())
    device, dtype = parameter.device, parameter.dtype
    x, y, mask = x.to(device=device, dtype=dtype), y.to(device), mask.to(device)
    streams = x.shape[0]
    devices = [device.index or 0] if device.type == "cuda" else []
    autocast = torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda") else nullcontext()
    with torch.random.fork_rng(devices=devices), autocast:
        h0 = torch.zeros(streams, cell.hidden_size, dtype=dtype, device=device)
        exact = _exact_gradient(cell, readout, loss, x, y, mask, h0)
        stochastic = estimator.initial_state(h0[:1]).generator is not None
        repeats = draws if stochastic else 1
        estimates = _estimates(estimator, readout, loss, x, y, mask, repeats, seed)
    layout = estimator.layout
    flat_exact = layout.flatten({n: g[None] for n, g in exact.items()}, lead=1)[0]
    return EstimatorVariance(flat_exact.double(), estimates.double(), layout.names, layout.shapes)


def _exact_gradient(cell, readout, loss, x, y, mask, h0) -> dict[str, torch.Tensor]:
    """Backprop through time over the probe: ``d/dtheta sum_t L_t`` for every parameter of the cell."""
    params = {n: p.detach().requires_grad_(True) for n, p in cell.named_parameters()}
    streams = x.shape[0]
    with torch.enable_grad():
        h, total = h0, None
        for t in range(x.shape[1]):
            h = functional_call(cell, params, (x[:, t], h))
            if bool(mask[:, t].any()):
                term = masked_loss_sum(readout(h), y[:, t], mask[:, t], loss) / streams
                total = term if total is None else total + term
        if total is None:
            return {n: torch.zeros_like(p) for n, p in params.items()}
        grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(params[n]) if g is None else g for n, g in zip(params, grads, strict=True)}


def _estimates(estimator, readout, loss, x, y, mask, repeats, seed) -> torch.Tensor:
    """``(repeats, P)``: each draw's ``sum_t gradient(state_t, dL_t/dh_t)``, draws side by side as streams."""
    streams, steps = x.shape[:2]
    x_all, y_all, mask_all = (v.repeat(repeats, *([1] * (v.dim() - 1))) for v in (x, y, mask))
    state = estimator.initial_state(torch.zeros(repeats * streams, estimator.cell.hidden_size).to(x))
    if state.generator is not None:
        state.generator = torch.Generator(device=x.device).manual_seed(int(seed))
    total = x.new_zeros(repeats, estimator.layout.size)
    for t in range(steps):
        h, state = estimator.step(x_all[:, t], state)
        if not bool(mask[:, t].any()):
            continue
        h_in = h.detach().requires_grad_(True)
        with torch.enable_grad():
            step_loss = masked_loss_sum(readout(h_in), y_all[:, t], mask_all[:, t], loss) / streams
            (grad_h,) = torch.autograd.grad(step_loss, h_in)
        grads = estimator.gradient(state, grad_h.to(h.dtype), per_stream=True)
        flat = estimator.layout.flatten(grads, lead=1)  # (repeats * streams, P)
        total += flat.view(repeats, streams, -1).sum(1).to(total.dtype)
    return total


class OnlineEstimatorVarianceMonitor(Monitor):
    """The bias and variance of an online model's gradient estimator against the exact gradient, during training.

    For a model trained online like :class:`~lightning_ortho.models.OnlineRNNModule` (an ``estimator`` of its
    ``cell``, a ``readout`` and a ``loss_name``; see :func:`online_parts`). The probe is the first
    ``probe_streams`` streams and ``probe_steps`` steps of the first training chunk (inputs, targets, mask),
    captured in ``on_train_batch_start``. Every ``every_n_steps`` optimizer steps (when every monitor measures: at
    the end of the first training batch at or past each multiple, and of the last batch of fit), at the current
    parameters,
    :func:`measure_estimator` runs the model's estimator ``draws`` times over the probe from a zero state and
    compares with backprop through time; logged as ``estimator_variance/<statistic>`` (statistics in the module
    docstring; the variance statistics, ``squared_bias_se`` included, only for an estimator that draws noise: a
    deterministic one such as truncated BPTT runs once and has none, and the relative ones only where the exact
    gradient is not zero). The latest measurement, with the exact gradient and every draw's estimate, is :attr:`last`.

    Training is not disturbed: the measurement reads the parameters and changes no parameter, gradient, estimator
    state, carried hidden state or random generator (tested bit for bit). Its cost is about ``draws *
    probe_streams`` streams over ``probe_steps`` steps of the estimator plus one backprop over the probe; the memory
    of the estimator's state for that many streams (UORO: ``draws * probe_streams * (H + P)``).

    Under DDP each process measures its own probe (its own streams); the logged values are means over processes
    weighted by probe streams.

    Args:
        every_n_steps: optimizer steps between measurements: at the end of the first training batch at or past
            each multiple of ``every_n_steps`` (an :class:`~lightning_ortho.models.OnlineRNNModule` takes one step
            per time step, several a batch), and of the last batch of fit.
        draws: independent noise draws per measurement (at least 2; a deterministic estimator runs once).
        probe_streams: streams of the probe (the first of the first chunk).
        probe_steps: time steps of the probe (``None``: the whole first chunk).
        seed: seed of the draws' noise (measurement ``k`` uses ``seed + k``), independent of the model's.
        plot: at the end of fit, write ``<Class>.png`` of the history into the first logger's directory (needs
            matplotlib: ``pip install "lightning-ortho[plots]"``).
        prog_bar: also show the logged values in the progress bar.
        verbose: print a table of each statistic's last, smallest and largest value at the end of fit.
        source: ``"user"`` (constructed in code or a config) or ``"environment"`` (by the environment switch of
            :mod:`~lightning_ortho.callbacks.factory`), as in :class:`~lightning_ortho.callbacks.monitors.base.Monitor`.

    Raises:
        ValueError: bad arguments; at setup, a model that is not trained online (no estimator, cell, readout).
    """

    prefix = "estimator_variance"

    def __init__(
        self,
        every_n_steps: int = 500,
        draws: int = 32,
        probe_streams: int = 4,
        probe_steps: int | None = None,
        seed: int = 0,
        plot: bool = False,
        *,
        prog_bar: bool = False,
        verbose: bool = True,
        source: Source = "user",
    ) -> None:
        owner = type(self).__name__
        if not isinstance(probe_streams, int) or isinstance(probe_streams, bool) or probe_streams < 1:
            raise ValueError(f"{owner}: probe_streams must be a positive int, got {probe_streams!r}.")
        super().__init__(None, every_n_steps, probe_streams, plot, prog_bar=prog_bar, verbose=verbose, source=source)
        if not isinstance(draws, int) or isinstance(draws, bool) or draws < 2:
            raise ValueError(
                f"{owner}: draws must be an int >= 2 (the variance needs two estimates; 32 or more to judge the"
                f" bias), got {draws!r}."
            )
        if probe_steps is not None and (
            not isinstance(probe_steps, int) or isinstance(probe_steps, bool) or probe_steps < 1
        ):
            raise ValueError(
                f"{owner}: probe_steps must be None (the whole chunk) or a positive int, got {probe_steps!r}."
            )
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"{owner}: seed must be a non-negative int, got {seed!r}.")
        self.draws, self.probe_streams, self.probe_steps, self.seed = draws, probe_streams, probe_steps, seed
        self.probe: dict[str, torch.Tensor] | None = None
        self.last: EstimatorVariance | None = None

    def state_key_fields(self) -> dict[str, Any]:
        return {
            "every_n_steps": self.every_n_steps,
            "draws": self.draws,
            "probe_streams": self.probe_streams,
            "probe_steps": self.probe_steps,
            "seed": self.seed,
        }

    def candidates(self, pl_module: pl.LightningModule):
        return [("", pl_module)] if not isinstance(online_parts(pl_module), str) else []

    def needs_probe(self) -> bool:
        return False  # the probe is a chunk of the training batches, captured in on_train_batch_start

    def select(self, pl_module: pl.LightningModule) -> dict[str, nn.Module]:
        parts = online_parts(pl_module)
        if isinstance(parts, str):
            raise ValueError(
                f"{type(self).__name__}: {type(pl_module).__name__} is not a model trained online: {parts}. This"
                " monitor measures the gradient estimator of lightning_ortho.models.OnlineRNNModule (or a model"
                " with the same estimator, cell, readout and loss_name); for the gradient noise of any model use"
                " GradientNoiseMonitor."
            )
        return super().select(pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.probe is not None or not isinstance(batch, dict) or not {"x", "y"} <= set(batch):
            return
        x, y = batch["x"], batch["y"]
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            return  # the model refuses such a batch with its own message
        mask = batch.get("mask")
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        rows, steps = slice(0, self.probe_streams), slice(0, self.probe_steps)
        self.probe = {k: v[rows, steps].detach().clone() for k, v in (("x", x), ("y", y), ("mask", mask))}

    def unmeasured_reason(self, name: str, trainer: pl.Trainer) -> str:
        if self.probe is None:
            return (
                "no training batch was a dict with 'x' (b, T, I) and 'y' tensors (the batch of "
                "lightning_ortho.models.OnlineRNNModule), so there is no probe sequence"
            )
        return super().unmeasured_reason(name, trainer)

    def measure(self, name: str, module: nn.Module, probe: torch.Tensor | None) -> dict[str, Measurement]:
        if self.probe is None:
            return {}
        cell, readout, estimator, loss = online_parts(module)
        p = self.probe
        self.last = measure_estimator(
            cell, readout, estimator, loss, p["x"], p["y"], p["mask"], self.draws, self.seed + len(self.history)
        )
        weight = float(p["x"].shape[0])
        # A deterministic estimator (one draw) has no variance: those statistics are not defined, nor a ratio to a
        # zero exact gradient (nan); weight 0 keeps the keys the same on every process.
        undefined = {"total_variance", "squared_bias_se", "relative_variance"} if self.last.draws < 2 else set()
        return {
            key: Measurement(value, "mean", 0.0 if key in undefined or math.isnan(value) else weight)
            for key, value in self.last.statistics().items()
        }

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["probe"] = None if self.probe is None else {k: v.detach().cpu().clone() for k, v in self.probe.items()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.probe = state_dict.get("probe")
