"""How noisy the gradients are: :class:`GradientNoiseMonitor` for any model (the mini-batch gradient noise and
McCandlish et al.'s noise scale ``B_simple``, from the gradients training already computes) and
:class:`OnlineEstimatorVarianceMonitor` for models trained online (the total variance and bias of UORO or truncated
BPTT against the exact gradient, by repeated draws on a probe sequence)."""

import warnings
from typing import Any

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning
from lightning_ortho.callbacks.gradient_noise import GradientNoiseMonitor
from lightning_ortho.callbacks.online_estimator_variance import (
    EstimatorVariance,
    OnlineEstimatorVarianceMonitor,
    measure_estimator,
)


class GradientVarianceMonitor(GradientNoiseMonitor):
    """Deprecated name of :class:`GradientNoiseMonitor` (warns ``LightningOrthoDeprecationWarning``; removed in the next release).

    The same monitor, arguments and keys. A subclass rather than an alias so that old configs and command lines
    that name it (``--trainer.callbacks+=GradientVarianceMonitor``: jsonargparse finds classes by their own name)
    keep working; its checkpoint state is stored under GradientNoiseMonitor's key, so checkpoints move between the
    two names. Online estimators have their own monitor, :class:`OnlineEstimatorVarianceMonitor`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            "GradientVarianceMonitor is deprecated and will be removed in the next release; use GradientNoiseMonitor "
            "(the same monitor, arguments and checkpoint keys).",
            LightningOrthoDeprecationWarning,
            stacklevel=2,
        )
        super().__init__(*args, **kwargs)

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, GradientNoiseMonitor.__qualname__, 1)


__all__ = [
    "EstimatorVariance",
    "GradientNoiseMonitor",
    "OnlineEstimatorVarianceMonitor",
    "measure_estimator",
]
