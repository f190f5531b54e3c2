"""OnlineRNNModule(estimator="diagonal_rtrl") refuses a cell whose recurrence is diagonal only at its current
weights (one update would make it dense and every later estimate wrong), up front, before any training."""

import pytest
import torch

from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import TanhRNNCell


def test_a_tanh_cell_with_a_diagonal_weight_is_refused_up_front():
    torch.manual_seed(0)
    cell = TanhRNNCell(3, 5)
    with torch.no_grad():
        cell.weight_hh.copy_(torch.diag(torch.linspace(-0.5, 0.5, 5)))
    with pytest.raises(ValueError, match=r"TanhRNNCell does not declare a diagonal recurrence.*RTRL \(exact\), UORO"):
        OnlineRNNModule(cell, 4, estimator="diagonal_rtrl")
    OnlineRNNModule(cell, 4, estimator="rtrl")  # the exact estimator for any cell takes it
