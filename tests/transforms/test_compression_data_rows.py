"""compress_linear(data=...): the stored inputs are the data whatever their dtype (the refit's tolerance models its
own float64 arithmetic only), the ranks it reports agree with each other and with the data, and a refit on too few
rows for its unknowns says that its output_error is in-sample."""

import numpy
import pytest
import torch

from lightning_ortho.transforms.compression import compress_linear
from tests.transforms.test_compression_data import closest_exact_fit, layer_16_to_24, refit, sixteen_dimensional

F64 = torch.float64


@pytest.mark.parametrize(("dtype", "offset"), [(torch.float16, 300.0), (torch.bfloat16, 100.0), (torch.float32, 1e7)])
def test_inputs_stored_in_low_precision_are_refit_as_the_values_they_hold(dtype, offset):
    # N(0, 1) + offset rounded to the dtype: steps of 0.25, 0.5 and 1 against a spread of 1, still 16 directions
    layer = layer_16_to_24()
    stored = (sixteen_dimensional(300, 3) + offset).to(dtype)
    module, messages = refit(layer, stored)
    assert not messages and module.report.data_rank == 16
    # the same values in float64: one refit, equal to the least-squares reference on them
    as_float64, _ = refit(layer, stored.double())
    assert torch.equal(module.codes, as_float64.codes) and torch.equal(module.bias, as_float64.bias)
    # the reference on the values less the offset (exact in float64; an uncentred SVD near 1e7 would lose 14 digits):
    # the same least-squares codes, and a bias moved by what the fit leaves of the offset, (W - C D^T) offset
    codes, bias = closest_exact_fit(layer, compress_linear(layer, s=4, m=16), stored.double() - offset)
    torch.testing.assert_close(module.codes.detach(), codes, rtol=1e-6, atol=1e-8)
    shift = (layer.weight.detach() - module.dense_weight().detach()) @ torch.full((16,), offset, dtype=F64)
    torch.testing.assert_close(module.bias.detach(), bias + shift, rtol=0, atol=1e-6 * offset)
    assert module.report.support_rank == 4


def reference_rank(data: torch.Tensor) -> int:
    """Rank of the exactly centred float64 data by an SVD, with a gap-separated threshold (the datasets below have
    singular values either above 1e-3 or at rounding level, relative to the largest)."""
    centred = data.double() - data.double().mean(0)
    return int(numpy.linalg.matrix_rank(centred.numpy(), tol=1e-7 * float(numpy.linalg.norm(centred.numpy(), 2))))


def subspace(count, dimension, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, dimension, generator=g, dtype=F64) @ torch.randn(dimension, 16, generator=g, dtype=F64)


@pytest.mark.parametrize(
    "make",
    [
        lambda: sixteen_dimensional(200, 1),
        lambda: subspace(200, 2, 2),  # below s = 4 on every support
        lambda: subspace(200, 6, 3),  # above s: every row determined, data_rank 6
        lambda: sixteen_dimensional(1, 4),
        lambda: (sixteen_dimensional(300, 5) + 100).half(),  # was data_rank 0 with every row refit, unwarned
    ],
    ids=["full", "rank-2", "rank-6", "one-row", "float16+100"],
)
def test_the_reported_ranks_agree_with_each_other_and_the_data(make):
    data = make()
    module, messages = refit(layer_16_to_24(), data)
    report = module.report
    assert report.data_rank == reference_rank(data)
    undetermined = [m for m in messages if "do not determine" in m]
    if report.data_rank < 4:  # below s for the whole data: below it on every support, and said
        assert undetermined, messages
    assert report.support_rank <= min(4, report.data_rank) and report.data_rows == len(data)
    assert bool(undetermined) == (report.support_rank < 4), messages


@pytest.mark.parametrize(("rows", "warned"), [(5, True), (9, True), (10, False), (40, False)])
def test_fewer_than_two_rows_per_unknown_warn_that_output_error_is_in_sample(rows, warned):
    # s = 4: five unknowns per output row (four code values and the bias); 2 (s + 1) = 10 rows needed
    layer = layer_16_to_24()
    module, messages = refit(layer, sixteen_dimensional(rows, 6))
    few = [m for m in messages if "in-sample on too few rows" in m]
    assert bool(few) == warned and len(messages) == len(few), messages
    assert module.report.support_rank == 4  # every row determined: only the count of rows is at issue
    if warned:
        assert f"data has {rows} rows for the s + 1 = 5 unknowns" in few[0]
        assert f"output_error={module.report.output_error:.3g}%" in few[0]
    if rows == 5:  # as many rows as unknowns: the refit interpolates them, an in-sample error of rounding size
        assert module.report.output_error < 1e-12
