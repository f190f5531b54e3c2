"""OnlineState.load_state_dict: another truncation window, NaN, malformed entries, old formats, the saved step count
(any integer-like, nothing else) and windows that no estimator saves."""

import io
import warnings

import numpy as np
import pytest
import torch

from lightning_ortho.online import RTRL, UORO, OnlineState, TanhRNNCell, TruncatedBPTT

DTYPE = torch.float64
B, INPUT, HIDDEN = 2, 2, 3


def _through_bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def _cell():
    torch.manual_seed(0)
    return TanhRNNCell(INPUT, HIDDEN).to(DTYPE)


def _inputs(steps):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(B, INPUT, dtype=DTYPE, generator=g) for _ in range(steps)]


def _run(est, steps, reset_at=None, state=None):
    state = state or est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    for t, x in enumerate(_inputs(steps)):
        if t == reset_at:
            state = est.reset(state, torch.tensor([True, False]))
        _, state = est.step(x, state)
    return state


def _load(est, saved):
    """Load ``saved`` into a fresh state of ``est``; return the state and the warnings given."""
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.load_state_dict(saved)
    return state, [str(w.message) for w in caught]


def test_a_longer_window_loads_as_the_last_k_steps_that_the_shorter_estimator_holds():
    cell = _cell()
    saved = _through_bytes(_run(TruncatedBPTT(cell, 5), 7, reset_at=5).state_dict())
    short = TruncatedBPTT(cell, 3)
    state, said = _load(short, saved)
    assert len(said) == 1 and "holds the last 5 steps, this state's estimator keeps 3" in said[0]
    reference = _run(short, 7, reset_at=5)  # the k=3 estimator over the same steps: an independent reference
    assert state.tensors.keys() == reference.tensors.keys()
    for key, value in reference.tensors.items():
        assert torch.equal(state.tensors[key], value), key
    grad_h = torch.randn(B, HIDDEN, dtype=DTYPE, generator=torch.Generator().manual_seed(2))
    for name, g in short.gradient(reference, grad_h, per_stream=True).items():
        torch.testing.assert_close(short.gradient(state, grad_h, per_stream=True)[name], g, rtol=0, atol=0)


def test_a_shorter_window_loads_as_is_and_says_it_fills_up():
    cell = _cell()
    saved = _run(TruncatedBPTT(cell, 3), 6).state_dict()
    state, said = _load(TruncatedBPTT(cell, 5), saved)
    assert len(said) == 1 and "holds 3 steps after 6 steps: it was saved with a window of 3 steps" in said[0]
    assert state.tensors["inputs"].shape == (B, 3, INPUT) and state.step == 6


@pytest.mark.parametrize("saved_k, steps", [(3, 6), (5, 2), (3, 0)])
def test_a_window_that_fits_loads_without_a_warning(saved_k, steps):
    # the same k, or fewer steps than either window holds (the windows are alike)
    cell = _cell()
    saved = _run(TruncatedBPTT(cell, saved_k), steps).state_dict()
    state, said = _load(TruncatedBPTT(cell, 3), saved)
    assert said == [] and state.tensors["inputs"].shape[1] == min(steps, 3)


def test_an_old_fresh_truncated_bptt_state_with_an_empty_window_of_no_width_loads():
    # Saved before its first step by an older version: inputs (B, 0, 0) whatever the cell's input size.
    cell = _cell()
    est = TruncatedBPTT(cell, 3)
    saved = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE)).state_dict()
    saved["tensors"]["inputs"] = torch.zeros(B, 0, 0, dtype=DTYPE)
    saved.pop("kind")
    state, said = _load(est, saved)
    assert said == [] and state.tensors["inputs"].shape == (B, 0, INPUT)
    for x in _inputs(4):
        _, state = est.step(x, state)
    reference = _run(est, 4)
    for key, value in reference.tensors.items():
        assert torch.equal(state.tensors[key], value), key


def test_window_entries_of_different_lengths_are_refused():
    cell = _cell()
    saved = _run(TruncatedBPTT(cell, 3), 4).state_dict()
    saved["tensors"]["starts"] = saved["tensors"]["starts"][:, 1:]
    with pytest.raises(ValueError, match=r"window entries hold \{.*\} steps; a window holds the same number"):
        _load(TruncatedBPTT(cell, 3), saved)


ESTIMATORS = {
    "rtrl": (lambda cell: RTRL(cell), "influence"),
    "tbptt": (lambda cell: TruncatedBPTT(cell, 3), "starts"),
    "uoro": (lambda cell: UORO(cell, generator=0), "w_tilde"),
}


@pytest.mark.parametrize("kind", list(ESTIMATORS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_in_the_saved_state_is_refused_and_leaves_the_state_alone(kind, bad):
    make, entry = ESTIMATORS[kind]
    est = make(_cell())
    for where in ("h", entry):
        saved = _run(est, 2).state_dict()
        target = saved["h"] if where == "h" else saved["tensors"][entry]
        target.view(-1)[0] = bad
        state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
        before = state.state_dict()
        name = "h \\(the hidden states\\)" if where == "h" else f"entry '{entry}'"
        with pytest.raises(ValueError, match=rf"the saved {name} holds NaN/inf values: .* diverged"):
            state.load_state_dict(saved)
        assert torch.equal(state.h, before["h"]) and state.step == 0


def _malformed(saved):
    state = dict(saved)
    return {
        "h-list": ({**state, "h": [[0.0] * HIDDEN] * B}, r"the saved hidden states h are list"),
        "tensors-list": (
            {**state, "tensors": {k: [[0.0]] for k in state["tensors"]}},
            r"'tensors' must map entry names to tensors .*'list'",
        ),
        "tensors-not-dict": ({**state, "tensors": [1, 2]}, r"'tensors' must map entry names to tensors"),
        "step-str": ({**state, "step": "x"}, r"'step' must be a non-negative integer .* got 'x'"),
        "step-negative": ({**state, "step": torch.tensor(-1)}, r"'step' must be a non-negative integer"),
        "step-float": ({**state, "step": torch.tensor(1.5)}, r"'step' must be a non-negative integer"),
        "kind-int": ({**state, "kind": 3}, r"'kind' must be an estimator's name or None, got 3"),
    }


MALFORMED = ["h-list", "tensors-list", "tensors-not-dict", "step-str", "step-negative", "step-float", "kind-int"]


@pytest.mark.parametrize("case", MALFORMED)
@pytest.mark.parametrize("kind", list(ESTIMATORS))
def test_malformed_saved_states_are_clear_errors(kind, case):
    est = ESTIMATORS[kind][0](_cell())
    saved, match = _malformed(_run(est, 2).state_dict())[case]
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    with pytest.raises(ValueError, match=match):
        state.load_state_dict(saved)
    assert state.step == 0


@pytest.mark.parametrize("junk", [torch.zeros(3, dtype=torch.uint8), [1, 2, 3], torch.zeros(5056)])
def test_a_bad_generator_state_is_a_clear_error_and_leaves_the_generator_alone(junk):
    est = UORO(_cell(), generator=0)
    saved = _run(est, 2).state_dict()
    saved["generator"] = junk
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    before = state.generator.get_state()
    with pytest.raises(ValueError, match=r"the saved generator state does not fit this state's cpu noise generator"):
        state.load_state_dict(saved)
    assert torch.equal(state.generator.get_state(), before) and state.step == 0


def test_a_hand_made_state_still_takes_any_entries_but_not_nan():
    saved = _run(RTRL(_cell()), 2).state_dict()
    state = OnlineState(torch.zeros(B, HIDDEN, dtype=DTYPE))
    state.load_state_dict(saved)
    assert sorted(state.tensors) == ["influence"] and state.step == 2
    saved["tensors"]["influence"][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="entry 'influence' holds NaN/inf"):
        OnlineState(torch.zeros(B, HIDDEN, dtype=DTYPE)).load_state_dict(saved)


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
    est = TruncatedBPTT(_cell(), 3)
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
    est = TruncatedBPTT(_cell(), 3)
    saved = _run(est, 3).state_dict()
    state = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE))
    with pytest.raises(ValueError, match=r"the saved 'step' must be a non-negative integer .*" + shown):
        state.load_state_dict({**saved, "step": step})
    assert state.step == 0 and state.tensors["inputs"].shape[1] == 0  # left as it was


def test_an_empty_window_after_steps_is_said_to_be_made_by_hand_and_fills_up():
    est = TruncatedBPTT(_cell(), 3)
    saved = est.initial_state(torch.zeros(B, HIDDEN, dtype=DTYPE)).state_dict()  # an empty window ...
    saved["step"] = torch.tensor(5)  # ... after 5 steps: no estimator saves this
    state, said = _load(est, saved)
    assert len(said) == 1
    assert "the saved window is empty after 5 steps" in said[0] and "made by hand or is damaged" in said[0]
    assert "k=0" not in said[0] and "fills up over the next 3 steps" in said[0]
    assert state.step == 5 and state.tensors["inputs"].shape == (B, 0, INPUT)
    state = _run(est, 4, state=state)
    assert state.step == 9 and state.tensors["inputs"].shape == (B, 3, INPUT)  # full again, as said


def test_a_window_holding_more_steps_than_were_taken_is_said_to_be_made_by_hand():
    est = TruncatedBPTT(_cell(), 3)
    saved = _run(est, 3).state_dict()
    saved["step"] = torch.tensor(1)
    state, said = _load(est, saved)
    assert len(said) == 1 and "holds 3 steps after only 1 steps, more than were taken" in said[0]
    assert state.step == 1 and state.tensors["inputs"].shape == (B, 3, INPUT)  # loaded as it is


@pytest.mark.parametrize("steps", [0, 2, 3, 7])
def test_windows_that_an_estimator_saves_load_without_a_warning(steps):
    est = TruncatedBPTT(_cell(), 3)
    state, said = _load(est, _run(est, steps).state_dict())
    assert said == [] and state.tensors["inputs"].shape[1] == min(steps, 3) and state.step == steps
