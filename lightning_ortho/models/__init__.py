"""LightningModules wrapping the layers of :mod:`lightning_ortho.nn`."""

from lightning_ortho.models.classification import ClassifierModule
from lightning_ortho.models.glow_module import GlowModule
from lightning_ortho.models.ortho_classifier import OrthoClassifier
from lightning_ortho.models.ortho_rnn_classifier import OrthoRNNClassifier

__all__ = ["ClassifierModule", "GlowModule", "OrthoClassifier", "OrthoRNNClassifier"]
