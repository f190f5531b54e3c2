"""OnlineRNNModule: class indices of any integer dtype train as int64 ones do; targets of no usable dtype get the
conversion to make, not advice about ``output_size``."""

import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_ortho.models.online.readout import read_chunk
from lightning_ortho.online.losses import masked_loss_sum
from tests.models.test_online_rnn_module import TinyStreams, model, trainer

INTEGER = [torch.int32, torch.int16, torch.int8, torch.uint8]


class CastStreams(TinyStreams):
    """TinyStreams whose class targets come as ``dtype``."""

    def __init__(self, dtype, **kwargs):
        super().__init__(**kwargs)
        self.dtype = dtype

    def chunk(self, split, k, streams=None):
        batch = super().chunk(split, k, streams)
        return {**batch, "y": batch["y"].to(self.dtype)}


def chunk_of(y: torch.Tensor) -> dict:
    return {"x": torch.randn(*y.shape[:2], 3), "y": y, "chunk": torch.tensor(0)}


@pytest.mark.parametrize("dtype", INTEGER)
def test_integer_class_indices_are_read_as_int64(dtype):
    y = torch.randint(0, 4, (3, 5))
    chunk = read_chunk(chunk_of(y.to(dtype)), input_size=3, output_size=4, loss="cross_entropy")
    assert chunk.y.dtype == torch.long and torch.equal(chunk.y, y)


@pytest.mark.parametrize("dtype", INTEGER)
def test_the_step_loss_of_integer_class_indices_is_cross_entropy(dtype):
    outputs, y = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 3, 1, 2, 2, 1])
    mask = torch.tensor([True, True, False, True, True, False])
    expected = F.cross_entropy(outputs[mask], y[mask], reduction="sum")  # reference: PyTorch's, on int64
    torch.testing.assert_close(masked_loss_sum(outputs, y.to(dtype), mask, "cross_entropy"), expected)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8])
def test_training_on_integer_class_indices_equals_training_on_int64(dtype, tmp_path):
    start = model("tbptt")
    weights = {}
    for name, data in (("int64", TinyStreams()), ("cast", CastStreams(dtype))):
        module = copy.deepcopy(start)
        trainer(tmp_path / name, max_epochs=1).fit(module, data)
        assert module.global_step > 0
        weights[name] = [p.detach().clone() for p in module.parameters()]
    for a, b in zip(weights["int64"], weights["cast"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_targets_of_no_class_or_real_dtype_name_the_dtype_and_the_conversion(dtype):
    y = torch.zeros(3, 5, dtype=dtype)
    with pytest.raises(ValueError, match=rf"got a {dtype} tensor \(3, 5\); convert it with \.long\(\)") as info:
        read_chunk(chunk_of(y), input_size=3, output_size=4, loss="cross_entropy")
    assert "output_size=5" not in str(info.value)  # the steps are not the number of outputs


def test_float_class_indices_are_told_to_convert_with_long():
    y = torch.randint(0, 4, (3, 5)).float()
    match = r"float \(3, 5\) tensor.*if it holds class indices, convert it with \.long"
    with pytest.raises(ValueError, match=match) as info:
        read_chunk(chunk_of(y), input_size=3, output_size=4, loss="cross_entropy")
    assert "--model.init_args.output_size" not in str(info.value)


def test_float_targets_with_another_number_of_outputs_still_name_output_size():
    y = torch.rand(3, 5, 7)
    with pytest.raises(ValueError, match=r"set --model.init_args.output_size=7"):
        read_chunk(chunk_of(y), input_size=3, output_size=4, loss="cross_entropy")
