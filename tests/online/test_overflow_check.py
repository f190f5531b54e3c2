"""The overflow check of ``step`` fires on NaN/inf entries only: never on finite ones, in every dtype."""

import pytest
import torch

from lightning_ortho.online import RTRL, UORO, TanhRNNCell, TruncatedBPTT

B, INPUT, HIDDEN = 32, 8, 16

ESTIMATORS = {
    "rtrl": lambda cell: RTRL(cell),
    "tbptt": lambda cell: TruncatedBPTT(cell, 10),
    "uoro-state-gir": lambda cell: UORO(cell, generator=0),
    "uoro-parameter-fixed": lambda cell: UORO(cell, projection="parameter", rescaling=(0.5, None), generator=0),
    "uoro-none": lambda cell: UORO(cell, projection="none", generator=0),
}


def silent_cell(dtype):
    """A cell with zero weights: ``h_t = tanh(0) = 0`` whatever ``x``, so every Jacobian entry is an input value
    or 1 and no state can overflow; the influence approximations hold copies of the (large, finite) inputs."""
    cell = TanhRNNCell(INPUT, HIDDEN).to(dtype)
    with torch.no_grad():
        for p in cell.parameters():
            p.zero_()
    return cell


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_truncated_bptt_window_of_large_finite_inputs_is_not_an_overflow(dtype):
    # 32 streams x 8 features x 30 = 7680 per step: the window's sum passes float16's 65504 at step 9.
    est = ESTIMATORS["tbptt"](silent_cell(dtype))
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=dtype))
    for _ in range(12):
        _, state = est.step(torch.full((B, INPUT), 30.0, dtype=dtype), state)
    assert float(state.tensors["inputs"].double().sum()) > torch.finfo(torch.float16).max  # the case of the check
    assert all(torch.isfinite(v).all() for v in state.tensors.values() if v.is_floating_point())


def test_rtrl_influence_of_large_finite_entries_is_not_an_overflow():
    # With zero weights the influence is J^h_theta: the inputs (30) in the weight_ih block, 1 in the bias block;
    # 32 streams x 16 units x (8 x 30 + 1) = 123392 > 65504.
    est = ESTIMATORS["rtrl"](silent_cell(torch.float16))
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=torch.float16))
    for _ in range(3):
        _, state = est.step(torch.full((B, INPUT), 30.0, dtype=torch.float16), state)
    influence = state.tensors["influence"]
    assert float(influence.double().sum()) == B * HIDDEN * (INPUT * 30 + 1)
    assert torch.isfinite(influence).all()


def _big_finite_like(tensors, dtype):
    """Each floating entry filled with a finite value of ``dtype`` whose sum over the entry overflows ``dtype``."""
    top = torch.finfo(dtype).max
    out = {}
    for name, value in tensors.items():
        if value.is_floating_point():
            fill = top / 2 if value.numel() < 4 else min(top / 2, 4 * top / value.numel())
            out[name] = torch.full_like(value, fill)
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("kind", list(ESTIMATORS))
def test_the_check_passes_finite_entries_whose_sum_overflows_and_catches_nan_and_inf(kind, dtype):
    torch.manual_seed(0)
    est = ESTIMATORS[kind](TanhRNNCell(INPUT, HIDDEN).to(dtype))
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=dtype))
    for _ in range(2):  # the state's entries at their full shapes (the window of truncated BPTT fills up)
        _, state = est.step(torch.randn(B, INPUT).to(dtype), state)
    big = _big_finite_like(state.tensors, dtype)
    watched = [n for n, v in est._watched_tensors(big).items() if v.is_floating_point() and v.numel()]
    assert watched and all(not torch.isfinite(big[n].sum()) for n in watched)  # a sum in the dtype overflows
    est._check_finite_step(state.h, big, step=3)  # finite entries: no error
    for bad in (float("inf"), float("-inf"), float("nan")):
        for name in watched:
            broken = dict(big)
            broken[name] = big[name].clone()
            broken[name].view(-1)[-1] = bad
            with pytest.raises(FloatingPointError, match=rf"influence approximation '{name}' overflowed at step 3"):
                est._check_finite_step(state.h, broken, step=3)
        h = state.h.clone()
        h[0, 0] = bad
        with pytest.raises(FloatingPointError, match=r"the cell produced NaN/inf states at step 3"):
            est._check_finite_step(h, big, step=3)
