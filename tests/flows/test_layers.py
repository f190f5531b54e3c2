"""Every flow layer: log-determinant against slogdet of the autograd Jacobian (float64), exact round trips."""

import pytest
import torch

from lightning_ortho.flows import (
    CONV1X1,
    ActNorm,
    AffineCoupling,
    FlowSequence,
    Split,
    Squeeze,
    gaussian_log_prob,
    invertible_1x1_conv,
)
from tests.flows.references import autograd_log_det

DTYPE = torch.float64


def perturb_(module: torch.nn.Module) -> torch.nn.Module:
    """Move every parameter off its (often special) initial value, so the checks cover generic weights."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


LAYERS = {
    "actnorm": lambda c: ActNorm(c),
    "squeeze": lambda c: Squeeze(),
    "coupling": lambda c: AffineCoupling(c, hidden_channels=6),
    **{f"conv1x1-{kind}": (lambda c, kind=kind: invertible_1x1_conv(c, kind)) for kind in CONV1X1},  # every kind
}


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("channels", [3, 4])
def test_log_det_matches_autograd_jacobian(name, channels):
    layer = perturb_(LAYERS[name](channels).to(DTYPE)).eval()
    x = torch.randn(3, channels, 2, 2, dtype=DTYPE)
    y, log_det = layer(x)
    assert y.shape[0] == 3 and log_det.shape == (3,)
    torch.testing.assert_close(log_det, autograd_log_det(layer, x), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_round_trip(name, dtype, tol):
    layer = LAYERS[name](4).to(dtype).eval()
    if name != "conv1x1-aux":  # unconstrained aux is invertible at init, not for arbitrary W
        perturb_(layer)
    x = torch.randn(5, 4, 4, 4, dtype=dtype)
    y, _ = layer(x)
    torch.testing.assert_close(layer.inverse(y), x, rtol=tol, atol=tol)


def test_actnorm_data_dependent_init_and_persistence():
    layer = ActNorm(3)
    x = torch.randn(64, 3, 5, 5) * torch.tensor([1.0, 4.0, 0.5]).view(1, 3, 1, 1) + 2.0
    y, log_det = layer(x)
    torch.testing.assert_close(y.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-4, rtol=0)
    assert bool(layer.initialized)
    restored = ActNorm(3)
    restored.load_state_dict(layer.state_dict())
    torch.testing.assert_close(restored(x * 3)[0], layer(x * 3)[0])  # no re-initialisation from new data


def test_split_prior_log_prob_and_sampling():
    split = perturb_(Split(5).to(DTYPE))
    x = torch.randn(2, 5, 3, 3, dtype=DTYPE)
    keep, out, log_prob = split(x)
    assert keep.shape == (2, 3, 3, 3) and out.shape == (2, 2, 3, 3)
    mean, log_std = split._prior(keep)
    reference = torch.distributions.Normal(mean, torch.exp(log_std)).log_prob(out).flatten(1).sum(1)
    torch.testing.assert_close(log_prob, reference)
    torch.testing.assert_close(split.inverse(keep, out), x)
    assert split.inverse(keep, None, temperature=0.0).allclose(torch.cat([keep, mean], 1))


def test_gaussian_log_prob_reference():
    z = torch.randn(4, 2, 3, 3, dtype=DTYPE)
    mean, log_std = torch.randn(1, 2, 1, 1, dtype=DTYPE), torch.randn(1, 2, 1, 1, dtype=DTYPE)
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(z).flatten(1).sum(1)
    torch.testing.assert_close(gaussian_log_prob(z, mean, log_std), expected)


def test_sequence_composes_log_dets():
    flow = perturb_(FlowSequence(ActNorm(4), invertible_1x1_conv(4, "lu"), AffineCoupling(4, 5)).to(DTYPE)).eval()
    x = torch.randn(2, 4, 2, 2, dtype=DTYPE)
    torch.testing.assert_close(flow(x)[1], autograd_log_det(flow, x), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(flow.inverse(flow(x)[0]), x)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"\(N, 4, H, W\)"):
        invertible_1x1_conv(4)(torch.randn(2, 3, 2, 2))
    with pytest.raises(ValueError, match="even"):
        Squeeze()(torch.randn(1, 1, 3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        ActNorm(1)(torch.ones(1, 1, 2, 2, dtype=torch.long))


def test_actnorm_init_is_not_ruined_by_empty_nan_single_or_constant_batches():
    # Issue 9.5: an empty or NaN batch set NaN and marked the layer initialised; zero variance gave log-scale 13.8.
    layer = ActNorm(3)
    y, log_det = layer(torch.randn(0, 3, 4, 4))
    assert y.shape == (0, 3, 4, 4) and not bool(layer.initialized)  # nothing seen: still uninitialised
    nan = torch.randn(8, 3, 4, 4)
    nan[2, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        layer(nan)
    assert not bool(layer.initialized) and torch.isfinite(layer.log_scale).all()
    with pytest.warns(UserWarning, match="no reliable statistics"):
        layer(torch.randn(1, 3, 1, 1))
    assert bool(layer.initialized) and float(layer.log_scale.abs().max()) == 0 and float(layer.bias.abs().max()) == 0

    constant = torch.randn(16, 3, 4, 4)
    constant[:, 1] = 0.25  # a channel with zero spread
    layer = ActNorm(3)
    with pytest.warns(UserWarning, match="1 channel"):
        y, _ = layer(constant)
    assert float(layer.log_scale[0, 1]) == 0.0 and float(y[:, 1].abs().max()) == 0.0  # centred, not blown up
    reference = constant[:, [0, 2]]
    torch.testing.assert_close(
        layer.log_scale[0, [0, 2], 0, 0], -torch.log(reference.std(dim=(0, 2, 3), unbiased=False) + 1e-6)
    )


def test_the_inverses_of_squeeze_and_split_refuse_shapes_their_forward_cannot_make():
    with pytest.raises(ValueError, match="multiple of 4"):
        Squeeze().inverse(torch.randn(1, 6, 2, 2))
    split = Split(5)
    z_keep, z_out = torch.randn(2, 3, 4, 4), torch.randn(2, 2, 4, 4)
    assert split.inverse(z_keep, z_out).shape == (2, 5, 4, 4)
    with pytest.raises(ValueError, match=r"expected shape \(N, 3, H, W\)"):
        split.inverse(torch.randn(2, 2, 4, 4), z_out)
    with pytest.raises(ValueError, match=r"expected shape \(N, 2, H, W\)"):
        split.inverse(z_keep, torch.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match="share the batch and the image size"):
        split.inverse(z_keep, torch.randn(2, 2, 2, 2))
