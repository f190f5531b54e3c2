"""ParameterLayout.views (the estimators' cheap unflatten of an estimate) equals ParameterLayout.unflatten."""

import pytest
import torch

from lightning_ortho.online import GRUCell, InfluenceBalancingCell, ParameterLayout, TanhRNNCell


@pytest.mark.parametrize("cell", [TanhRNNCell(3, 4), GRUCell(2, 3), InfluenceBalancingCell(units=5, positive=2)])
@pytest.mark.parametrize("kind", ["vector", "rows", "offset-rows", "transposed", "requires-grad"])
def test_views_equal_unflatten(cell, kind):
    layout = ParameterLayout(cell)
    base = torch.randn(4, layout.size + 3)
    flat = {
        "vector": base[1, 2 : 2 + layout.size].clone(),
        "rows": base[:, : layout.size].contiguous(),
        "offset-rows": base[:, 3:].contiguous()[1:],  # a contiguous view with a storage offset
        "transposed": base[:, : layout.size].clone().T.contiguous().T,  # not contiguous: the unflatten path
        "requires-grad": base[:, : layout.size].clone().requires_grad_(),
    }[kind]
    views, expected = layout.views(flat), layout.unflatten(flat)
    assert list(views) == list(expected) == [n for n, _ in cell.named_parameters()]
    for name, value in expected.items():
        assert views[name].shape == value.shape and torch.equal(views[name], value)
    if kind in ("vector", "rows", "offset-rows"):  # views: writes go through to flat
        first = next(iter(views.values()))
        first[(0,) * first.dim()] = 123.0
        assert (flat[0] if kind == "vector" else flat[0, 0]) == 123.0
