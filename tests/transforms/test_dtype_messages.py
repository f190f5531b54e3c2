"""A tensor of the wrong dtype is named by its dtype, with the conversion to make (not "got Tensor")."""

import pytest
import torch
from torch import nn

from lightning_ortho.transforms import (
    compress_linear,
    learn_b4x4_transform,
    learn_b_transform,
    learn_fast_transform,
    learn_shear_transform,
)
from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.compression import FactorizedLinear
from lightning_ortho.transforms.s_dla import shear_error, shear_greedy_init
from lightning_ortho.transforms.sparse_codes import omp_codes

Y_INT = torch.randint(-3, 4, (20, 8))
ADVICE = r"got a torch\.int64 tensor; convert it with \.float\(\)"

LEARNERS = {
    "b": lambda y: learn_b_transform(y, 4, 2),
    "b4x4": lambda y: learn_b4x4_transform(y, 2, 2),
    "shear": lambda y: learn_shear_transform(y, 4, 2),
    "fast": lambda y: learn_fast_transform(y, 2, init="identity"),
}


@pytest.mark.parametrize("learner", sorted(LEARNERS))
def test_integer_y_is_named_by_its_dtype_with_the_conversion(learner):
    with pytest.raises(ValueError, match=rf"Y must be a floating-point tensor \(N, n\), {ADVICE}"):
        LEARNERS[learner](Y_INT)
    LEARNERS[learner](Y_INT.float())  # the conversion the message gives is accepted


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: omp_codes(Y_INT, torch.eye(8, dtype=torch.float64), 2), ValueError, rf"y must be .*{ADVICE}"),
        (lambda: shear_greedy_init(Y_INT[:8], torch.eye(8), 2, None), ValueError, rf"z must be .*{ADVICE}"),
        (lambda: shear_error(torch.eye(8), Y_INT[:8], 1.0, torch.eye(8)), ValueError, rf"w must be .*{ADVICE}"),
        (lambda: BlockProduct(4, [(0, 1)], torch.ones(1, 2, 2, dtype=torch.int64)), TypeError, rf"blocks .*{ADVICE}"),
        (
            lambda: FactorizedLinear(BlockProduct(8, [(0, 1)]), Y_INT[:3]),
            TypeError,
            rf"codes must be .*{ADVICE}",
        ),
        (lambda: compress_linear(nn.Linear(8, 4), data=Y_INT), ValueError, rf"data must be .*{ADVICE}"),
    ],
    ids=["omp_codes", "shear_greedy_init", "shear_error", "BlockProduct", "FactorizedLinear", "compress_linear"],
)
def test_the_other_floating_checks_name_the_dtype_too(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_complex_and_non_tensor_inputs_are_named_as_such():
    with pytest.raises(ValueError, match=r"got a torch\.complex64 tensor \(complex values are not supported\)"):
        learn_b_transform(torch.ones(20, 8, dtype=torch.complex64), 4, 2)
    with pytest.raises(ValueError, match=r"got list"):
        learn_b_transform([[1.0, 2.0]], 4, 1)


def test_a_tensor_data_energy_of_many_entries_is_named_by_its_shape():
    match = r"data_energy must be the number .*got a torch\.float32 tensor of shape \(2,\)"
    with pytest.raises(ValueError, match=match):
        shear_error(torch.eye(8), torch.eye(8), torch.ones(2), torch.eye(8))
