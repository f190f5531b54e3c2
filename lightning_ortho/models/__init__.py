"""LightningModules wrapping the layers of :mod:`lightning_ortho.nn`."""

import warnings

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning
from lightning_ortho.models.classification import ClassifierModule
from lightning_ortho.models.conv_classifier import ConvClassifier
from lightning_ortho.models.factorized_checkpoint import RestoresFactorizedLayers
from lightning_ortho.models.fast_transform_module import FastTransformModule
from lightning_ortho.models.glow_module import GlowModule
from lightning_ortho.models.online_lru_stack_module import OnlineLRUStackModule
from lightning_ortho.models.online_rnn_module import OnlineRNNModule
from lightning_ortho.models.orthogonal_classifier import OrthogonalClassifier
from lightning_ortho.models.orthogonal_rnn_classifier import OrthogonalRNNClassifier

__all__ = [
    "ClassifierModule",
    "ConvClassifier",
    "FastTransformModule",
    "GlowModule",
    "OnlineLRUStackModule",
    "OnlineRNNModule",
    "OrthogonalClassifier",
    "OrthogonalRNNClassifier",
    "RestoresFactorizedLayers",
]

#: Names of version 0.1, kept so that old configs (``class_path: lightning_ortho.models.OrthoClassifier``) and
#: code keep working; they warn once and resolve to the new classes.
_RENAMED = {"OrthoClassifier": OrthogonalClassifier, "OrthoRNNClassifier": OrthogonalRNNClassifier}


def __getattr__(name: str):
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"lightning_ortho.models.{name} was renamed {new.__name__}; update the import or the config's class_path.",
            LightningOrthoDeprecationWarning,
            stacklevel=2,
        )
        return new
    raise AttributeError(f"module 'lightning_ortho.models' has no attribute {name!r}")
