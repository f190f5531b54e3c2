"""What an overflow message blames: an input whose norm overflows its dtype is named (tensor, stream, step, what to
do), not the recurrent Jacobian; and the ``eps`` of the randomised estimators is positive and finite."""

import math

import pytest
import torch

from lightning_ortho.online import KFRTRL, UORO, TanhRNNCell

B, INPUT, HIDDEN = 3, 4, 5

NORMED = {  # the estimators whose rescaling divides by norms of the step's inputs
    "uoro-state-fused": lambda cell, **kw: UORO(cell, generator=0, **kw),
    "uoro-state": lambda cell, **kw: UORO(cell, generator=0, fused=False, **kw),
    "uoro-preactivation-fused": lambda cell, **kw: UORO(cell, projection="preactivation", generator=0, **kw),
    "uoro-preactivation": lambda cell, **kw: UORO(cell, projection="preactivation", generator=0, fused=False, **kw),
    "uoro-none": lambda cell, **kw: UORO(cell, projection="none", generator=0, **kw),
    "kf_rtrl": lambda cell, **kw: KFRTRL(cell, generator=0, **kw),
}


def cell32() -> TanhRNNCell:
    torch.manual_seed(0)
    return TanhRNNCell(INPUT, HIDDEN)


@pytest.mark.parametrize("kind", list(NORMED))
def test_an_input_whose_norm_overflows_is_named_at_step_1(kind):
    est = NORMED[kind](cell32())
    state = est.initial_state(torch.zeros(B, HIDDEN))
    x = torch.randn(B, INPUT)
    x[1] = 2e19  # finite in float32 (largest 3.4e38), but its squared norm is not
    assert torch.isfinite(x).all() and not torch.isfinite(torch.linalg.vector_norm(x[1]))
    with pytest.raises(FloatingPointError) as caught:
        est.step(x, state)
    message = str(caught.value)
    assert "overflowed at step 1" in message
    assert "the input x of stream 1 (row 1 of x) is too large for float32: its norm overflows" in message
    assert "largest entry is 2e+19" in message and "float64" in message and "rescale the inputs" in message
    assert "expansive" not in message


@pytest.mark.parametrize("kind", ["uoro-none", "kf_rtrl"])
def test_an_overflow_at_step_1_is_not_blamed_on_the_recurrence(kind):
    # Neither ||x|| nor ||h0|| overflows alone, but ||[h0; x; 1]|| (the factor a of z = W a) does.
    est = NORMED[kind](cell32())
    big = 1.5e19 / math.sqrt(HIDDEN)  # ||h0 row|| = 1.5e19; squared 2.25e38 < 3.4e38
    state = est.initial_state(torch.full((B, HIDDEN), big))
    x = torch.full((B, INPUT), 1.5e19 / math.sqrt(INPUT))
    with pytest.raises(FloatingPointError) as caught:
        est.step(x, state)
    message = str(caught.value)
    assert "overflowed at step 1, where it holds only the immediate derivatives" in message
    assert "the recurrence is not the cause" in message and "float64" in message
    assert "expansive" not in message


def test_an_overflow_with_finite_inputs_after_step_1_still_blames_the_recurrence():
    est = NORMED["kf_rtrl"](cell32())
    state = est.initial_state(torch.zeros(B, HIDDEN))
    _, state = est.step(torch.randn(B, INPUT), state)
    tensors = dict(state.tensors, hidden_factor=torch.full_like(state.tensors["hidden_factor"], float("inf")))
    with pytest.raises(FloatingPointError, match="overflowed at step 2 .the recurrent Jacobian has been expansive"):
        est._check_finite_step(state.h, tensors, 2, inputs={"x": torch.randn(B, INPUT), "h": state.h})


@pytest.mark.parametrize("owner", [UORO, KFRTRL])
@pytest.mark.parametrize("eps", [0, 0.0, -1e-7, math.inf, -math.inf, math.nan, True, "1e-7", None])
def test_eps_must_be_positive_and_finite(owner, eps):
    with pytest.raises(ValueError, match=rf"{owner.__name__}: eps must be a positive finite number.*got eps="):
        owner(cell32(), eps=eps)


@pytest.mark.parametrize("owner", [UORO, KFRTRL])
def test_a_positive_finite_eps_is_taken(owner):
    assert owner(cell32(), eps=1).eps == 1.0 and isinstance(owner(cell32(), eps=1).eps, float)
    est = owner(cell32().double(), eps=1e-300)  # float64 holds it: the first step's ratios are eps / eps = 1
    h, _ = est.step(torch.randn(B, INPUT, dtype=torch.float64), est.initial_state(torch.zeros(B, HIDDEN).double()))
    assert torch.isfinite(h).all()


@pytest.mark.parametrize("kind", list(NORMED))
def test_an_eps_that_rounds_to_zero_in_the_dtype_is_named(kind):
    est = NORMED[kind](cell32(), eps=1e-300)  # positive and finite, but 0 in float32: the first ratios are 0 / 0
    with pytest.raises(FloatingPointError, match=r"at step 1: eps=1e-300 rounds to zero in float32.*1.18e-38"):
        est.step(torch.randn(B, INPUT), est.initial_state(torch.zeros(B, HIDDEN)))
