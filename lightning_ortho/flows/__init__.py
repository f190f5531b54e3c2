"""Pure-PyTorch normalizing-flow building blocks (Glow) with auxiliary-reflection 1x1 convolutions.

Every layer: ``forward(x) -> (y, log_abs_det)`` per sample and ``inverse(y) -> x``. Nothing here imports Lightning.
"""

from lightning_ortho._deprecation import renamed_attributes
from lightning_ortho.flows.actnorm import ActNorm
from lightning_ortho.flows.base import FlowLayer, FlowSequence
from lightning_ortho.flows.bits import bits_per_dim, dequantize
from lightning_ortho.flows.conv1x1 import (
    CONV1X1,
    CONV1X1_KINDS,
    AuxConv1x1,
    AuxiliaryReflectionConv1x1,
    HouseholderConv1x1,
    Invertible1x1Conv,
    InvertibleAuxConv1x1,
    LinearConv1x1,
    LUConv1x1,
    PlainConv1x1,
    invertible_1x1_conv,
)
from lightning_ortho.flows.coupling import AffineCoupling, ZeroConv2d
from lightning_ortho.flows.diagnostics import (
    Reconstruction,
    jacobian_sign_flips,
    min_invertibility_margin,
    reconstruction,
)
from lightning_ortho.flows.glow import Encoding, Glow
from lightning_ortho.flows.split import Split, gaussian_log_prob
from lightning_ortho.flows.squeeze import Squeeze

__all__ = [
    "CONV1X1",
    "CONV1X1_KINDS",
    "ActNorm",
    "AffineCoupling",
    "AuxConv1x1",
    "AuxiliaryReflectionConv1x1",
    "Encoding",
    "FlowLayer",
    "FlowSequence",
    "Glow",
    "HouseholderConv1x1",
    "Invertible1x1Conv",
    "InvertibleAuxConv1x1",
    "LUConv1x1",
    "LinearConv1x1",
    "PlainConv1x1",
    "Reconstruction",
    "Split",
    "Squeeze",
    "ZeroConv2d",
    "bits_per_dim",
    "dequantize",
    "gaussian_log_prob",
    "invertible_1x1_conv",
    "jacobian_sign_flips",
    "min_invertibility_margin",
    "reconstruction",
]

#: Deprecated names (one release): the base of the auxiliary kinds was called AuxiliaryConv1x1, too close to AuxConv1x1.
__getattr__ = renamed_attributes(
    "lightning_ortho.flows", {"AuxiliaryConv1x1": ("AuxiliaryReflectionConv1x1", AuxiliaryReflectionConv1x1)}
)
