"""Lightning callbacks for any project: monitors of Jacobian determinants, invertibility, gradient noise and
orthogonality, layer compression, and the Glow callbacks.

Imported lazily: Lightning imports this package on every ``Trainer`` through the ``callbacks_factory`` entry point
(:mod:`lightning_ortho.callbacks.factory`), so importing it costs nothing until a callback is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULE = {
    "EstimatorVariance": "gradient_variance",
    "GlowImageGrids": "glow_images",
    "GlowInvertibilityCheck": "glow_invertibility",
    "GradientNoiseMonitor": "gradient_variance",
    "GradientVarianceMonitor": "gradient_variance",
    "InvertibilityMonitor": "invertibility_monitor",
    "JacobianDeterminantMonitor": "jacobian_monitor",
    "Measurement": "_monitor",
    "Monitor": "_monitor",
    "OnlineEstimatorVarianceMonitor": "gradient_variance",
    "OrthogonalityMonitor": "orthogonality_monitor",
    "TransformCompression": "transform_compression",
    "measure_estimator": "gradient_variance",
}

__all__ = sorted(_SUBMODULE)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULE:
        value = getattr(importlib.import_module(f"{__name__}.{_SUBMODULE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
