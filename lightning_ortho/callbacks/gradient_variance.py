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


class GradientVarianceMonitor(GradientNoiseMonitor):
    """:class:`GradientNoiseMonitor` under its second name (the environment switch calls it ``gradient_variance``):
    the same monitor, arguments and keys. A subclass rather than an alias so that a config or the command line can
    name it (``--trainer.callbacks+=GradientVarianceMonitor``: jsonargparse finds classes by their own name); its
    checkpoint state is stored under GradientNoiseMonitor's key, so checkpoints move between the two names.
    Online estimators have their own monitor, :class:`OnlineEstimatorVarianceMonitor`, since they are measured by
    repeated draws, not from training's gradients."""

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, GradientNoiseMonitor.__qualname__, 1)


__all__ = [
    "EstimatorVariance",
    "GradientNoiseMonitor",
    "GradientVarianceMonitor",
    "OnlineEstimatorVarianceMonitor",
    "measure_estimator",
]
