"""``compress_model(max_accuracy_drop=..., confidence=...)``: a candidate is accepted only where its drop plus ``z``
paired standard errors fits the budget. References: the drop and its standard error recounted by hand from the
model's outputs, ``z`` from :class:`statistics.NormalDist`."""

from __future__ import annotations

import copy
import math
import statistics

import pytest
import torch

from lightning_ortho.transforms import compress_model
from lightning_ortho.transforms.model_compression import paired_drop
from tests.transforms.test_compression_budget import _trained_classifier


def test_the_paired_drop_and_its_standard_error_come_from_the_disagreements():
    dense = torch.tensor([1, 1, 1, 1, 0, 0, 1, 1], dtype=torch.float64)
    candidate = torch.tensor([1, 0, 1, 1, 1, 0, 0, 1], dtype=torch.float64)
    drop, error = paired_drop(dense, candidate)
    differences = [0, 1, 0, 0, -1, 0, 1, 0]
    assert drop == pytest.approx(100 * 1 / 8)
    assert error == pytest.approx(100 * statistics.stdev(differences) / math.sqrt(8))
    assert paired_drop(dense, dense) == (0.0, 0.0)  # no disagreement: nothing measured, no noise
    assert paired_drop(dense[:1], candidate[:1]) == (0.0, 0.0)  # one sample: no spread to estimate


def _correct(model, batches):
    with torch.no_grad():
        return torch.cat([(model(x).argmax(-1) == y).double() for x, y in batches])


@pytest.mark.parametrize("confidence", [None, 0.9])
def test_the_model_kept_fits_the_budget_with_the_margin_asked_for(confidence):
    model, batches = _trained_classifier()
    dense = copy.deepcopy(model)
    budget = 3.0
    result = compress_model(
        model, batches, max_accuracy_drop=budget, confidence=confidence, generator=torch.Generator().manual_seed(6)
    )
    assert result.met and any(row.compressed for row in result.layers)
    c_dense, c_kept = _correct(dense, batches), _correct(model, batches)
    drop = 100 * float(c_dense.mean() - c_kept.mean())
    differences = (c_dense - c_kept).tolist()
    error = 100 * statistics.stdev(differences) / math.sqrt(len(differences))
    z = 0.0 if confidence is None else statistics.NormalDist().inv_cdf(confidence)
    assert drop + z * error <= budget + 1e-9
    assert result.metric_after == pytest.approx(float(c_kept.mean()))
    assert ("confidence" in result.budget) == (confidence is not None)
    if confidence is not None:
        assert "at 0.9 confidence" in result.budget


def test_a_confidence_needs_the_accuracy_budget_and_a_probability():
    model, batches = _trained_classifier()
    with pytest.raises(ValueError, match="max_accuracy_drop and the default metric"):
        compress_model(model, [x for x, _ in batches], max_output_error=5.0, confidence=0.9)
    with pytest.raises(ValueError, match="max_accuracy_drop and the default metric"):
        compress_model(model, batches, max_accuracy_drop=1.0, confidence=0.9, metric=lambda outputs, targets: 1.0)
    for wrong in (0.4, 1.0, True, "0.9"):
        with pytest.raises(ValueError, match=r"in \[0.5, 1\)"):
            compress_model(model, batches, max_accuracy_drop=1.0, confidence=wrong)
