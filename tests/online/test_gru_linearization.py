"""GRUCell's closed-form products equal the generic torch.func path and dense autograd; RTRL and UORO on them
equal the generic path (and RTRL equals BPTT)."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.online import RTRL, UORO, GRUCell, ParameterLayout, StepLinearization, linearize
from lightning_ortho.online.gru_linearization import GRUStepLinearization

from . import references as ref

DTYPE = torch.float64
INPUTS, HIDDEN, B = 2, 3, 3
TIGHT = dict(rtol=1e-10, atol=1e-12)


def setup(seed: int = 0):
    torch.manual_seed(seed)
    cell = GRUCell(INPUTS, HIDDEN).to(DTYPE)
    g = torch.Generator().manual_seed(seed + 20)
    x = torch.randn(B, INPUTS, generator=g, dtype=DTYPE)
    h = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    return cell, x, h, ParameterLayout(cell), g


@pytest.mark.parametrize("seed", [0, 1])
def test_every_product_equals_the_generic_path(seed):
    cell, x, h, layout, g = setup(seed)
    fast, generic = linearize(cell, x, h, layout), StepLinearization(cell, x, h, layout)
    assert type(fast) is GRUStepLinearization
    v = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    cols = torch.randn(B, HIDDEN, 4, generator=g, dtype=DTYPE)
    n = torch.randn(B, layout.size, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.h_new, generic.h_new, **TIGHT)
    torch.testing.assert_close(fast.state_jvp(v), generic.state_jvp(v), **TIGHT)
    torch.testing.assert_close(fast.state_jvp_columns(cols), generic.state_jvp_columns(cols), **TIGHT)
    torch.testing.assert_close(fast.parameter_vjp(v), generic.parameter_vjp(v), **TIGHT)
    torch.testing.assert_close(fast.parameter_jvp(n), generic.parameter_jvp(n), **TIGHT)
    torch.testing.assert_close(fast.parameter_jacobian(), generic.parameter_jacobian(), **TIGHT)
    torch.testing.assert_close(fast.vjp_norm("parameter", v), generic.vjp_norm("parameter", v), **TIGHT)
    scale = torch.randn(B, generator=g, dtype=DTYPE)
    fast_out, generic_out = n.clone(), n.clone()
    fast.vjp_accumulate("parameter", fast_out, v, scale)
    generic.vjp_accumulate("parameter", generic_out, v, scale)
    torch.testing.assert_close(fast_out, generic_out, **TIGHT)


def test_products_equal_dense_autograd():
    cell, x, h, layout, _ = setup(2)
    fast = linearize(cell, x, h, layout)
    eye = torch.eye(HIDDEN, dtype=DTYPE).expand(B, -1, -1)
    torch.testing.assert_close(fast.state_jvp_columns(eye), ref.state_jacobian(cell, x, h), **TIGHT)
    torch.testing.assert_close(fast.parameter_jacobian(), ref.parameter_jacobian(cell, x, h), **TIGHT)


def test_no_preactivation_and_subclasses_take_the_generic_path():
    cell, x, h, layout, _ = setup()
    fast = linearize(cell, x, h, layout)
    with pytest.raises(ValueError, match="has no preactivation"):
        fast.preactivation  # noqa: B018
    with pytest.raises(ValueError, match="projection='state' or 'parameter'"):
        fast.vjp_norm("preactivation", h)

    class Custom(GRUCell):  # may change the step: not ours to linearise
        pass

    torch.manual_seed(0)
    custom = Custom(INPUTS, HIDDEN).to(DTYPE)
    assert type(linearize(custom, x, h, ParameterLayout(custom))) is StepLinearization


@pytest.mark.parametrize("projection", ["state", "parameter"])
def test_uoro_closed_form_equals_generic(projection):
    cell, _, _, _, _ = setup(3)
    xs, h0, cots = ref.sequence(cell, 4, B, seed=4)
    runs = []
    for flag in (True, False):
        est = UORO(cell, projection=projection, generator=5, closed_form=flag)
        state, rows = est.initial_state(h0), []
        for t in range(len(xs)):
            h, state = est.step(xs[t], state)
            grads = ref.flatten_dict(est.gradient(state, cots[t]), cell)
            rows.append((h, state.tensors["h_tilde"], state.tensors["w_tilde"], grads))
        runs.append(rows)
    for fast, generic in zip(*runs, strict=True):
        for got, expected in zip(fast, generic, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-11)


def test_rtrl_closed_form_equals_generic_and_bptt():
    cell, _, _, _, _ = setup(6)
    xs, h0, cots = ref.sequence(cell, 4, 2, seed=7)
    totals = []
    for flag in (True, False):
        est = RTRL(cell, closed_form=flag)
        state, total = est.initial_state(h0), 0.0
        for t in range(len(xs)):
            _, state = est.step(xs[t], state)
            total = total + ref.flatten_dict(est.gradient(state, cots[t]), cell)
        totals.append(total)
    expected = ref.bptt_gradient(cell, xs, h0, cots)
    torch.testing.assert_close(totals[0], expected, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(totals[1], expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_cell_matches_float64(dtype):
    cell, x, h, layout, g = setup(8)
    half = GRUCell(INPUTS, HIDDEN).to(dtype)
    half.load_state_dict({k: v.to(dtype) for k, v in cell.state_dict().items()})
    cell.load_state_dict({k: v.double() for k, v in half.state_dict().items()})  # the same rounded weights
    xh, hh = x.to(dtype), h.to(dtype)
    fast = linearize(half, xh, hh, ParameterLayout(half))
    wide = linearize(cell, xh.double(), hh.double(), layout)
    c = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE).to(dtype)
    assert fast.h_new.dtype == dtype
    loose = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fast.h_new.double(), wide.h_new, **loose)
    torch.testing.assert_close(fast.parameter_vjp(c).double(), wide.parameter_vjp(c.double()), **loose)
