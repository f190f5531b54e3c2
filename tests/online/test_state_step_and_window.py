"""OnlineState.load_state_dict: the saved step count may be any integer-like (and nothing else), and a window that
no estimator saves is said to be one, not blamed on a window of 0 steps."""

import warnings

import numpy as np
import pytest
import torch

from lightning_ortho.online import TanhRNNCell, TruncatedBPTT

DTYPE = torch.float64
B, INPUT, HIDDEN = 2, 2, 3


def _estimator(k=3):
    torch.manual_seed(0)
    return TruncatedBPTT(TanhRNNCell(INPUT, HIDDEN).to(DTYPE), k)


def _inputs(steps):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(B, INPUT, dtype=DTYPE, generator=g) for _ in range(steps)]


def _run(est, steps, state=None):
    state = state or est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    for x in _inputs(steps):
        _, state = est.step(x, state)
    return state


def _load(est, saved):
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.load_state_dict(saved)
    return state, [str(w.message) for w in caught]


INTEGER_LIKES = {
    "int": 3,
    "np.int64": np.int64(3),
    "np.int32": np.int32(3),
    "np.uint8": np.uint8(3),
    "int32-tensor": torch.tensor(3, dtype=torch.int32),
    "int16-tensor": torch.tensor(3, dtype=torch.int16),
    "uint8-tensor": torch.tensor(3, dtype=torch.uint8),
}


@pytest.mark.parametrize("step", INTEGER_LIKES.values(), ids=INTEGER_LIKES.keys())
def test_a_step_given_as_any_integer_like_loads_as_that_int(step):
    est = _estimator()
    saved = _run(est, 3).state_dict()
    state, said = _load(est, {**saved, "step": step})
    assert said == [] and type(state.step) is int and state.step == 3
    _, state = est.step(_inputs(1)[0], state)
    assert state.step == 4


NOT_COUNTS = {
    "float": (3.0, r"got 3\.0 \(float\)"),
    "np.float64": (np.float64(3.0), r"got np\.float64\(3\.0\) \(float64\)"),
    "float-tensor": (torch.tensor(3.0), r"got tensor\(3\.\) \(torch\.float32 tensor of shape \(\)\)"),
    "bool": (True, r"got True \(bool\)"),
    "bool-tensor": (torch.tensor(True), r"got tensor\(True\) \(torch\.bool tensor"),
    "negative": (np.int64(-1), r"got np\.int64\(-1\) \(int64\)"),
    "two-entries": (torch.tensor([1, 2]), r"\(torch\.int64 tensor of shape \(2,\)\)"),
    "str": ("3", r"got '3' \(str\)"),
    "none": (None, r"got None \(NoneType\)"),
}


@pytest.mark.parametrize("step, shown", NOT_COUNTS.values(), ids=NOT_COUNTS.keys())
def test_a_step_that_is_no_count_of_steps_is_refused_naming_what_was_given(step, shown):
    est = _estimator()
    saved = _run(est, 3).state_dict()
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    with pytest.raises(ValueError, match=r"the saved 'step' must be a non-negative integer .*" + shown):
        state.load_state_dict({**saved, "step": step})
    assert state.step == 0 and state.tensors["inputs"].shape[1] == 0  # left as it was


def test_an_empty_window_after_steps_is_said_to_be_made_by_hand_and_fills_up():
    est = _estimator(k=3)
    saved = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE)).state_dict()  # an empty window ...
    saved["step"] = torch.tensor(5)  # ... after 5 steps: no estimator saves this
    state, said = _load(est, saved)
    assert len(said) == 1
    assert "the saved window is empty after 5 steps" in said[0] and "made by hand or is damaged" in said[0]
    assert "k=0" not in said[0] and "fills up over the next 3 steps" in said[0]
    assert state.step == 5 and state.tensors["inputs"].shape == (B, 0, INPUT)
    state = _run(est, 4, state)
    assert state.step == 9 and state.tensors["inputs"].shape == (B, 3, INPUT)  # full again, as said


def test_a_window_holding_more_steps_than_were_taken_is_said_to_be_made_by_hand():
    est = _estimator(k=3)
    saved = _run(est, 3).state_dict()
    saved["step"] = torch.tensor(1)
    state, said = _load(est, saved)
    assert len(said) == 1 and "holds 3 steps after only 1 steps, more than were taken" in said[0]
    assert state.step == 1 and state.tensors["inputs"].shape == (B, 3, INPUT)  # loaded as it is


@pytest.mark.parametrize("steps", [0, 2, 3, 7])
def test_windows_that_an_estimator_saves_load_without_a_warning(steps):
    est = _estimator(k=3)
    state, said = _load(est, _run(est, steps).state_dict())
    assert said == [] and state.tensors["inputs"].shape[1] == min(steps, 3) and state.step == steps
