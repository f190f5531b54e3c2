import math

import pytest
import torch

from lightning_ortho.flows import CONV1X1_KINDS, Glow, bits_per_dim, dequantize

DTYPE = torch.float64


def tiny(kind: str, dtype=DTYPE) -> Glow:
    glow = Glow(in_channels=1, image_size=4, levels=2, steps=2, hidden_channels=6, conv1x1=kind).to(dtype)
    glow.train()
    glow(torch.rand(8, 1, 4, 4, dtype=dtype) - 0.5)  # ActNorm's data-dependent init
    with torch.no_grad():
        for name, p in glow.named_parameters():  # generic weights, but keep the unconstrained aux near Q
            if "reflection.weight" not in name:
                p.add_(0.05 * torch.randn_like(p))
    return glow.eval()


@pytest.mark.parametrize("kind", CONV1X1_KINDS)
def test_whole_model_log_density_matches_autograd(kind):
    glow = tiny(kind)
    x = torch.rand(2, 1, 4, 4, dtype=DTYPE) - 0.5
    for sample in x:
        # log p(x) = log N(z; prior) + log|det dz/dx|: flatten all latents into one vector z(x).
        def latents(t, glow=glow):
            enc = glow.encode(t.reshape(1, 1, 4, 4))
            return torch.cat([z.reshape(-1) for z in enc.zs])

        enc = glow.encode(sample.unsqueeze(0))
        jac = torch.autograd.functional.jacobian(latents, sample.reshape(-1))
        log_det = torch.linalg.slogdet(jac)[1]
        torch.testing.assert_close(enc.log_det[0], log_det, rtol=1e-9, atol=1e-9)


def test_log_prior_is_the_product_of_the_conditional_gaussians():
    glow = tiny("lu")
    x = torch.rand(3, 1, 4, 4, dtype=DTYPE) - 0.5
    enc = glow.encode(x)
    # top latent: N(top_mean, exp(top_log_std)); split latent: conditional prior of the split layer
    top = torch.distributions.Normal(glow.top_mean, glow.top_log_std.exp()).log_prob(enc.zs[-1]).flatten(1).sum(1)
    h = glow.blocks[0](x)[0]
    keep, _, split_log_prob = glow.splits[0](h)
    torch.testing.assert_close(enc.log_prior, top + split_log_prob)


@pytest.mark.parametrize("kind", CONV1X1_KINDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_round_trip_x_to_z_to_x(kind, dtype, tol):
    glow = tiny(kind, dtype)
    x = torch.rand(4, 1, 4, 4, dtype=dtype) - 0.5
    torch.testing.assert_close(glow.reconstruct(x), x, rtol=tol, atol=tol)


def test_sampling_shapes_and_temperature():
    glow = tiny("aux_invertible", torch.float32)
    torch.manual_seed(1)
    samples = glow.sample(5, temperature=0.7)
    assert samples.shape == (5, 1, 4, 4) and torch.isfinite(samples).all()
    cold = glow.sample(2, temperature=0.0)
    torch.testing.assert_close(cold[0], cold[1])  # temperature 0: the prior means, deterministic


def test_bits_per_dim_known_answers():
    x = torch.randint(0, 256, (6, 3, 4, 4)).float() / 255
    # A uniform density on the dequantisation cube (log p = 0) costs exactly log2(256) = 8 bits per dimension.
    torch.testing.assert_close(bits_per_dim(torch.zeros(6), 48, 256), torch.full((6,), 8.0))
    # Standard normal density on y, with fixed dequantisation noise: computed by hand.
    noise = torch.rand_like(x)
    y = dequantize(x, 256, noise)
    torch.testing.assert_close(y, (torch.round(x * 255) + noise) / 256 - 0.5)
    log_p = torch.distributions.Normal(0.0, 1.0).log_prob(y).flatten(1).sum(1)
    expected = (-log_p + 48 * math.log(256)) / (48 * math.log(2))
    torch.testing.assert_close(bits_per_dim(log_p, 48, 256), expected)
    with pytest.raises(ValueError, match="standardisation"):
        dequantize(torch.randn(2, 1, 4, 4) * 3, 256)


def test_glow_validates_configuration():
    with pytest.raises(ValueError, match="divisible"):
        Glow(image_size=6, levels=2)
    with pytest.raises(ValueError, match=r"\(N, 1, H, W\)"):
        Glow(image_size=8, levels=2)(torch.rand(2, 3, 8, 8))


def test_images_of_another_size_are_refused_not_scored_per_the_wrong_dimension():
    # Issue 9.6: an 8x8 Glow scored 16x16 images and divided by 64 dims instead of 256.
    glow = Glow(1, 8, 2, 1, 8)
    with pytest.raises(ValueError, match=r"built for 8x8 images, got 16x16"):
        glow.bits_per_dim(torch.rand(3, 1, 16, 16), 17)
    with pytest.raises(ValueError, match="8x8"):
        glow.log_prob(torch.rand(3, 1, 8, 16))
    assert glow.bits_per_dim(torch.rand(3, 1, 8, 8), 17).shape == (3,)


def test_empty_batches_zero_samples_and_bad_arguments():
    # Issue 9, smaller items: "cannot reshape tensor of 0 elements", sample(-1) and zero sizes were accepted.
    glow = Glow(1, 8, 2, 1, 8)
    assert glow.log_prob(torch.rand(0, 1, 8, 8)).shape == (0,)
    assert glow.sample(0).shape == (0, 1, 8, 8)
    with pytest.raises(ValueError, match="n must be a non-negative integer"):
        glow.sample(-1)
    with pytest.raises(ValueError, match="temperature"):
        glow.sample(2, temperature=-1.0)
    for kwargs, name in (({"image_size": 0}, "image_size"), ({"hidden_channels": 0}, "hidden_channels")):
        with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
            Glow(**{"in_channels": 1, "image_size": 8, "levels": 2, "steps": 1, "hidden_channels": 8, **kwargs})
