"""Our layers have the capabilities the monitors look for (lightning_ortho.nn.capabilities): renaming one of these
methods fails here instead of silently dropping the layer from a monitor; and a plain layer has none of them."""

import pytest
import torch
from torch import nn

from lightning_ortho.callbacks.invertibility_monitor import has_inverse
from lightning_ortho.callbacks.jacobian_monitor import closed_form
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor
from lightning_ortho.flows import (
    ActNorm,
    AffineCoupling,
    AuxConv1x1,
    Glow,
    HouseholderConv1x1,
    InvertibleAuxConv1x1,
    LUConv1x1,
    PlainConv1x1,
    Split,
    Squeeze,
)
from lightning_ortho.nn import (
    AuxiliaryReflection,
    HasDenseJacobian,
    HasInverse,
    HasInverseWithResult,
    HasInvertibilityMargin,
    HasJacobianSigns,
    HasLogAbsDetJacobian,
    HasMatrix,
    HasNewtonInverse,
    HouseholderProduct,
    ParametrizedOrthogonal,
    Reconstructs,
)

CONVS = [AuxConv1x1, InvertibleAuxConv1x1, PlainConv1x1, LUConv1x1, HouseholderConv1x1]
DECLARED = {
    HasLogAbsDetJacobian: [AuxiliaryReflection],
    HasDenseJacobian: [AuxiliaryReflection],
    HasNewtonInverse: [AuxiliaryReflection],
    HasInvertibilityMargin: [AuxiliaryReflection, InvertibleAuxConv1x1],
    HasInverse: [AuxiliaryReflection, ActNorm, AffineCoupling, Squeeze, Split, *CONVS],
    HasInverseWithResult: CONVS,
    HasJacobianSigns: CONVS,
    HasMatrix: [HouseholderProduct, ParametrizedOrthogonal, PlainConv1x1, LUConv1x1, HouseholderConv1x1],
    Reconstructs: [Glow],
}


@pytest.mark.parametrize("protocol", list(DECLARED), ids=lambda p: p.__name__)
def test_our_layers_have_the_capabilities_the_monitors_look_for(protocol):
    for layer in DECLARED[protocol]:
        assert issubclass(layer, protocol), f"{layer.__name__} lost {protocol.__name__}"
    assert not issubclass(nn.Linear, protocol)


def test_the_monitors_find_layers_by_these_capabilities():
    reflection = AuxiliaryReflection(3, invertible=True)
    assert isinstance(reflection, HasLogAbsDetJacobian) and closed_form(reflection) == reflection.log_abs_det_jacobian
    assert has_inverse(reflection) and not has_inverse(nn.Linear(3, 3)) and closed_form(nn.Linear(3, 3)) is None

    class Renamed(nn.Module):  # log_abs_det_jacobian renamed: the monitor no longer sees a closed form
        def log_det(self, x):
            return torch.zeros(x.shape[0])

    assert closed_form(Renamed()) is None
    assert OrthogonalityMonitor._kind(HouseholderProduct(3)) == "map"  # found by its matrix()
