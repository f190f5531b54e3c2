"""Invertible 1x1 convolutions, one class per kind.

* ``plain``: :class:`PlainConv1x1`, ``W x`` with a dense ``W``.
* ``lu``: :class:`LUConv1x1`, ``P L (U + diag(s)) x``.
* ``householder``: :class:`HouseholderConv1x1`, ``H(v_1) ... H(v_C) x``.
* ``aux``: :class:`AuxConv1x1`, ``H(W x) x`` with an unconstrained ``W``.
* ``aux_invertible``: :class:`InvertibleAuxConv1x1`, ``H(W Q x) Q x`` with Theorem 2's ``W`` and a fixed ``Q``.

``invertible_1x1_conv(channels, kind)`` builds ``CONV1X1[kind](channels)``; every class is a subclass of
:class:`Invertible1x1Conv`. The linear kinds share :class:`LinearConv1x1` (``matrix()``), the auxiliary ones
:class:`AuxiliaryReflectionConv1x1` (Newton inverse with results; ``aux_invertible`` adds ``invertibility_margin()``).
"""

from lightning_ortho._deprecation import renamed_attributes
from lightning_ortho.flows.conv1x1.auxiliary import AuxConv1x1, AuxiliaryReflectionConv1x1, InvertibleAuxConv1x1
from lightning_ortho.flows.conv1x1.base import (
    CONV1X1,
    CONV1X1_KINDS,
    Conv1x1Kind,
    Invertible1x1Conv,
    conv1x1_class,
    invertible_1x1_conv,
)
from lightning_ortho.flows.conv1x1.linear import HouseholderConv1x1, LinearConv1x1, LUConv1x1, PlainConv1x1

__all__ = [
    "CONV1X1",
    "CONV1X1_KINDS",
    "AuxConv1x1",
    "AuxiliaryReflectionConv1x1",
    "Conv1x1Kind",
    "HouseholderConv1x1",
    "Invertible1x1Conv",
    "InvertibleAuxConv1x1",
    "LUConv1x1",
    "LinearConv1x1",
    "PlainConv1x1",
    "conv1x1_class",
    "invertible_1x1_conv",
]

#: Deprecated names (one release): the base of the auxiliary kinds was called AuxiliaryConv1x1, too close to AuxConv1x1.
__getattr__ = renamed_attributes(
    "lightning_ortho.flows.conv1x1", {"AuxiliaryConv1x1": ("AuxiliaryReflectionConv1x1", AuxiliaryReflectionConv1x1)}
)
