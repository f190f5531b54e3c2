"""Lightning callbacks for any project: monitors of Jacobian determinants, invertibility, gradient noise and
orthogonality, layer compression, the Glow callbacks, and the writer of ``predict``'s outputs.

Imported lazily: Lightning imports this package on every ``Trainer`` through the ``callbacks_factory`` entry point
(:mod:`lightning_ortho.callbacks.factory`), so importing it costs nothing until a callback is used.
:func:`import_all` imports every callback module at once (the ``lightning-ortho`` command does, so that a short
name such as ``--trainer.callbacks+=OrthogonalityMonitor`` resolves).
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULE = {
    "EstimatorVariance": "online_estimator_variance",
    "GlowImageGrids": "glow_images",
    "GlowInvertibilityCheck": "glow_invertibility",
    "GradientNoiseMonitor": "gradient_noise",
    "InvertibilityMonitor": "invertibility_monitor",
    "JacobianDeterminantMonitor": "jacobian_monitor",
    "Measurement": "monitors.base",
    "Monitor": "monitors.base",
    "OnlineEstimatorVarianceMonitor": "online_estimator_variance",
    "OrthogonalityMonitor": "orthogonality_monitor",
    "PredictionWriter": "prediction_writer",
    "TransformCompression": "compression.transform_compression",
    "measure_estimator": "online_estimator_variance",
}

__all__ = sorted([*_SUBMODULE, "import_all"])

#: Deprecated names, still importable from here (each warns ``LightningOrthoDeprecationWarning`` when used; removed in the next
#: release): name -> its module.
_DEPRECATED = {"GradientVarianceMonitor": "gradient_variance"}


def import_all() -> list[type]:
    """Import every callback module; return the public callback classes (those of ``__all__``), sorted by name.

    jsonargparse (LightningCLI) resolves a short class name (``--trainer.callbacks+=OrthogonalityMonitor``) only
    among the subclasses of ``Callback`` that are already imported, which the lazy attributes of this package hide
    until first use; the ``lightning-ortho`` command calls this before it parses its arguments.
    """
    from lightning_ortho._lightning import Callback

    for module in _DEPRECATED.values():  # deprecated classes keep resolving by their short names too
        importlib.import_module(f"{__name__}.{module}")
    found = {getattr(importlib.import_module(f"{__name__}.{module}"), name) for name, module in _SUBMODULE.items()}
    return sorted((v for v in found if isinstance(v, type) and issubclass(v, Callback)), key=lambda v: v.__name__)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULE or name in _DEPRECATED:
        value = getattr(importlib.import_module(f"{__name__}.{_SUBMODULE.get(name) or _DEPRECATED[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
