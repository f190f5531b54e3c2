"""LightningModules wrapping the layers of :mod:`lightning_ortho.nn`."""

from lightning_ortho.models.ortho_classifier import OrthoClassifier

__all__ = ["OrthoClassifier"]
