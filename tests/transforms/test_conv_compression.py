"""``compress_conv``: a Conv1d/Conv2d as ``conv(D^T x, C) + b``. References: the dense convolution of the same
module (``F.conv1d/2d``), the dense kernel ``C D^T`` built entry by entry, the op-count formulas written out."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from lightning_ortho.transforms import FactorizedConv, compress_conv
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.factorized_linear import restore_factorized

#: convolutions with every padding mode, strides, dilations, rectangular kernels, 1-D and 1 x 1
CONVOLUTIONS = {
    "3x3 zeros": lambda: nn.Conv2d(8, 6, 3, padding=1),
    "3x2 reflect strided dilated": lambda: nn.Conv2d(
        6, 4, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2), padding_mode="reflect"
    ),
    "conv1d same circular": lambda: nn.Conv1d(6, 5, 3, padding="same", padding_mode="circular"),
    "conv1d replicate no bias": lambda: nn.Conv1d(4, 3, 2, padding=1, padding_mode="replicate", bias=False),
    "1x1": lambda: nn.Conv2d(8, 12, 1),
}


def _made(case: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    conv = CONVOLUTIONS[case]().double()
    spatial = (7, 9) if isinstance(conv, nn.Conv2d) else (11,)
    return conv, torch.randn(5, conv.in_channels, *spatial, dtype=torch.float64)


def _dense_copy(conv: nn.Module, factorized: FactorizedConv) -> nn.Module:
    dense = copy.deepcopy(conv)
    with torch.no_grad():
        dense.weight.copy_(factorized.dense_kernel())
        if dense.bias is not None:
            dense.bias.copy_(factorized.bias)
    return dense


@pytest.mark.parametrize("case", list(CONVOLUTIONS))
def test_the_layer_is_the_convolution_with_its_dense_kernel(case):
    conv, x = _made(case)
    factorized = compress_conv(conv, s=2, generator=torch.Generator().manual_seed(1))
    # the dense kernel entry by entry: W[o, c, j] = sum_c' C[o, c', j] T[c', c]
    transform = factorized.transform.matrix()
    codes = factorized.sparse_codes()
    kernel = torch.einsum("ok...,kc->oc...", codes, transform)
    torch.testing.assert_close(factorized.dense_kernel(), kernel, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(factorized(x), _dense_copy(conv, factorized)(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(factorized(x[0]), factorized(x)[0], rtol=1e-12, atol=1e-12)  # unbatched
    assert int(factorized.mask.flatten(2).transpose(1, 2).sum(-1).unique()) == 2  # s per (channel, offset)


@pytest.mark.parametrize("case", list(CONVOLUTIONS))
def test_with_all_channels_in_the_codes_the_convolution_is_exact(case):
    conv, x = _made(case)
    factorized = compress_conv(conv, s=conv.in_channels, generator=torch.Generator().manual_seed(2))
    assert factorized.error < 1e-20
    torch.testing.assert_close(factorized(x), conv(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["3x3 zeros", "conv1d same circular"])
def test_the_data_refit_lowers_the_output_error_on_the_data(case):
    conv, x = _made(case)
    settings = {"s": 2, "generator": torch.Generator().manual_seed(3)}
    plain = compress_conv(conv, **settings)
    settings["generator"] = torch.Generator().manual_seed(3)  # the same transform and support
    refit = compress_conv(conv, data=x, **settings)
    assert torch.equal(plain.mask, refit.mask)

    @torch.no_grad()
    def error(layer):
        return float(100 * (layer(x) - conv(x)).square().sum() / conv(x).square().sum())

    assert error(refit) < error(plain)
    assert refit.report.output_error == pytest.approx(error(refit), rel=1e-6)
    assert refit.report.input_size == tuple(x.shape[2:]) and refit.input_size == tuple(x.shape[2:])


def test_op_counts_per_image_and_per_position():
    conv, x = _made("3x2 reflect strided dilated")
    factorized = compress_conv(conv, s=2, data=x, generator=torch.Generator().manual_seed(4))
    out_size = conv(x).shape[2:]
    positions, pixels = math.prod(out_size), math.prod(x.shape[2:])
    assert factorized.output_size() == tuple(out_size)
    fan_in = conv.in_channels * math.prod(conv.kernel_size)
    dense = OpCount(additions=conv.out_channels * (fan_in - 1), multiplications=conv.out_channels * fan_in)
    assert factorized.report.dense_ops == dense * positions == factorized.dense_op_count()
    per_channel = factorized.sparse_codes().flatten(1).ne(0).sum(1)  # generic codes: one multiplication each
    codes = OpCount(additions=int((per_channel - 1).sum()), multiplications=int(per_channel.sum()))
    assert factorized.codes_op_count() == codes
    expected = factorized.transform_op_count() * pixels + codes * positions
    assert factorized.report.factorized_ops == expected == factorized.op_count()
    unsized = compress_conv(conv, s=2, generator=torch.Generator().manual_seed(4))
    assert unsized.report.input_size is None and unsized.report.dense_ops == dense  # per output position
    with pytest.raises(ValueError, match="input_size"):
        unsized.op_count()
    assert unsized.op_count(input_size=x.shape[2:]).total > 0


@pytest.mark.parametrize("case", ["3x2 reflect strided dilated", "conv1d replicate no bias"])
def test_states_load_both_ways_and_copies_keep_the_layer(case):
    conv, x = _made(case)
    compressed = nn.Sequential(nn.Identity(), compress_conv(conv, s=2, data=x))
    fresh = nn.Sequential(nn.Identity(), copy.deepcopy(conv))  # a model built dense
    assert restore_factorized(fresh, compressed.state_dict()) == ["1"]
    fresh.load_state_dict(compressed.state_dict())
    torch.testing.assert_close(fresh(x), compressed(x), rtol=0, atol=0)
    assert fresh[1].input_size == compressed[1].input_size
    torch.testing.assert_close(copy.deepcopy(compressed)(x), compressed(x), rtol=0, atol=0)
    dense = nn.Sequential(nn.Identity(), conv)
    assert restore_factorized(compressed, dense.state_dict()) == ["1"]  # a state saved before compression
    compressed.load_state_dict(dense.state_dict())
    assert type(compressed[1]) is type(conv)
    torch.testing.assert_close(compressed(x), conv(x), rtol=0, atol=0)


def test_fine_tuning_moves_only_the_support():
    conv, x = _made("3x3 zeros")
    factorized = compress_conv(conv, s=2, generator=torch.Generator().manual_seed(5))
    factorized(x).square().sum().backward()
    assert not factorized.codes.grad[~factorized.mask].any()
    assert factorized.codes.grad[factorized.mask].abs().sum() > 0
    assert {name for name, p in factorized.named_parameters() if p.requires_grad} == {"codes", "bias"}


def test_a_compiled_layer_equals_eager():
    conv, x = _made("3x3 zeros")
    factorized = compress_conv(conv, s=2, generator=torch.Generator().manual_seed(6))
    torch._dynamo.reset()
    compiled = torch.compile(factorized, backend="aot_eager")
    torch.testing.assert_close(compiled(x), factorized(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("conv", "reason"),
    [
        (nn.Conv2d(8, 8, 3, groups=8), "depthwise"),
        (nn.Conv2d(8, 4, 3, groups=2), "groups=2"),
        (nn.Conv2d(1, 8, 3), "1 input channel"),
        (nn.Conv3d(4, 4, 3), "Conv3d is not supported"),
        (nn.ConvTranspose2d(4, 4, 3), "transposed"),
    ],
)
def test_convolutions_it_cannot_compress_are_refused_with_the_reason(conv, reason):
    with pytest.raises(ValueError, match=reason):
        compress_conv(conv)


def test_bad_arguments_say_what_to_do():
    conv = nn.Conv2d(6, 4, 3)
    with pytest.raises(ValueError, match="all zeros"):
        compress_conv(nn.Conv2d(6, 4, 3).requires_grad_(False).apply(lambda m: nn.init.zeros_(m.weight)))
    with pytest.raises(ValueError, match="even in_channels"):
        compress_conv(nn.Conv2d(5, 4, 3), family="m")
    with pytest.raises(ValueError, match="s must be"):
        compress_conv(conv, s=7)
    with pytest.raises(ValueError, match="spatial dims"):
        compress_conv(conv, data=torch.randn(2, 6, 5))
    with pytest.raises(TypeError, match="nn.Conv1d or nn.Conv2d"):
        compress_conv(torch.zeros(3))


def test_op_counts_add_up_with_sum_and_scale():
    counts = [OpCount(additions=3, multiplications=2), OpCount(shifts=4), OpCount(additions=1, multiplications=1)]
    assert sum(counts) == OpCount(additions=4, multiplications=3, shifts=4) == sum(counts, OpCount())
    assert sum(counts).total == 11 and sum([]) == 0
    assert counts[0] * 3 == 3 * counts[0] == OpCount(additions=9, multiplications=6)
    with pytest.raises(TypeError):
        counts[0] + 1
