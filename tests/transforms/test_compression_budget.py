"""Compression to a budget: ``compress_linear/compress_conv(max_error=...)`` find the smallest ``s`` that meets it,
``compress_model`` a whole model to ``max_accuracy_drop`` or ``max_output_error``. References: the errors recomputed
from the layers' outputs, an exhaustive scan of ``s``, accuracy counted by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_ortho.transforms import compress_conv, compress_linear, compress_model
from lightning_ortho.transforms.sparsity_search import search_sparsity, sparsity_ladder


def test_the_ladder_steps_by_at_most_half_and_ends_at_n():
    assert sparsity_ladder(1) == [1]
    assert sparsity_ladder(20) == [1, 2, 3, 4, 6, 8, 12, 16, 20]
    ladder = sparsity_ladder(784)
    assert ladder[:2] == [1, 2] and ladder[-1] == 784
    assert all(b <= 1.5 * a for a, b in zip(ladder[1:], ladder[2:], strict=False))  # steps of at most half from 2 on


def test_the_search_finds_the_smallest_s_on_the_ladder_that_meets_the_budget():
    errors = {s: 100 / s for s in sparsity_ladder(64)}  # falls with s
    for budget in (150, 30, 10, 2, 1.5625):
        found = search_sparsity(lambda s: _Tagged(s), lambda m: errors[m.s], 64, budget)
        smallest = min(s for s in sparsity_ladder(64) if errors[s] <= budget)
        assert found.met and found.s == smallest and set(found.tried) <= set(errors)
    unreachable = search_sparsity(lambda s: _Tagged(s), lambda m: errors[m.s], 64, 0.5)
    assert not unreachable.met and unreachable.s == 64
    with pytest.raises(ValueError, match="positive"):
        search_sparsity(lambda s: _Tagged(s), lambda m: 0.0, 64, 0)


class _Tagged(nn.Module):
    def __init__(self, s: int) -> None:
        super().__init__()
        self.s = s


@pytest.mark.parametrize("with_data", [False, True])
def test_compress_linear_meets_max_error_at_the_smallest_s(with_data):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40).double()
    data = torch.randn(400, 24, dtype=torch.float64) if with_data else None
    compressed = compress_linear(layer, max_error=20.0, data=data, generator=torch.Generator().manual_seed(1))
    report = compressed.report
    if with_data:  # the output error recomputed from the outputs
        with torch.no_grad():
            error = 100 * (compressed(data) - layer(data)).square().sum() / layer(data).square().sum()
        assert report.output_error == pytest.approx(float(error), rel=1e-6)
    figure = report.output_error if with_data else report.error
    assert figure <= 20.0 and report.max_error == 20.0
    searched = dict(report.searched)
    assert searched[report.s] == pytest.approx(figure)
    # the s just below on the ladder, where tried, missed the budget
    below = [s for s in sparsity_ladder(24) if s < report.s]
    assert not below or below[-1] not in searched or searched[below[-1]] > 20.0
    with pytest.raises(ValueError, match="not both"):
        compress_linear(layer, s=3, max_error=5.0)


def test_compress_conv_meets_max_error():
    torch.manual_seed(2)
    conv = nn.Conv2d(8, 12, 3, padding=1).double()
    data = torch.randn(16, 8, 6, 6, dtype=torch.float64)
    compressed = compress_conv(conv, max_error=15.0, data=data, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        error = float(100 * (compressed(data) - conv(data)).square().sum() / conv(data).square().sum())
    assert error <= 15.0 and compressed.report.output_error == pytest.approx(error, rel=1e-6)


def _trained_classifier():
    """A small CNN trained on a learnable synthetic task (labels from a random teacher)."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(600, 3, 6, 6, generator=generator)
    y = (x.flatten(1) @ torch.randn(108, 5, generator=generator)).argmax(-1)
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise: stays dense
        nn.AvgPool2d(3),
        nn.Flatten(),
        nn.Linear(16 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 5),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        for i in range(0, 400, 100):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[i : i + 100]), y[i : i + 100]).backward()
            optimizer.step()
    return model, [(x[i : i + 100], y[i : i + 100]) for i in range(400, 600, 100)]


def _accuracy(model, batches):
    with torch.no_grad():
        hits = sum(int((model(x).argmax(-1) == y).sum()) for x, y in batches)
    return hits / sum(len(y) for _, y in batches)


def test_compress_model_keeps_the_accuracy_drop_within_the_budget_and_says_what_it_did():
    model, batches = _trained_classifier()
    before = _accuracy(model, batches)
    result = compress_model(model, batches, max_accuracy_drop=2.0, generator=torch.Generator().manual_seed(6))
    after = _accuracy(model, batches)
    assert result.model is model and result.met
    assert result.metric_before == pytest.approx(before) and result.metric_after == pytest.approx(after)
    assert 100 * (before - after) <= 2.0
    rows = {row.name: row for row in result.layers}
    assert set(rows) == {"0", "2", "5", "7"}
    assert not rows["2"].compressed and "groups=16" in rows["2"].reason
    compressed = [row for row in rows.values() if row.compressed]
    assert compressed and all(
        type(model.get_submodule(row.name)).__name__.startswith("Factorized") for row in compressed
    )
    assert all(row.ops_after.total < row.ops_before.total for row in compressed)
    for row in compressed:  # the table's s and m are those of the layer installed
        layer = model.get_submodule(row.name)
        assert (row.s, row.blocks) == (layer.report.s, layer.report.blocks)
        assert row.blocks == layer.transform.num_blocks
    assert rows["2"].blocks is None
    assert result.ops_before.total == sum(row.ops_before.total for row in rows.values())
    # a per-image count: the first convolution over 6 x 6 positions, 16 outputs of 3 * 9 inputs
    assert rows["0"].ops_before.multiplications == 36 * 16 * 27
    # the budget chosen is one of those tried; the refinement's steps follow it, the last one kept being the model's
    assert result.layer_budget in dict(result.tried)
    assert any(after == pytest.approx(figure) for _, figure in result.tried)  # the model kept was one scored
    assert result.record_finetuned() == pytest.approx(after)  # no fine-tuning yet: the same figure
    assert "fine-tuned" in result.table().title


def test_compress_model_to_an_output_error():
    model, batches = _trained_classifier()
    inputs = [x for x, _ in batches]
    with torch.no_grad():
        reference = torch.cat([model(x) for x in inputs])
    result = compress_model(model, inputs, max_output_error=5.0, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        error = float(
            100 * (torch.cat([model(x) for x in inputs]) - reference).square().sum() / reference.square().sum()
        )
    assert result.met and error <= 5.0 and result.metric_after == pytest.approx(error, rel=1e-6)


def test_compress_model_refuses_what_it_cannot_score():
    model, batches = _trained_classifier()
    with pytest.raises(ValueError, match="one budget"):
        compress_model(model, batches)
    with pytest.raises(ValueError, match="targets"):
        compress_model(model, [x for x, _ in batches], max_accuracy_drop=1.0)
    with pytest.raises(ValueError, match="no Linear or convolution named"):
        compress_model(model, batches, max_accuracy_drop=1.0, modules=["8"])
