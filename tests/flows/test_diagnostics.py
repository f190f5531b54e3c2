"""flows.diagnostics on tiny float64 Glows, against brute-force references (autograd, eigvalsh, decode(encode))."""

import math

import pytest
import torch

from lightning_ortho.flows import AuxiliaryReflectionConv1x1, Glow, InvertibleAuxConv1x1, diagnostics
from lightning_ortho.nn import NewtonInverseError
from tests.flows.references import conv1x1_inputs, minority_fraction, pixel_jacobian_signs

DTYPE = torch.float64


def tiny(kind: str) -> Glow:
    glow = Glow(in_channels=1, image_size=4, levels=2, steps=2, hidden_channels=6, conv1x1=kind).to(DTYPE)
    glow(torch.rand(8, 1, 4, 4, dtype=DTYPE) - 0.5)  # ActNorm's data-dependent init
    with torch.no_grad():
        for name, p in glow.named_parameters():  # generic weights, but keep the unconstrained aux near Q
            p.add_((0.01 if "reflection.weight" in name else 0.1) * torch.randn_like(p))
    return glow.eval()


def break_one_aux_layer(glow: Glow) -> None:
    """A generic W in the first 1x1 convolution: its Jacobian determinant changes sign across pixels."""
    layer = diagnostics.conv1x1_layers(glow)[0]
    with torch.no_grad():
        layer.reflection.weight.copy_(3 * torch.randn_like(layer.reflection.weight))


def reference_sign_flips(glow: Glow, y: torch.Tensor) -> float:
    return max(minority_fraction(pixel_jacobian_signs(layer, x)) for layer, x in conv1x1_inputs(glow, y))


@pytest.mark.parametrize("kind", ["lu", "aux", "aux_invertible"])
def test_reconstruction_error_is_the_brute_force_one(kind):
    glow = tiny(kind)
    y = torch.rand(4, 1, 4, 4, dtype=DTYPE) - 0.5
    with torch.no_grad():
        expected = float((glow.decode(glow.encode(y).zs) - y).abs().max())
    result = diagnostics.reconstruction(glow, y)
    assert result.max_error == expected and result.newton_failures == 0 and result.ok
    assert expected < 1e-9


def test_failed_reconstruction_reports_infinity_and_the_failed_pixels(monkeypatch):
    glow = tiny("aux")
    y = torch.rand(4, 1, 4, 4, dtype=DTYPE) - 0.5
    original = AuxiliaryReflectionConv1x1.inverse_columns
    monkeypatch.setattr(  # Newton without a single step: the pixels of the first layer decoded fail
        AuxiliaryReflectionConv1x1,
        "inverse_columns",
        lambda self, y, tol=None, max_iter=50: original(self, y, max_iter=0),
    )
    with pytest.raises(NewtonInverseError) as error:
        glow.reconstruct(y)
    expected = int((~error.value.result.converged).sum())
    result = diagnostics.reconstruction(glow, y)
    assert result.max_error == math.inf and result.newton_failures == expected > 0 and not result.ok


@pytest.mark.parametrize("kind", ["lu", "householder", "aux", "aux_invertible"])
def test_sign_flips_equal_the_autograd_reference(kind):
    torch.manual_seed(2)
    glow = tiny(kind)
    y = torch.rand(4, 1, 4, 4, dtype=DTYPE) - 0.5
    assert diagnostics.jacobian_sign_flips(glow, y) == reference_sign_flips(glow, y) == 0.0
    assert diagnostics.has_auxiliary_conv1x1(glow) == kind.startswith("aux")


def test_sign_flips_of_a_broken_aux_layer_equal_the_autograd_reference():
    torch.manual_seed(3)
    glow = tiny("aux")
    break_one_aux_layer(glow)
    y = torch.rand(8, 1, 4, 4, dtype=DTYPE) - 0.5
    reference = reference_sign_flips(glow, y)
    assert reference > 0  # the case is the one it should be
    assert diagnostics.jacobian_sign_flips(glow, y) == reference


def test_min_invertibility_margin_from_the_eigenvalues_of_w():
    glow = tiny("aux_invertible")
    margins = []
    for layer in diagnostics.conv1x1_layers(glow):
        assert isinstance(layer, InvertibleAuxConv1x1)
        eigenvalues = torch.linalg.eigvalsh(layer.reflection.auxiliary_weight().detach())
        margins.append(float(1.5 * eigenvalues[0] - eigenvalues[-1]))
    assert diagnostics.min_invertibility_margin(glow) == pytest.approx(min(margins), rel=1e-12)
    assert diagnostics.min_invertibility_margin(tiny("aux")) is None


def test_diagnostics_leave_the_model_as_they_found_it():
    glow = Glow(in_channels=1, image_size=4, levels=2, steps=1, hidden_channels=4, conv1x1="aux").to(DTYPE)
    y = torch.rand(2, 1, 4, 4, dtype=DTYPE) - 0.5
    state = {k: v.clone() for k, v in glow.state_dict().items()}
    diagnostics.reconstruction(glow, y)
    diagnostics.jacobian_sign_flips(glow, y)
    assert glow.training  # mode restored
    for key, value in glow.state_dict().items():  # eval mode inside: no ActNorm initialisation happened
        assert torch.equal(value, state[key]), key
    assert all(not hooks for hooks in (m._forward_hooks for m in glow.modules()))
