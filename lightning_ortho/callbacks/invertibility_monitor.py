"""Logs whether chosen modules still invert on a fixed probe batch, while training, and warns once when not."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.jacobian_monitor import is_flow_output, module_device
from lightning_ortho.callbacks.monitors.base import Measurement, ModuleSpec, Monitor, Source, outermost_modules
from lightning_ortho.nn.capabilities import (
    HasInverse,
    HasInverseWithResult,
    HasInvertibilityMargin,
    HasNewtonInverse,
    Reconstructs,
)
from lightning_ortho.nn.newton import NewtonInverseError

#: Statistics that say invertibility was lost, and the test that says so.
_LOST = {
    "roundtrip_error_max": lambda value, tolerance: not value <= tolerance,  # nan counts as lost
    "newton_failures": lambda value, tolerance: value > 0,
    "theorem2_margin": lambda value, tolerance: not value > 0,
}


def has_inverse(module: nn.Module) -> bool:
    """``inverse(y)``, ``newton_inverse(y)`` (an auxiliary reflection) or ``reconstruct(x)`` (a Glow): the
    protocols of :mod:`lightning_ortho.nn.capabilities`."""
    return isinstance(module, HasInverse | HasNewtonInverse | Reconstructs)


def _reconstructs_only(module: nn.Module) -> bool:
    """A Glow: ``reconstruct(x)`` and no ``inverse``."""
    return isinstance(module, Reconstructs) and not isinstance(module, HasInverse)


def newton_inside(module: nn.Module) -> bool:
    """Whether ``module`` or a submodule inverts by Newton's method (can raise ``NewtonInverseError``)."""
    return any(isinstance(m, HasNewtonInverse) for m in module.modules())


def constrained_layers(module: nn.Module) -> list[nn.Module]:
    """The outermost submodules (``module`` included) with a Theorem-2 ``invertibility_margin()`` whose
    invertibility is a constraint (no ``invertible`` attribute, or ``invertible=True``): an unconstrained
    auxiliary reflection's margin says nothing about its invertibility, so it is left out."""
    found: list[str] = []
    layers = []
    for name, layer in module.named_modules():
        if any(name.startswith(outer + ".") or not outer for outer in found):
            continue
        if isinstance(layer, HasInvertibilityMargin) and getattr(layer, "invertible", True) is not False:
            found.append(name)
            layers.append(layer)
    return layers


def roundtrip_errors(x: torch.Tensor, x_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(relative, absolute)``: per row ``||x_hat - x|| / ||x||`` (2-norm over each row's entries; the absolute
    ``||x_hat||`` for a zero row), and ``max |x_hat - x|`` over all entries. ``inf`` where ``x_hat`` is not finite."""
    x, x_hat = x.to(torch.float64).reshape(x.shape[0], -1), x_hat.to(torch.float64).reshape(x.shape[0], -1)
    difference = torch.nan_to_num(x_hat - x, nan=math.inf, posinf=math.inf, neginf=math.inf)
    norms = torch.linalg.vector_norm(x, dim=1)
    errors = torch.linalg.vector_norm(difference, dim=1) / torch.where(norms > 0, norms, 1.0)
    return errors, difference.abs().max() if difference.numel() else torch.zeros((), dtype=torch.float64)


class InvertibilityMonitor(Monitor):
    """Logs how well chosen modules invert on a fixed probe batch, while training; warns once when they stop.

    For each watched module ``f``, every ``every_n_steps`` optimizer steps, on its probe ``x`` (the first
    ``probe_size`` rows of its first input in a training step; a named module in any mode, such as a frozen flow,
    an automatically chosen one while it trains), in eval mode and without gradients, it computes
    ``x_hat = f^{-1}(f(x))`` and logs ``invertibility/<module>/<statistic>``:

    * ``roundtrip_error_max`` (max over rows and processes), ``roundtrip_error_mean`` (mean, processes weighted by
      rows): the relative error ``||x_hat - x|| / ||x||`` of each probe row (2-norm over the row's entries, e.g.
      a whole image; the absolute ``||x_hat||`` for an all-zero row). ``inf`` where the inverse failed.
    * ``roundtrip_abs_error_max``: ``max |x_hat - x|`` over all entries (what ``GlowInvertibilityCheck`` logs as
      ``val_reconstruction_error``).
    * ``newton_iterations_mean`` (mean over Newton solves), ``newton_iterations_max``, ``newton_failures`` (sum):
      where the module reports its Newton solves (``newton_inverse(y)`` of an
      :class:`~lightning_ortho.nn.AuxiliaryReflection`, ``inverse_with_result`` of our auxiliary 1x1
      convolutions; one solve per row or per pixel; not logged where no solve reported, e.g. the inverse raised
      first). A module that only contains Newton inverses (a
      :class:`~lightning_ortho.flows.Glow`, a flow sequence) logs ``newton_failures``: the solves that failed in
      the first layer whose :class:`~lightning_ortho.nn.NewtonInverseError` stopped the inverse.
    * ``theorem2_margin`` (min): the smallest ``3/2 lambda_min(W) - lambda_max(W)`` of the Theorem-2 layers in
      the module (``invertibility_margin()`` of ``AuxiliaryReflection(invertible=True)``, ``aux_invertible``
      1x1 convolutions); positive means provably invertible. Logged where the module has such layers.

    How the inverse is found, by the first thing the module has: ``reconstruct(x)`` (and no ``inverse``: a Glow,
    ``decode(encode(x))``); ``newton_inverse(f(x))`` (an auxiliary reflection: a constrained one is inverted
    exactly as ``inverse`` does; an unconstrained one as with ``allow_non_unique=True``, accepting the preimage
    Newton finds, so a different preimage shows as a large round-trip error instead of an exception);
    ``inverse_with_result(f(x), raise_on_failure=False)``; ``inverse(f(x))``. ``f(x)`` is the forward's output,
    or its first element for a flow layer's ``(y, log_abs_det)``. An exception of the inverse counts as lost
    invertibility (``inf``, with the warning naming it), never as a crash.

    Invertibility is lost when ``roundtrip_error_max > tolerance``, a Newton solve failed, or the Theorem-2
    margin is ``<= 0``; the first time for each module a warning (rank zero) names the module, the step and the
    numbers.

    Which modules (``modules``): ``None`` watches the outermost modules with an inverse (``inverse``,
    ``newton_inverse`` or ``reconstruct``) whose forward returns a tensor or ``(y, log_abs_det)``; a module
    whose first forward returns anything else is skipped (a multi-scale split). Name a flow's layers to watch
    them one by one.

    Args:
        modules: which submodules to watch: ``None`` (chosen automatically, see above), or a list of names
            (``"encoder.0"``) and/or module classes (see :class:`~lightning_ortho.callbacks.monitors.base.Monitor`).
        every_n_steps: measure at the end of the first training batch at or past each multiple of
            ``every_n_steps`` optimizer steps, and of the last batch of fit.
        probe_size: rows of the probe batch (the first rows of each module's first input in a training step).
        tolerance: largest relative round-trip error that counts as invertible (``1e-4`` suits float32).
        plot: at the end of fit, write ``<Class>.png`` of the history into the first logger's directory (needs
            matplotlib: ``pip install "lightning-ortho[plots]"``).
        prog_bar: also show the logged values in the progress bar.
        verbose: print a table of each statistic's last, smallest and largest value at the end of fit.
        source: ``"user"`` (constructed in code or a config) or ``"environment"`` (by the environment switch of
            :mod:`~lightning_ortho.callbacks.factory`), as in :class:`~lightning_ortho.callbacks.monitors.base.Monitor`.

    Raises:
        ValueError: bad arguments (in ``__init__``); at setup, no module with an inverse, a name that does not
            exist, or a named or typed module without any inverse; a named module whose forward returns neither a
            tensor nor ``(y, log_abs_det)``, on its first forward (before the first optimizer step).
    """

    prefix = "invertibility"

    def __init__(
        self,
        modules: ModuleSpec | None = None,
        every_n_steps: int = 50,
        probe_size: int = 8,
        tolerance: float = 1e-4,
        plot: bool = False,
        *,
        prog_bar: bool = False,
        verbose: bool = True,
        source: Source = "user",
    ) -> None:
        super().__init__(modules, every_n_steps, probe_size, plot, prog_bar=prog_bar, verbose=verbose, source=source)
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 < tolerance < math.inf:
            raise ValueError(
                f"{type(self).__name__}: tolerance must be a positive finite number (the largest relative round-trip "
                f"error that counts as invertible, e.g. 1e-4 in float32), got {tolerance!r}."
            )
        self.tolerance = float(tolerance)
        #: module name -> the last exception its inverse raised (other than a Newton failure), for the warning.
        self.errors: dict[str, str] = {}

    # ------------------------------------------------------------------------------------------- subclass API
    def candidates(self, pl_module: pl.LightningModule) -> Iterable[tuple[str, nn.Module]]:
        # Auto-selection skips layers that declare themselves not invertible (an unconstrained auxiliary
        # reflection, invertible=False: its Newton inverse may fail by design, which would cost 50 iterations and
        # warn on every model that merely uses such layers); name them to watch them anyway.
        return outermost_modules(pl_module, lambda m: has_inverse(m) and getattr(m, "invertible", True) is not False)

    def can_measure(self, module: nn.Module) -> str | None:
        if has_inverse(module):
            return None
        return (
            f"{type(module).__name__} has no inverse: {type(self).__name__} needs a module with inverse(y) (or "
            "newton_inverse(y), or reconstruct(x)). Watch the invertible layers inside it, or remove it from modules."
        )

    def measure(self, name: str, module: nn.Module, probe: torch.Tensor | None) -> dict[str, Measurement]:
        device = module_device(module)
        x = probe if device is None else probe.to(device)
        with torch.no_grad():
            x_hat, result, failures = self._roundtrip(name, module, x)
            margins = _margins(module)
        errors, abs_error = roundtrip_errors(x, x_hat) if x_hat is not None else (None, None)
        if errors is None:
            errors = torch.full((x.shape[0],), math.inf, dtype=torch.float64)
            abs_error = torch.tensor(math.inf)
        values = {
            "roundtrip_error_max": Measurement(float(errors.max()), "max"),
            "roundtrip_error_mean": Measurement(float(errors.mean()), "mean", float(x.shape[0])),
            "roundtrip_abs_error_max": Measurement(float(abs_error), "max"),
        }
        if _reports_newton(module):
            iterations = None if result is None else result.iterations.to(torch.float64)
            if iterations is not None and iterations.numel():
                values["newton_iterations_mean"] = Measurement(
                    float(iterations.mean()), "mean", float(iterations.numel())
                )
                values["newton_iterations_max"] = Measurement(float(iterations.max()), "max")
            else:  # the inverse raised before reporting: the same keys on every process, without a value here
                values["newton_iterations_mean"] = Measurement(math.nan, "mean", 0.0)
                values["newton_iterations_max"] = Measurement(math.nan, "max", 0.0)
        if _reports_newton(module) or newton_inside(module):
            values["newton_failures"] = Measurement(float(failures), "sum")
        if margins:
            values["theorem2_margin"] = Measurement(min(margins), "min")
        return values

    def _roundtrip(self, name: str, module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor | None, Any, int]:
        """``(x_hat, newton_result or None, failed Newton solves)``; ``x_hat`` is ``None`` where the inverse raised."""
        try:
            with warnings.catch_warnings():  # the 'aux' 1x1 convolution's note on non-unique inverses: we check
                warnings.filterwarnings("ignore", message=re.escape("AuxConv1x1 (kind='aux') is not provably"))
                if _reconstructs_only(module):
                    return module.reconstruct(x), None, 0
                y = module(x)
                y = y[0] if isinstance(y, tuple | list) else y
                if isinstance(module, HasNewtonInverse):
                    result = module.newton_inverse(y)
                    return result.x, result, int((~result.converged).sum())
                if isinstance(module, HasInverseWithResult):
                    x_hat, result = module.inverse_with_result(y, raise_on_failure=False)
                    return x_hat, result, 0 if result is None else int((~result.converged).sum())
                return module.inverse(y), None, 0
        except NewtonInverseError as error:
            return None, None, int((~error.result.converged).sum())
        except Exception as error:  # noqa: BLE001 - a failed inverse is what this monitor reports, not a crash
            self.errors[name] = f"{type(error).__name__}: {error}"
            return None, None, 0

    # ----------------------------------------------------------------------------------------- the warning
    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, log_step: int | None = None) -> dict[str, float]:
        logged = super().run(trainer, pl_module, log_step)
        for name in self._watched:
            prefix = f"{self.prefix}/{name}/" if name else f"{self.prefix}/"
            lost = {
                statistic: logged[prefix + statistic]
                for statistic, test in _LOST.items()
                if prefix + statistic in logged and test(logged[prefix + statistic], self.tolerance)
            }
            if lost and trainer.is_global_zero:
                numbers = ", ".join(f"{statistic} = {value:.3g}" for statistic, value in lost.items())
                cause = f" The inverse raised {self.errors[name]}." if name in self.errors else ""
                self._warn_once(
                    name,
                    f"{type(self).__name__}: {name!r} is no longer invertible on its probe at step {trainer.global_step}"
                    f" ({numbers}; tolerance {self.tolerance:g}).{cause} Further losses of this module are logged, not "
                    "warned about.",
                )
        return logged

    # ---------------------------------------------------------------------------------- checks and choosing
    def first_forward_problem(self, name: str, module: nn.Module, args: tuple, output: object) -> str | None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return f"its first input is a {type(x).__name__}, not a batch tensor."
        if not _reconstructs_only(module) and not (isinstance(output, torch.Tensor) or is_flow_output(x, output)):
            return (
                f"its forward returns a {type(output).__name__}, neither a tensor nor (y, log_abs_det), so "
                "f^{-1}(f(x)) is not defined for it."
            )
        return None


def _margins(module: nn.Module) -> list[float]:
    margins = []
    for layer in constrained_layers(module):
        try:
            margins.append(float(layer.invertibility_margin()))
        except ValueError:  # Theorem 2 does not apply to this layer (a non-symmetric W): no margin
            continue
    return margins


def _reports_newton(module: nn.Module) -> bool:
    """Whether the module's own inverse reports per-solve Newton results (not only exceptions)."""
    if _reconstructs_only(module):
        return False
    if isinstance(module, HasNewtonInverse):
        return True
    return isinstance(module, HasInverseWithResult) and newton_inside(module)
