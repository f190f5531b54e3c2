"""lightning_ortho: auxiliary reflections, online RNN training and fast transforms for PyTorch Lightning."""

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning
from lightning_ortho.nn import (
    AuxiliaryReflection,
    HouseholderProduct,
    NewtonInverseError,
    SVDLinear,
    orthogonal_map,
    reflect,
)

__version__ = "0.2.0.dev0"

__all__ = [
    "AuxiliaryReflection",
    "LightningOrthoDeprecationWarning",
    "HouseholderProduct",
    "NewtonInverseError",
    "SVDLinear",
    "orthogonal_map",
    "reflect",
]
