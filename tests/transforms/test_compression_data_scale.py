"""compress_linear(data=...) on inputs far from the origin or of extreme magnitude: the refit decides which code
values the inputs determine from the rounding the centred inputs actually carry, not from their uncentred size."""

import math
import warnings

import pytest
import torch
from torch import nn

from lightning_ortho.transforms.compression import compress_linear

F64 = torch.float64


def layer_16_to_24(bias=True):
    """A low-rank-plus-noise weight (the structure of a trained layer)."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 4, generator=g, dtype=F64) @ torch.randn(4, 16, generator=g, dtype=F64)
    weight += 0.1 * torch.randn(24, 16, generator=g, dtype=F64)
    layer = nn.Linear(16, 24, bias=bias).double()
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias:
            layer.bias.copy_(torch.randn(24, generator=g, dtype=F64))
    return layer


def refit(layer, data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = compress_linear(layer, s=4, m=16, data=data, progress=False)
    return module, [str(w.message) for w in caught]


def variation_error(layer, module, x):
    """``100 ||f(X) - g(X)||^2 / ||f(X) - mean f(X)||^2``: the error against what the outputs vary by."""
    with torch.no_grad():
        target = layer(x)
        return float(100 * (target - module(x)).square().sum() / (target - target.mean(0)).square().sum())


@pytest.mark.parametrize(("count", "offset"), [(200, 1e6), (200, 1e8), (200, 1e10), (200, 1e12), (5000, 1e6)])
def test_an_offset_far_above_the_spread_leaves_full_rank_inputs_determining_every_code(count, offset):
    layer = layer_16_to_24()
    spread = torch.randn(count, 16, generator=torch.Generator().manual_seed(3), dtype=F64)
    data = spread + offset
    # The same centred rows without the offset: data - offset is exact (Sterbenz), so both inputs have identical
    # centred values and the least-squares codes are the same; only the bias moves, by (W - C D^T) offset.
    reference, reference_messages = refit(layer, data - offset)
    module, messages = refit(layer, data)
    assert not messages and not reference_messages
    assert module.report.data_rank == 16 == reference.report.data_rank
    torch.testing.assert_close(module.codes.detach(), reference.codes.detach(), rtol=1e-7, atol=1e-9)
    shift = (layer.weight.detach() - module.dense_weight().detach()) @ torch.full((16,), offset, dtype=F64)
    bias_scale = float(layer.weight.detach().abs().sum(1).max()) * offset
    torch.testing.assert_close(
        module.bias.detach(), reference.bias.detach() + shift, rtol=0, atol=1e-12 * bias_scale + 1e-9
    )
    # and on fresh inputs of the same distribution it predicts as well as the reference does around the origin
    fresh = torch.randn(500, 16, generator=torch.Generator().manual_seed(4), dtype=F64)
    assert variation_error(layer, module, fresh + offset) < 1.02 * variation_error(layer, reference, fresh) + 1e-3


@pytest.mark.parametrize(("offset", "rank"), [(1e8, 3), (1e12, 16)])
def test_inputs_on_an_affine_subspace_far_from_the_origin(offset, rank):
    # Three directions of variation; storing x + offset in float64 scatters the rows off the subspace by its
    # rounding (ulp/2: ~7e-9 at 1e8, ~6e-5 at 1e12). The stored values are the data: at 1e12 the scatter's Gram
    # eigenvalues (~200 * 1e-9) are some 1000 times above what float64 Gram products resolve (~200 eps trace G) and
    # determine every code; at 1e8 they are far below it: rank 3, warned, the no-data codes kept off the subspace.
    layer, g = layer_16_to_24(), torch.Generator().manual_seed(5)
    basis = torch.randn(3, 16, generator=g, dtype=F64)
    data = torch.randn(200, 3, generator=g, dtype=F64) @ basis + offset
    module, messages = refit(layer, data)
    assert module.report.data_rank == rank and module.report.support_rank == min(rank, 4)
    assert any("centred rank 3" in m for m in messages) == (rank == 3), messages
    fresh = torch.randn(400, 3, generator=g, dtype=F64) @ basis + offset  # new points of the same subspace
    assert variation_error(layer, module, fresh) < 1e-3  # the directions the data determine are fitted exactly


@pytest.mark.parametrize("exponent", [530, 200, -200, -600])  # 2^530 ~ 3.5e159, 2^-600 ~ 2.4e-181
def test_inputs_of_any_magnitude_refit_as_their_power_of_two_scaled_copy(exponent):
    # f(2^k x) = 2^k f(x) without a bias, so the refit codes are the same and the bias scales by 2^k exactly.
    layer = layer_16_to_24(bias=False)
    data = torch.randn(200, 16, generator=torch.Generator().manual_seed(6), dtype=F64)
    reference, _ = refit(layer, data)
    module, messages = refit(layer, torch.ldexp(data, torch.tensor(float(exponent), dtype=F64)))
    assert not messages and module.report.data_rank == 16
    torch.testing.assert_close(module.codes.detach(), reference.codes.detach(), rtol=1e-12, atol=0)
    scaled_bias = torch.ldexp(reference.bias.detach(), torch.tensor(float(exponent), dtype=F64))
    torch.testing.assert_close(module.bias.detach(), scaled_bias, rtol=1e-12, atol=0)
    assert math.isfinite(module.report.output_error)
    assert module.report.output_error == pytest.approx(reference.report.output_error, rel=1e-12)
