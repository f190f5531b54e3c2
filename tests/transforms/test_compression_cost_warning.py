"""compress_linear says when the compressed layer costs more operations per sample than the dense one (a layer
with one output: the transform is paid for one output only), with both counts."""

import warnings

import pytest
import torch
from torch import nn

from lightning_ortho.transforms.compression import compress_linear


def layer(out: int, n: int) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(n, out)


def dearer(caught) -> list[str]:
    return [str(w.message) for w in caught if "of the dense layer" in str(w.message)]


def test_a_one_output_layer_compressed_dearer_than_dense_warns_with_both_counts():
    # b4x4 on 16 inputs: at least in // 4 = 4 blocks of 16 operations each, against 16 + 15 for the dense row
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compressed = compress_linear(layer(1, 16), "b4x4", progress=False)
    report = compressed.report
    dense = 16 + 15  # one output: 16 multiplications, 15 additions
    assert report.dense_ops.total == dense
    assert report.factorized_ops.total > dense
    (message,) = dearer(caught)
    assert f"costs {report.factorized_ops.total} operations per sample" in message
    assert f"({report.transform_ops.total} for the transform + {report.code_ops.total} for the codes)" in message
    assert f"more than the {dense} of the dense layer (16 multiplications + 15 additions)" in message
    assert "Keep it dense" in message
    assert isinstance(compressed, nn.Module)  # returned all the same


@pytest.mark.parametrize(("family", "out", "n"), [("b4x4", 16, 16), ("b", 16, 16), ("shear", 1, 16)])
def test_a_compressed_layer_no_dearer_than_dense_warns_nothing(family, out, n):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compressed = compress_linear(layer(out, n), family, progress=False)
    report = compressed.report
    assert report.factorized_ops.total <= report.dense_ops.total
    assert not dearer(caught)
