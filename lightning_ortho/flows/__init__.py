"""Pure-PyTorch normalizing-flow building blocks (Glow) with auxiliary-reflection 1x1 convolutions.

Every layer: ``forward(x) -> (y, log_abs_det)`` per sample and ``inverse(y) -> x``. Nothing here imports Lightning.
"""

from lightning_ortho.flows.actnorm import ActNorm
from lightning_ortho.flows.base import FlowLayer, FlowSequence
from lightning_ortho.flows.bits import bits_per_dim, dequantize
from lightning_ortho.flows.conv1x1 import CONV1X1_KINDS, Invertible1x1Conv
from lightning_ortho.flows.coupling import AffineCoupling, ZeroConv2d
from lightning_ortho.flows.glow import Encoding, Glow
from lightning_ortho.flows.split import Split, gaussian_log_prob
from lightning_ortho.flows.squeeze import Squeeze

__all__ = [
    "CONV1X1_KINDS",
    "ActNorm",
    "AffineCoupling",
    "Encoding",
    "FlowLayer",
    "FlowSequence",
    "Glow",
    "Invertible1x1Conv",
    "Split",
    "Squeeze",
    "ZeroConv2d",
    "bits_per_dim",
    "dequantize",
    "gaussian_log_prob",
]
