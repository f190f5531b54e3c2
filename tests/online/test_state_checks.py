"""OnlineState.load_state_dict refuses a saved state that does not fit, and says what differs."""

import io
import itertools

import pytest
import torch

from lightning_ortho.online import RTRL, UORO, TanhRNNCell, TruncatedBPTT

DTYPE = torch.float64
INPUT, HIDDEN = 2, 3

ESTIMATORS = {
    "rtrl": lambda cell: RTRL(cell),
    "tbptt": lambda cell: TruncatedBPTT(cell, 3),
    "uoro": lambda cell: UORO(cell, generator=0),
}


def _through_bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def saved_state(kind, streams=2, cell=None, steps=2, **options):
    torch.manual_seed(0)
    cell = cell or TanhRNNCell(INPUT, HIDDEN).to(DTYPE)
    est = ESTIMATORS[kind](cell) if not options else UORO(cell, generator=0, **options)
    state = est.initial_state(torch.zeros(streams, cell.hidden_size, dtype=DTYPE))
    for _ in range(steps):
        _, state = est.step(torch.randn(streams, cell.input_size, dtype=DTYPE), state)
    return _through_bytes(state.state_dict())


def fresh_state(kind, streams=2, cell=None, **options):
    cell = cell or TanhRNNCell(INPUT, HIDDEN).to(DTYPE)
    est = ESTIMATORS[kind](cell) if not options else UORO(cell, generator=0, **options)
    return est.initial_state(torch.zeros(streams, cell.hidden_size, dtype=DTYPE))


@pytest.mark.parametrize("source, target", list(itertools.permutations(ESTIMATORS, 2)))
def test_a_state_of_another_estimator_kind_is_refused(source, target):
    state = fresh_state(target)
    before = state.state_dict()
    match = rf"belongs to a '{source}' estimator, this one to a '{target}' estimator.*of a '{source}' estimator"
    with pytest.raises(ValueError, match=match):
        state.load_state_dict(saved_state(source))
    assert torch.equal(state.h, before["h"]) and state.tensors.keys() == before["tensors"].keys()  # left as it was


@pytest.mark.parametrize("source", list(ESTIMATORS))
def test_an_old_state_without_its_kind_is_still_checked_by_its_entries(source):
    target = "tbptt" if source != "tbptt" else "rtrl"
    saved = saved_state(source)
    saved.pop("kind", None)  # as a state_dict of an older version
    with pytest.raises(ValueError, match=r"holds the entries \[.*\], this one \[.*\] \(missing \[.*unexpected"):
        fresh_state(target).load_state_dict(saved)


@pytest.mark.parametrize("kind", list(ESTIMATORS))
def test_a_state_of_other_streams_is_refused(kind):
    with pytest.raises(
        ValueError, match=r"saved hidden states h are torch.float64 \(4, 3\), this state's are .*\(2, 3\)"
    ):
        fresh_state(kind, streams=2).load_state_dict(saved_state(kind, streams=4))


@pytest.mark.parametrize(
    "kind, entry, shapes",
    [
        ("rtrl", "influence", r"\(2, 3, 24\), this state needs torch.float64 \(2, 3, 18\)"),
        ("tbptt", "inputs", r"\(2, 2, 4\), this state needs torch.float64 \(2, \*, 2\) \(\* varies\)"),
        ("uoro", "w_tilde", r"\(2, 24\), this state needs torch.float64 \(2, 18\)"),
    ],
)
def test_a_state_of_another_cell_is_refused(kind, entry, shapes):
    # Same hidden size, another input size: RTRL's influence and UORO's w_tilde have another P, the window another I.
    other = TanhRNNCell(INPUT + 2, HIDDEN).to(DTYPE)
    with pytest.raises(ValueError, match=rf"saved entry '{entry}' is torch.float64 {shapes}"):
        fresh_state(kind).load_state_dict(saved_state(kind, cell=other))


def test_uoro_states_of_other_projections_that_differ_in_shape_are_refused():
    saved = saved_state("uoro", projection="none")
    with pytest.raises(ValueError, match=r"missing \['w_tilde'\], unexpected \['a_tilde'\]"):
        fresh_state("uoro").load_state_dict(saved)


def test_a_state_saved_in_float32_loads_into_a_float64_state_in_float64():
    torch.manual_seed(0)
    cell = TanhRNNCell(INPUT, HIDDEN)
    est = RTRL(cell)
    state = est.initial_state(torch.zeros(2, HIDDEN))
    _, state = est.step(torch.randn(2, INPUT), state)
    saved = state.state_dict()
    target = fresh_state("rtrl")
    target.load_state_dict(saved)
    assert target.h.dtype == target.tensors["influence"].dtype == DTYPE
    assert torch.equal(target.tensors["influence"], saved["tensors"]["influence"].double())
