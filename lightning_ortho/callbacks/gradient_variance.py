"""How noisy the gradients are: :class:`GradientNoiseMonitor` for any model (the mini-batch gradient noise and
McCandlish et al.'s noise scale ``B_simple``, from the gradients training already computes) and
:class:`OnlineEstimatorVarianceMonitor` for models trained online (the total variance and bias of UORO or truncated
BPTT against the exact gradient, by repeated draws on a probe sequence)."""

from lightning_ortho.callbacks.gradient_noise import GradientNoiseMonitor
from lightning_ortho.callbacks.online_estimator_variance import (
    EstimatorVariance,
    OnlineEstimatorVarianceMonitor,
    measure_estimator,
)

#: The issue's name for the monitor of any model's gradient noise (part a); online estimators have their own,
#: :class:`OnlineEstimatorVarianceMonitor` (part b), since they are measured by repeated draws, not from training.
GradientVarianceMonitor = GradientNoiseMonitor

__all__ = [
    "EstimatorVariance",
    "GradientNoiseMonitor",
    "GradientVarianceMonitor",
    "OnlineEstimatorVarianceMonitor",
    "measure_estimator",
]
