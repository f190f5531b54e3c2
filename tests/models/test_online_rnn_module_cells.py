"""OnlineRNNModule refuses, when it is built, a cell its estimator cannot train: the reason and the estimators that can
train the cell, as the estimator itself says."""

import pytest
import torch

from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import LinearRecurrentUnit, TanhRNNCell

LRU_TRAINERS = (
    "Estimators that can train LinearRecurrentUnit: DiagonalRTRL (OnlineRNNModule's estimator='diagonal_rtrl')."
)


@pytest.mark.parametrize(
    ("estimator", "options"),
    [
        ("uoro", {}),
        ("uoro", {"projection": "preactivation"}),
        ("rtrl", {}),
        ("tbptt", {"k": 3}),
        ("tbptt", {}),  # the cell's reason before the missing k
        ("rflo", {"tau": 4.0}),
        ("snap", {}),
        ("kf_rtrl", {}),
    ],
)
def test_the_lru_is_refused_with_the_reason_and_the_estimator_that_trains_it(estimator, options):
    with pytest.raises(ValueError) as info:
        OnlineRNNModule(LinearRecurrentUnit(2, 3), output_size=2, estimator=estimator, estimator_options=options)
    message = str(info.value)
    assert "the state of LinearRecurrentUnit is complex (complex_state = True)" in message, message
    assert message.endswith(LRU_TRAINERS), message
    for wrong in ("convert it with .float()", "jacrev", "Use UORO or RTRL", "needs the truncation length"):
        assert wrong not in message


def test_the_lru_is_taken_by_diagonal_rtrl():
    module = OnlineRNNModule(LinearRecurrentUnit(2, 3), output_size=2, estimator="diagonal_rtrl")
    assert type(module.estimator).__name__ == "DiagonalRTRL"


def test_a_cell_whose_forward_is_not_its_factorisation_is_refused_by_kf_rtrl_only():
    class HalfLeakyTanh(TanhRNNCell):
        def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return 0.5 * h + 0.5 * super().forward(x, h)

    trainers = "Estimators that can train HalfLeakyTanh: RFLO, RTRL, SnAp, TruncatedBPTT, UORO"
    with pytest.raises(ValueError, match=trainers):
        OnlineRNNModule(HalfLeakyTanh(2, 3), output_size=2, estimator="kf_rtrl")
    for estimator, options in [("uoro", {}), ("rtrl", {}), ("tbptt", {"k": 2}), ("rflo", {"tau": 1.0}), ("snap", {})]:
        OnlineRNNModule(HalfLeakyTanh(2, 3), output_size=2, estimator=estimator, estimator_options=options)
