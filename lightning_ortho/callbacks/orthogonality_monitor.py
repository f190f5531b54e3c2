"""How far "orthogonal" layers have drifted: ``||Q^T Q - I||`` for every orthogonal map a model has, and the
singular-value spread of :class:`~lightning_ortho.nn.SVDLinear`.

Orthogonal maps are found by capability, so the monitor works on models that never use this library:

* our maps (:class:`~lightning_ortho.nn.OrthogonalMap` subclasses with a dense ``matrix()``:
  :class:`~lightning_ortho.nn.HouseholderProduct`, :class:`~lightning_ortho.nn.ParametrizedOrthogonal`, and so
  the Householder 1x1 convolutions and the ``U``/``V`` maps of an ``SVDLinear`` built from them);
* every tensor under ``torch.nn.utils.parametrizations.orthogonal`` (the ``_Orthogonal`` parametrization) or ours,
  :func:`lightning_ortho.nn.orthogonal` (measured as the matrices it keeps orthogonal: a convolution kernel as
  ``(out, in * k)``, a recurrent weight gate by gate);
* every tensor under a geotorch ``orthogonal``/``grassmannian`` constraint (geotorch's ``SO``, ``Stiefel`` and
  ``Grassmannian`` parametrizations, recognised by class name and module, so geotorch is not imported here).

Auxiliary reflections (:class:`~lightning_ortho.nn.AuxiliaryReflection`) are not measured: ``f(x) = H(n(x)) x``
reflects each input by its own reflection, so it is orthogonal on every input by construction (``||f(x)|| = ||x||``
exactly) and there is no single matrix ``Q`` that could drift. Theorem 1's ``U = I - W`` is not one either: ``H(v)``
does not change when ``v`` is scaled, so every ``W = c (I - U)`` computes the same ``U x`` while ``I - W`` is then
not orthogonal. Their invertibility is :class:`InvertibilityMonitor`'s subject.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.monitors.base import Measurement, ModuleSpec, Monitor, Source
from lightning_ortho.nn import AuxiliaryReflection, OrthogonalMap, OrthogonalWeight, SVDLinear
from lightning_ortho.nn.capabilities import HasMatrix

#: geotorch parametrizations whose value is orthogonal (``geotorch.orthogonal`` registers ``Stiefel``, ``SO`` is the
#: square case, ``geotorch.grassmannian`` registers ``Grassmannian``, a ``Stiefel`` subclass).
GEOTORCH_ORTHOGONAL = frozenset({"SO", "Stiefel", "Grassmannian"})

_AUX_REASON = (
    "an AuxiliaryReflection f(x) = H(n(x)) x reflects every input by its own reflection, so it is orthogonal on each "
    "input by construction and has no single matrix Q whose drift could be measured (use InvertibilityMonitor or "
    "JacobianDeterminantMonitor for it)."
)


def is_orthogonal_parametrization(parametrization: nn.Module) -> bool:
    """Whether a ``torch.nn.utils.parametrize`` parametrization returns orthogonal matrices: PyTorch's
    ``parametrizations.orthogonal`` (``_Orthogonal``), ours (:func:`lightning_ortho.nn.orthogonal`) or geotorch's
    ``SO``/``Stiefel``/``Grassmannian``."""
    if isinstance(parametrization, OrthogonalWeight):
        return True
    cls = type(parametrization)
    if any(base.__name__ == "_Orthogonal" and base.__module__.startswith("torch.nn.utils") for base in cls.__mro__):
        return True  # (a subclass too: ParametrizedOrthogonal's guarded one)
    return any(
        base.__module__.split(".")[0] == "geotorch" and base.__name__ in GEOTORCH_ORTHOGONAL for base in cls.__mro__
    )


def orthogonal_tensors(module: nn.Module) -> dict[str, Callable[[], torch.Tensor]]:
    """``tensor name -> function returning Q`` for every parametrized tensor of ``module`` (its own, not its
    children's) whose parametrization chain makes it orthogonal.

    ``Q`` is the tensor after the last orthogonal parametrization of the chain: the tensor itself when that is the
    last one, otherwise the chain evaluated up to it (only for one-tensor originals; others are left out).
    """
    if not parametrize.is_parametrized(module):
        return {}
    found: dict[str, Callable[[], torch.Tensor]] = {}
    for tensor_name, chain in module.parametrizations.items():
        indices = [i for i, p in enumerate(chain) if is_orthogonal_parametrization(p)]
        if not indices:
            continue
        last = indices[-1]
        ours = chain[last] if isinstance(chain[last], OrthogonalWeight) else None
        if ours is not None and last == len(chain) - 1:  # its matrices: a kernel's (out, in * k), a gate's block
            found[tensor_name] = lambda name=tensor_name, ours=ours: ours.as_matrices(getattr(module, name))
        elif last == len(chain) - 1:
            found[tensor_name] = lambda name=tensor_name: getattr(module, name)
        elif hasattr(chain, "original"):
            found[tensor_name] = lambda chain=chain, last=last: _evaluate_chain(chain, last)
    return found


def _evaluate_chain(chain: nn.ModuleList, last: int) -> torch.Tensor:
    value = chain.original
    for parametrization in list(chain)[: last + 1]:
        value = parametrization(value)
    return value


def orthogonality_errors(q: torch.Tensor) -> tuple[float, float]:
    """``(||G - I||_F, ||G - I||_2)`` for the smaller Gram matrix ``G`` of ``q`` (``Q^T Q`` for a tall or square
    ``(n, k)`` ``Q``, ``Q Q^T`` for a wide one), computed in float64. A batch ``(..., n, k)`` gives the largest error
    over its matrices; a complex ``Q`` gives ``Q^H Q``. The spectral norm is ``max_i |sigma_i(Q)^2 - 1|``."""
    q = q.detach()
    dtype = torch.float32 if q.device.type == "mps" else torch.float64
    if q.is_complex():  # unitary: Q^H Q
        dtype = torch.complex64 if dtype == torch.float32 else torch.complex128
    q = q.to(dtype).reshape(-1, *q.shape[-2:])
    gram = q.mH @ q if q.shape[-2] >= q.shape[-1] else q @ q.mH
    defect = gram - torch.eye(gram.shape[-1], dtype=dtype, device=q.device)
    frobenius = torch.linalg.matrix_norm(defect).max()
    spectral = torch.linalg.eigvalsh(0.5 * (defect + defect.mH)).abs().amax()
    return float(frobenius), float(spectral)


def plain_weight(module: nn.Module) -> torch.Tensor | None:
    """The ``weight`` of ``module`` as a matrix ``(out, rest)`` (flattened like ``torch.nn.init.orthogonal_``), or
    ``None`` when it has no tensor ``weight`` of at least two dimensions."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        return None
    return weight.reshape(weight.shape[0], -1)


class OrthogonalityMonitor(Monitor):
    """Log ``||Q^T Q - I||`` of every orthogonal map of the model and the singular-value spread of ``SVDLinear``.

    Logged keys, every ``every_n_steps`` optimizer steps and at the end of fit (see ``every_n_steps``):

    * an orthogonal map of ours (``HouseholderProduct``, ``ParametrizedOrthogonal``; see the module docstring):
      ``orthogonality/<module>/orthogonality_fro`` and ``.../orthogonality_spectral``, ``||Q^T Q - I||`` in the Frobenius
      and spectral norms for its dense ``matrix()`` ``Q`` (``(d, d)``);
    * a tensor under PyTorch's ``parametrizations.orthogonal`` or a geotorch orthogonal constraint:
      ``orthogonality/<module>/<tensor>/orthogonality_fro`` and ``.../orthogonality_spectral`` for ``Q`` the parametrized
      tensor, ``(n, k)`` or a batch ``(..., n, k)`` (the largest error of the batch). For ``n != k`` the smaller Gram
      matrix is used (``Q^T Q`` for ``n > k``, ``Q Q^T`` for ``n < k``): zero iff the columns (rows) are orthonormal;
    * ``SVDLinear``: ``orthogonality/<module>/singular_value_min``, ``..._max`` and ``..._ratio`` (max/min) of
      ``|singular_values|``, the singular values of ``Sigma`` (``inf`` ratio when one is zero).

    A module named in ``modules`` (or matched by a class there) that is none of these but has a ``weight`` of two or
    more dimensions (a plain ``nn.Linear`` trained with an orthogonality penalty, say) is measured as
    ``orthogonality/<module>/weight/orthogonality_*`` with ``Q = weight.reshape(out, -1)``. Such modules are never picked
    automatically. Auxiliary reflections are never measured (see the module docstring).

    The parameters are the same on every process, so the reductions across processes (``"max"``, ``"min"``) change
    nothing; no probe batch is needed. Matrices are measured in float64 (an ``O(d^3)`` eigenvalue problem each):
    raise ``every_n_steps`` for very wide layers.

    Args:
        modules: ``None`` (every orthogonal map and ``SVDLinear`` found), or names and/or classes of submodules.
        every_n_steps: measure at the end of the first training batch at or past each multiple of
            ``every_n_steps`` optimizer steps, and of the last batch of fit (the rule of every monitor:
            :class:`~lightning_ortho.callbacks.monitors.base.Monitor`).
        plot: at the end of fit, write ``<Class>.png`` of the history into the first logger's directory (needs
            matplotlib: ``pip install "lightning-ortho[plots]"``).
        prog_bar: also show the logged values in the progress bar.
        verbose: print a table of each statistic's last, smallest and largest value at the end of fit.
        source: ``"user"`` (constructed in code or a config) or ``"environment"`` (by the environment switch of
            :mod:`~lightning_ortho.callbacks.factory`), as in :class:`~lightning_ortho.callbacks.monitors.base.Monitor`.

    Raises:
        ValueError: bad arguments; at setup, no orthogonal map or ``SVDLinear`` in the model, or a named module
            that does not exist or cannot be measured (an ``AuxiliaryReflection``, or a module with no matrix).
    """

    prefix = "orthogonality"

    def __init__(
        self,
        modules: ModuleSpec | None = None,
        every_n_steps: int = 50,
        plot: bool = False,
        *,
        prog_bar: bool = False,
        verbose: bool = True,
        source: Source = "user",
    ) -> None:
        super().__init__(modules, every_n_steps, 1, plot, prog_bar=prog_bar, verbose=verbose, source=source)

    def needs_probe(self) -> bool:
        return False

    # ------------------------------------------------------------------------------------------- selection
    @staticmethod
    def _kind(module: nn.Module) -> str | None:
        """``"svd"``, ``"map"`` (our map with a matrix), ``"parametrized"`` (orthogonal parametrizations) or
        ``None`` for a module that is found automatically."""
        if isinstance(module, SVDLinear):
            return "svd"
        if isinstance(module, OrthogonalMap):
            return "map" if isinstance(module, HasMatrix) else None
        if orthogonal_tensors(module):
            return "parametrized"
        return None

    def candidates(self, pl_module: pl.LightningModule) -> Iterable[tuple[str, nn.Module]]:
        covered: list[str] = []  # our maps: a parametrized submodule inside one is the same Q, reported once
        for name, module in pl_module.named_modules():
            if any(name.startswith(prefix + ".") for prefix in covered):
                continue
            kind = self._kind(module)
            if kind == "map":
                covered.append(name)
            if kind is not None:
                yield name, module

    def can_measure(self, module: nn.Module) -> str | None:
        if isinstance(module, AuxiliaryReflection):
            return _AUX_REASON
        if self._kind(module) is not None:
            return None
        if isinstance(module, OrthogonalMap):
            return f"{type(module).__name__} is an OrthogonalMap without a dense matrix() to measure."
        if plain_weight(module) is None:
            return (
                f"{type(module).__name__} is not an orthogonal map (ours, torch.nn.utils.parametrizations.orthogonal "
                "or geotorch), not an SVDLinear, and has no weight matrix to measure."
            )
        return None

    def select(self, pl_module: pl.LightningModule) -> dict[str, nn.Module]:
        try:
            return super().select(pl_module)
        except ValueError as error:
            auxiliary = [n for n, m in pl_module.named_modules() if isinstance(m, AuxiliaryReflection)]
            if self.modules is not None or not auxiliary:
                raise
            raise ValueError(
                f"{error} It has {len(auxiliary)} AuxiliaryReflection layer(s) ({', '.join(auxiliary[:3])}"
                f"{', ...' if len(auxiliary) > 3 else ''}), which are not measured: {_AUX_REASON}"
            ) from None

    # ------------------------------------------------------------------------------------------- measuring
    @torch.no_grad()
    def measure(self, name: str, module: nn.Module, probe: torch.Tensor | None) -> dict[str, Measurement]:
        kind = self._kind(module)
        if kind == "svd":
            return self._singular_values(module)
        if kind == "map":
            return self._errors("", module.matrix())
        if kind == "parametrized":
            out: dict[str, Measurement] = {}
            for tensor_name, value in orthogonal_tensors(module).items():
                out.update(self._errors(tensor_name + "/", value()))
            return out
        return self._errors("weight/", plain_weight(module))

    @staticmethod
    def _errors(prefix: str, q: torch.Tensor) -> dict[str, Measurement]:
        frobenius, spectral = orthogonality_errors(q)
        return {
            f"{prefix}orthogonality_fro": Measurement(frobenius, "max"),
            f"{prefix}orthogonality_spectral": Measurement(spectral, "max"),
        }

    @staticmethod
    def _singular_values(module: SVDLinear) -> dict[str, Measurement]:
        values = module.singular_values.detach().abs().to(torch.float64)
        low, high = float(values.min()), float(values.max())
        ratio = high / low if low > 0 else math.inf
        return {
            "singular_value_min": Measurement(low, "min"),
            "singular_value_max": Measurement(high, "max"),
            "singular_value_ratio": Measurement(ratio, "max"),
        }
