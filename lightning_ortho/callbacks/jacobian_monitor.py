"""Logs the distribution of ``log|det J|`` of chosen modules on a fixed probe batch, while training."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.monitors.base import (
    Measurement,
    ModuleSpec,
    Monitor,
    Source,
    _check_positive_int,
    outermost_modules,
)
from lightning_ortho.flows import FlowLayer
from lightning_ortho.nn.capabilities import (
    HasDenseJacobian,
    HasInverse,
    HasJacobianSigns,
    HasLogAbsDetJacobian,
    jacobian_sign_is_fixed,
    log_abs_det_is_zero,
)

#: How ``log|det J|`` is found for a module (in :attr:`JacobianDeterminantMonitor.methods` and the end-of-fit notes).
METHODS = ("closed_form", "flow", "autograd")


def closed_form(module: nn.Module) -> Any:
    """The module's ``log_abs_det_jacobian`` method (:class:`~lightning_ortho.nn.HasLogAbsDetJacobian`), or
    ``None``."""
    return module.log_abs_det_jacobian if isinstance(module, HasLogAbsDetJacobian) else None


def maybe_flow(module: nn.Module) -> bool:
    """Whether ``module`` may be a flow layer (``forward(x) -> (y, log_abs_det)``): ours, or anything with an
    ``inverse`` (:class:`~lightning_ortho.nn.HasInverse`). Confirmed on its first forward."""
    return isinstance(module, FlowLayer | HasInverse)


def is_flow_output(x: torch.Tensor, output: object) -> bool:
    """``output`` is ``(y, log_abs_det)`` for the batch ``x``: ``y`` with ``x``'s entries per sample, one
    log-determinant per sample."""
    return (
        isinstance(output, tuple | list)
        and len(output) == 2
        and all(isinstance(t, torch.Tensor) for t in output)
        and output[0].dim() > 0
        and output[0].shape[0] == x.shape[0]
        and output[0][:1].numel() == x[:1].numel()
        and output[1].numel() == x.shape[0]
    )


def per_sample(value: torch.Tensor, batch: int) -> torch.Tensor:
    """``(batch,)``: a log-determinant summed over everything but the batch dimension (a scalar is every sample's)."""
    if value.dim() == 0:
        return value.expand(batch)
    return value.reshape(batch, -1).sum(1)


def _takes_output(method: Any) -> bool:
    """Whether ``log_abs_det_jacobian`` wants ``(x, y)`` (torch.distributions / Pyro) rather than ``(x)``."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional and p.default is inspect.Parameter.empty for p in parameters) >= 2


def _first_tensor(output: object) -> torch.Tensor:
    return output[0] if isinstance(output, tuple | list) else output


def module_device(module: nn.Module) -> torch.device | None:
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    return None if tensor is None else tensor.device


def autograd_jacobians(module: nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``(B, d, d)``: the Jacobian of ``sample -> module(sample[None])`` (first output, flattened) at each row of
    ``x`` (``d`` entries per sample), with the module's parameters and buffers detached and cast to ``dtype``
    (``None``: as they are). ``torch.func.vmap(jacrev)``; a loop of ``torch.autograd.functional.jacobian`` where the
    module cannot be vmapped (data-dependent Python control flow)."""
    cast = (lambda t: t.detach().to(dtype) if t.is_floating_point() else t.detach()) if dtype else torch.Tensor.detach
    tensors = {name: cast(t) for name, t in (*module.named_parameters(), *module.named_buffers())}
    rows = x.detach().to(dtype) if dtype else x.detach()
    d = rows[:1].numel()

    def function(sample: torch.Tensor) -> torch.Tensor:
        return _first_tensor(torch.func.functional_call(module, tensors, (sample.unsqueeze(0),))).reshape(-1)

    with torch.enable_grad():
        try:
            jacobians = torch.func.vmap(torch.func.jacrev(function))(rows)
        except Exception:  # noqa: BLE001 - any module vmap cannot trace: fall back to one row at a time
            jacobians = torch.stack([torch.autograd.functional.jacobian(function, row) for row in rows])
    return jacobians.reshape(rows.shape[0], d, d)


_SIGN_WORDS = {
    "jacobian": "the module's analytic jacobian(x)",
    "pixel_signs": "its per-pixel jacobian_signs(x)",
    "slogdet": "slogdet of the autograd Jacobian",
    "unknown": "nowhere (unknown: negative_fraction is not logged)",
    "fixed": "nowhere: fixed by construction (the layer declares jacobian_sign_is_fixed), so negative_fraction is "
    "not logged",
}
#: The statistics a layer's declarations make constant by construction (not logged; said in the notes instead).
_SIGN_KEYS = ("negative_fraction", "pixel_negative_fraction")
_LOG_DET_KEYS = ("log_abs_det_mean", "log_abs_det_min", "log_abs_det_max")

#: Up to this dimension a module's analytic ``jacobian(x)`` plus ``slogdet`` replaces its ``log_abs_det_jacobian``
#: (cheaper there, and it gives the sign too).
_DENSE_JACOBIAN_DIM = 128


class JacobianDeterminantMonitor(Monitor):
    """Logs the distribution of ``log|det J|`` over a fixed probe batch for chosen modules, while training.

    For each watched module, every ``every_n_steps`` optimizer steps, on its probe (the first ``probe_size`` rows
    of its first input in a training step: for a named module in any mode, such as a frozen flow, for an
    automatically chosen one while it trains; one sample per row, so for a flow layer on images ``(N, C, H, W)`` a
    row is an image and ``J`` is the ``C H W x C H W`` Jacobian), it logs ``jacobian/<module>/<statistic>``:

    * ``log_abs_det_mean`` (mean over probe rows, processes weighted by rows), ``log_abs_det_min``,
      ``log_abs_det_max``: the distribution of ``log|det J|`` per row.
    * ``negative_fraction``: the fraction of rows whose ``det J`` is not positive (a zero determinant counts with
      the negatives); not logged where the sign is unknown (see :attr:`sign_sources`).
    * ``pixel_negative_fraction`` (modules with ``jacobian_signs``, such as our 1x1 convolutions): the fraction
      of pixels whose per-pixel ``det J_g`` is not positive. Strictly between 0 and 1 means the sign changes
      between pixels: the determinant vanishes there and the layer is not invertible on this data (Theorem 4);
      ``min(p, 1 - p)`` is :meth:`Invertible1x1Conv.jacobian_sign_flips`.

    A statistic that is constant by construction is not logged (the end-of-fit notes say so): the sign fractions
    of a layer that declares ``jacobian_sign_is_fixed`` (our LU and Householder 1x1 convolutions,
    ``AuxiliaryReflection(invertible=True)``: Theorem 2), and ``log_abs_det_*`` of one that declares
    ``log_abs_det_is_zero`` (the Householder 1x1 convolution, a squeeze); see
    :mod:`lightning_ortho.nn.capabilities`. A layer with both has nothing to log and is not measured.
    How ``log|det J|`` is found for a module (:attr:`methods`, by name; said under the end-of-fit table with the
    source of the sign, not logged: it does not change while training):

      - ``closed_form``: the module's ``log_abs_det_jacobian(x)`` (ours, e.g. Lemma 1 of
        :class:`~lightning_ortho.nn.AuxiliaryReflection`; a two-argument ``log_abs_det_jacobian(x, y)`` as in
        ``torch.distributions`` / Pyro gets ``y = module(x)``). Sign from the module's analytic ``jacobian(x)``
        (Theorem 3 for ours) when its last dimension is at most ``max_autograd_dim``, else unknown.
      - ``flow``: the ``log_abs_det`` that the module's ``forward(x) -> (y, log_abs_det)`` returns (our flow
        layers, a user's coupling layer). Sign from ``jacobian_signs(x)`` where the module has it (our 1x1
        convolutions: the product of the per-pixel signs), else unknown.
      - ``autograd``: ``torch.linalg.slogdet`` of the Jacobian of the module at each probe row
        (``torch.func.vmap(jacrev)``, on a float64 copy of the parameters and probe where the module runs in
        float64), for a module mapping ``R^d -> R^d`` with neither of the above; needs ``d <= max_autograd_dim``.

    Which modules (``modules``): ``None`` watches the outermost modules that have ``log_abs_det_jacobian`` or
    look like a flow layer (a :class:`~lightning_ortho.flows.FlowLayer`, or any module with ``inverse``; one whose
    first forward does not return ``(y, log_abs_det)`` is skipped). Names and classes (or class paths in a config)
    may also pick any module that maps ``R^d -> R^d`` (per sample), measured by autograd.

    Args:
        modules: which submodules to watch: ``None`` (chosen automatically, see above), or a list of names
            (``"encoder.0"``) and/or module classes (see :class:`~lightning_ortho.callbacks.monitors.base.Monitor`).
        every_n_steps: measure at the end of the first training batch at or past each multiple of
            ``every_n_steps`` optimizer steps, and of the last batch of fit.
        probe_size: rows of the probe batch (the first rows of each module's first input in a training step).
        max_autograd_dim: largest ``d`` measured by autograd (``d`` backward passes and an O(d^3) determinant per
            probe row), and largest last dimension whose analytic Jacobian is built for the sign.
        plot: at the end of fit, write ``<Class>.png`` of the history into the first logger's directory (needs
            matplotlib: ``pip install "lightning-ortho[plots]"``).
        prog_bar: also show the logged values in the progress bar.
        verbose: print a table of each statistic's last, smallest and largest value at the end of fit.
        source: ``"user"`` (constructed in code or a config) or ``"environment"`` (by the environment switch of
            :mod:`~lightning_ortho.callbacks.factory`), as in :class:`~lightning_ortho.callbacks.monitors.base.Monitor`.

    Raises:
        ValueError: bad arguments (in ``__init__``). At setup: no module to measure, a name that does not exist,
            a named or typed module that is not square (an ``nn.Linear(m, n)`` with ``m != n``) or needs autograd
            with ``d > max_autograd_dim``; where that is known only from the module's first forward (a generic
            module), then, before the first optimizer step. An automatically chosen module that cannot be measured
            is skipped (with a warning when no module is left), never an error mid-training.
    """

    prefix = "jacobian"

    def __init__(
        self,
        modules: ModuleSpec | None = None,
        every_n_steps: int = 50,
        probe_size: int = 8,
        max_autograd_dim: int = 256,
        plot: bool = False,
        *,
        prog_bar: bool = False,
        verbose: bool = True,
        source: Source = "user",
    ) -> None:
        super().__init__(modules, every_n_steps, probe_size, plot, prog_bar=prog_bar, verbose=verbose, source=source)
        self.max_autograd_dim = _check_positive_int(max_autograd_dim, "max_autograd_dim", type(self).__name__)
        #: module name -> ``"closed_form"``, ``"flow"`` or ``"autograd"`` (known from the module's first forward).
        self.methods: dict[str, str] = {}
        #: module name -> where the sign of ``det J`` comes from: ``"jacobian"``, ``"pixel_signs"``, ``"slogdet"``
        #: ``"unknown"`` or ``"fixed"`` (then ``negative_fraction`` is not logged).
        self.sign_sources: dict[str, str] = {}
        #: Watched modules whose every statistic is constant by construction (see the declarations above).
        self.constant_only: set[str] = set()

    # ------------------------------------------------------------------------------------------- subclass API
    def candidates(self, pl_module: pl.LightningModule) -> Iterable[tuple[str, nn.Module]]:
        return outermost_modules(pl_module, lambda m: closed_form(m) is not None or maybe_flow(m))

    def can_measure(self, module: nn.Module) -> str | None:
        if closed_form(module) is not None or maybe_flow(module):
            return None
        if isinstance(module, nn.Linear):
            return self._autograd_problem(module.in_features, module.out_features)
        return None  # a generic module: checked on its first forward

    def measure(self, name: str, module: nn.Module, probe: torch.Tensor | None) -> dict[str, Measurement]:
        sign_fixed, zero = jacobian_sign_is_fixed(module), log_abs_det_is_zero(module)
        if zero and (sign_fixed or not isinstance(module, HasJacobianSigns | HasDenseJacobian)):
            self.constant_only.add(name)  # nothing it could log changes: not measured at all
            self.sign_sources[name] = "fixed" if sign_fixed else "unknown"
            return {}
        device = module_device(module)
        x = probe if device is None else probe.to(device)
        method = self.methods.get(name)
        if method is None:  # not seen in training yet (a direct call): classify from a forward on the probe
            with torch.no_grad():
                method, reason = self._classify(module, x, module(x))
            if method is None:
                self._warn_once(name, f"{type(self).__name__}: cannot measure {name!r}: {reason}")
                return {}
            self.methods[name] = method
        rows = x.shape[0]
        try:
            log_det, signs, pixel = getattr(self, f"_{method}")(name, module, x)
        except Exception as error:  # noqa: BLE001 - never crash training: report and log nan
            self._warn_once(name + "/error", f"{type(self).__name__}: {name!r} failed ({error!r}); logging nan.")
            log_det, signs = torch.full((rows,), math.nan, dtype=torch.float64), None
            flow_signs = method == "flow" and isinstance(module, HasJacobianSigns) and not sign_fixed
            pixel = (math.nan, 0.0) if flow_signs else None
        log_det = log_det.detach().to(torch.float64)
        values = {
            "log_abs_det_mean": Measurement(float(log_det.mean()), "mean", float(rows)),
            "log_abs_det_min": Measurement(float(log_det.min()), "min"),
            "log_abs_det_max": Measurement(float(log_det.max()), "max"),
        }
        if signs is not None or self._sign_possible(module, method, x):
            # The same keys on every process (the reductions must match): weight 0 where this one has no sign.
            negative = math.nan if signs is None else float((signs <= 0).double().mean())
            values["negative_fraction"] = Measurement(negative, "mean", 0.0 if signs is None else float(rows))
        if pixel is not None:
            values["pixel_negative_fraction"] = Measurement(pixel[0], "mean", pixel[1])
        for key in (_SIGN_KEYS if sign_fixed else ()) + (_LOG_DET_KEYS if zero else ()):
            values.pop(key, None)  # constant by construction: in the notes instead
        if not values:
            self.constant_only.add(name)
        return values

    def nothing_to_log(self, name: str) -> bool:
        return name in self.constant_only

    def notes(self) -> dict[str, str]:
        notes = {}
        for name in self._watched:
            method, module = self.methods.get(name), self._watched[name]
            if method is None and name not in self.constant_only:
                continue
            log_det = (
                "log|det J| = 0 by construction (the layer declares log_abs_det_is_zero: log_abs_det_* not logged)"
                if log_abs_det_is_zero(module)
                else f"log|det J| by {method}"
            )
            sign = _SIGN_WORDS.get(self.sign_sources.get(name, "unknown"), "nowhere (unknown)")
            notes[f"{self.prefix}/{name}" if name else self.prefix] = f"{log_det}, sign of det J from {sign}"
        return notes

    def _sign_possible(self, module: nn.Module, method: str, x: torch.Tensor) -> bool:
        """Whether the sign of ``det J`` can be known for ``module`` (the same on every process, unlike a failure)."""
        if jacobian_sign_is_fixed(module):
            return False
        if method == "autograd":
            return True
        if method == "flow":
            return isinstance(module, HasJacobianSigns)
        return isinstance(module, HasDenseJacobian) and x.shape[-1] <= max(self.max_autograd_dim, _DENSE_JACOBIAN_DIM)

    # ------------------------------------------------------------------------------------------ the methods
    def _closed_form(self, name: str, module: nn.Module, x: torch.Tensor) -> tuple:
        jacobian = module.jacobian if isinstance(module, HasDenseJacobian) else None
        d = x.shape[-1]
        with torch.no_grad():
            if jacobian is not None and d <= _DENSE_JACOBIAN_DIM:
                # Small d: the module's analytic Jacobian (Theorem 3 for an auxiliary reflection) and one slogdet
                # per row give log|det J| and its sign together, and are cheaper than the eigendecomposition
                # behind log_abs_det_jacobian.
                matrices = jacobian(x)
                if matrices.shape == (*x.shape, d):
                    sign, log_abs = torch.linalg.slogdet(matrices.to(torch.float64))
                    self.sign_sources[name] = "fixed" if jacobian_sign_is_fixed(module) else "jacobian"
                    return per_sample(log_abs, x.shape[0]), sign.reshape(x.shape[0], -1).prod(1), None
            method = closed_form(module)
            value = method(x, _first_tensor(module(x))) if _takes_output(method) else method(x)
            log_det = per_sample(value, x.shape[0])
            signs = None
            if jacobian is not None and d <= self.max_autograd_dim and not jacobian_sign_is_fixed(module):
                matrices = jacobian(x)
                if matrices.shape == (*x.shape, d):
                    signs = torch.sign(torch.linalg.det(matrices.to(torch.float64))).reshape(x.shape[0], -1).prod(1)
        fixed = jacobian_sign_is_fixed(module)
        self.sign_sources[name] = "fixed" if fixed else "unknown" if signs is None else "jacobian"
        return log_det, signs, None

    def _flow(self, name: str, module: nn.Module, x: torch.Tensor) -> tuple:
        with torch.no_grad():
            log_det = per_sample(module(x)[1], x.shape[0])
            pixel, signs = None, None
            fixed = jacobian_sign_is_fixed(module)
            if isinstance(module, HasJacobianSigns) and not fixed:
                pixel_signs = module.jacobian_signs(x).reshape(x.shape[0], -1)
                signs = pixel_signs.prod(1)
                pixel = (float((pixel_signs <= 0).double().mean()), float(pixel_signs.numel()))
        self.sign_sources[name] = "fixed" if fixed else "unknown" if signs is None else "pixel_signs"
        return log_det, signs, pixel

    def _autograd(self, name: str, module: nn.Module, x: torch.Tensor) -> tuple:
        try:
            jacobians = autograd_jacobians(module, x, torch.float64)
        except (RuntimeError, TypeError, ValueError):  # a module that cannot run in float64: its own dtype
            jacobians = autograd_jacobians(module, x, None)
        signs, log_det = torch.linalg.slogdet(jacobians.to(torch.float64))
        self.sign_sources[name] = "fixed" if jacobian_sign_is_fixed(module) else "slogdet"
        return log_det, signs, None

    # ---------------------------------------------------------------------------------- checks and choosing
    def _autograd_problem(self, d_in: int, d_out: int) -> str | None:
        if d_in != d_out:
            return (
                f"it maps {d_in} to {d_out} entries per sample; a Jacobian determinant needs a map R^d -> R^d "
                "(or a flow layer returning (y, log_abs_det), or a log_abs_det_jacobian method)."
            )
        if d_in > self.max_autograd_dim:
            return (
                f"it has no log_abs_det_jacobian and is not a flow layer returning (y, log_abs_det), so its Jacobian "
                f"would come from autograd, and d = {d_in} > max_autograd_dim = {self.max_autograd_dim}. Raise "
                "max_autograd_dim (d backward passes and an O(d^3) determinant per probe row) or watch smaller modules."
            )
        return None

    def _classify(self, module: nn.Module, x: object, output: object) -> tuple[str | None, str]:
        """``(method, "")`` or ``(None, reason)`` from one forward ``output = module(x)``."""
        if closed_form(module) is not None:
            return "closed_form", ""
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return None, f"its first input is a {type(x).__name__}, not a batch tensor."
        if is_flow_output(x, output):
            return "flow", ""
        if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != x.shape[0]:
            what = type(output).__name__ if not isinstance(output, torch.Tensor) else f"shape {tuple(output.shape)}"
            return None, (
                f"its forward returns {what}, neither (y, log_abs_det) with one log-determinant per sample nor a "
                f"batch of the input's shape {tuple(x.shape)}."
            )
        problem = self._autograd_problem(x[:1].numel(), output[:1].numel())
        return (None, problem) if problem else ("autograd", "")

    def first_forward_problem(self, name: str, module: nn.Module, args: tuple, output: object) -> str | None:
        if name in self.methods:  # already classified (a resumed run)
            return None
        method, reason = self._classify(module, args[0] if args else None, output)
        if method == "autograd" and name not in self._explicit:
            return "its forward does not return (y, log_abs_det) (name it to measure it by autograd)."
        if method is None:
            return reason
        self.methods[name] = method
        return None
