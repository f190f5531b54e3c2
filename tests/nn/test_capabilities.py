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


def test_a_capability_is_a_method_of_the_class_not_a_submodule_or_an_instance_attribute():
    class Decoder(nn.Module):  # an autoencoder whose learned decoder is a submodule named `inverse`
        def __init__(self):
            super().__init__()
            self.inverse, self.jacobian = nn.Linear(3, 3), nn.Linear(3, 3)

    class Attribute:  # a callable set on the instance only
        def __init__(self):
            self.inverse = lambda y: y

    class Method(nn.Module):
        def inverse(self, y):
            return y

    class Disabled(Method):  # a subclass that turns the capability off
        inverse = None

    assert callable(Decoder().inverse) and hasattr(Decoder(), "jacobian")  # what hasattr-based protocols accepted
    for protocol in (HasInverse, HasDenseJacobian):
        assert not isinstance(Decoder(), protocol) and not issubclass(Decoder, protocol), protocol
    assert not isinstance(Attribute(), HasInverse)
    assert isinstance(Method(), HasInverse) and issubclass(Method, HasInverse)
    assert isinstance(Method(), nn.Linear | HasInverse)  # as the monitors test unions
    assert not isinstance(Disabled(), HasInverse)
    assert not has_inverse(Decoder()) and has_inverse(Method())


def test_constant_statistics_are_declared_by_the_layers_whose_construction_fixes_them():
    from lightning_ortho.nn.capabilities import jacobian_sign_is_fixed, log_abs_det_is_zero

    fixed_sign = [LUConv1x1(4), HouseholderConv1x1(4), AuxiliaryReflection(3, invertible=True)]
    assert all(jacobian_sign_is_fixed(layer) for layer in fixed_sign)
    # the sign of det W of a dense W, and of an unconstrained auxiliary reflection, can change while training
    assert not any(jacobian_sign_is_fixed(m) for m in (PlainConv1x1(4), AuxConv1x1(4), AuxiliaryReflection(3)))
    assert log_abs_det_is_zero(HouseholderConv1x1(4)) and log_abs_det_is_zero(Squeeze())
    assert not any(log_abs_det_is_zero(m) for m in (LUConv1x1(4), PlainConv1x1(4), AuxiliaryReflection(3)))

    class Named(nn.Module):  # a submodule of that name is no declaration
        def __init__(self):
            super().__init__()
            self.jacobian_sign_is_fixed = nn.Identity()

    assert not jacobian_sign_is_fixed(Named())
