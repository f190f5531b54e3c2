import io

import pytest
import torch
from torch import nn

from lightning_ortho.online import KFRTRL, RFLO, RTRL, UORO, InfluenceBalancingCell, OnlineState, SnAp, TruncatedBPTT
from lightning_ortho.online import state as state_module

from . import references as ref
from .estimator_cases import build, cases
from .references import DTYPE

B = 2


def _estimators(cell):
    return {"rtrl": RTRL(cell), "tbptt2": TruncatedBPTT(cell, 2), "tbptt9": TruncatedBPTT(cell, 9)}


def _through_bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("name", ["tanh", "gru", "ortho-aux-modrelu"])
@pytest.mark.parametrize("kind", ["rtrl", "tbptt2", "tbptt9"])
def test_state_dict_round_trip_continues_bit_identically(name, kind):
    cell = ref.make_cell(name)
    est = _estimators(cell)[kind]
    xs, h0, cots = ref.sequence(cell, 7, B)
    mask = torch.tensor([False, True])

    def advance(state, t):
        if t == 3:
            state = est.reset(state, mask)
        h, state = est.step(xs[t], state)
        return h, state, est.gradient(state, cots[t], per_stream=True)

    state = est.initial_state(h0)
    for t in range(3):
        _, state, _ = advance(state, t)
    state = est.reset(state, torch.tensor([True, False]), torch.ones(cell.hidden_size, dtype=DTYPE))  # saved pending
    saved = _through_bytes(state.state_dict())

    uninterrupted = []
    for t in range(3, 7):
        h, state, g = advance(state, t)
        uninterrupted.append((h, dict(state.tensors), g))

    restored = est.initial_state(torch.randn(B, cell.hidden_size, dtype=DTYPE))  # a different start, overwritten
    restored.load_state_dict(saved)
    assert restored.step == 3
    for t in range(3, 7):
        h, restored, g = advance(restored, t)
        h_ref, tensors_ref, g_ref = uninterrupted[t - 3]
        assert torch.equal(h, h_ref)
        assert tensors_ref.keys() == restored.tensors.keys()
        for key, value in tensors_ref.items():
            assert torch.equal(restored.tensors[key], value), key
        for n in g_ref:
            assert torch.equal(g[n], g_ref[n]), n
    assert restored.step == state.step == 7


def test_state_dict_is_a_snapshot():
    cell = ref.make_cell("tanh")
    est = RTRL(cell)
    xs, h0, _ = ref.sequence(cell, 2, B)
    _, state = est.step(xs[0], est.initial_state(h0))
    saved = state.state_dict()
    h_before = saved["h"].clone()
    influence_before = saved["tensors"]["influence"].clone()
    state.h.add_(1.0)
    state.tensors["influence"].add_(1.0)
    assert torch.equal(saved["h"], h_before)
    assert torch.equal(saved["tensors"]["influence"], influence_before)
    assert int(saved["step"]) == 1


def test_generator_state_round_trip():
    generator = torch.Generator().manual_seed(11)
    state = OnlineState(torch.zeros(B, 3, dtype=DTYPE), {"a": torch.ones(B, 4)}, generator, step=5)
    saved = _through_bytes(state.state_dict())
    expected = torch.randn(6, generator=generator)

    other = OnlineState(torch.ones(B, 3, dtype=DTYPE), {}, torch.Generator().manual_seed(99))
    other.load_state_dict(saved)
    assert torch.equal(torch.randn(6, generator=other.generator), expected)
    assert other.step == 5 and torch.equal(other.tensors["a"], torch.ones(B, 4))
    assert torch.equal(other.h, torch.zeros(B, 3, dtype=DTYPE))


def test_generator_mismatch_raises():
    with_generator = OnlineState(torch.zeros(B, 3), generator=torch.Generator())
    without = OnlineState(torch.zeros(B, 3))
    with pytest.raises(ValueError, match="disagree on having a noise generator"):
        without.load_state_dict(with_generator.state_dict())
    with pytest.raises(ValueError, match="disagree on having a noise generator"):
        with_generator.load_state_dict(without.state_dict())


def test_replace_keeps_the_generator_and_the_original():
    generator = torch.Generator()
    state = OnlineState(torch.zeros(B, 3), {"a": torch.zeros(B)}, generator, step=2)
    new = state.replace(step=3, h=torch.ones(B, 3))
    assert new.generator is generator and new.step == 3 and torch.equal(new.h, torch.ones(B, 3))
    assert state.step == 2 and torch.equal(state.h, torch.zeros(B, 3)) and new.tensors.keys() == {"a"}
    assert new.batch_size == B


@pytest.mark.parametrize("case", cases())
def test_a_copy_made_while_compiling_names_every_attribute_a_state_has(case, monkeypatch):
    """Under torch.compile a state is copied by the attribute names it lists (older Dynamo traces no ``__dict__``
    copy): every estimator's state, after steps and resets, has exactly those attributes, and the named copy is
    the eager one."""
    estimator, state, xs, _ = build(case)
    for t in range(3):
        _, state = estimator.step(xs[t], state)
    state = estimator.reset(state, torch.tensor([True, False]))
    assert set(vars(state)) == set(state._attributes), case
    eager = state._copy()
    monkeypatch.setattr(state_module, "_compiling", lambda: True)
    named = state._copy()
    assert type(named) is type(eager) and vars(named).keys() == vars(eager).keys()
    assert all(getattr(named, name) is value for name, value in vars(eager).items())


# -- estimator input checks ----------------------------------------------------------------------------------
#: Every estimator whose step or gradient on a tanh cell may be one fused call: the fused call runs before the
#: template's checks and must decline whatever they refuse, so that their errors are the ones raised.
_ESTIMATORS = {
    "rtrl": RTRL,
    "tbptt": lambda cell: TruncatedBPTT(cell, 3),
    "uoro": UORO,
    "kf_rtrl": KFRTRL,
    "rflo": lambda cell: RFLO(cell, tau=2.0),
    "snap1": lambda cell: SnAp(cell, order=1),
}


@pytest.fixture(params=list(_ESTIMATORS))
def started(request):
    cell = ref.make_cell("tanh")
    est = _ESTIMATORS[request.param](cell)
    h0 = torch.zeros(B, cell.hidden_size, dtype=DTYPE)
    state = est.initial_state(h0)
    return est, state, cell


def _x(cell, batch=B, dtype=DTYPE):
    return torch.randn(batch, cell.input_size, dtype=dtype)


def test_bad_x_raises(started):
    est, state, cell = started
    cases = [
        (_x(cell)[None], r"x must be \(streams, features\), got shape \(1, 2, 2\)"),
        (_x(cell)[0], r"x must be \(streams, features\), got shape \(2,\)"),
        (_x(cell, batch=B + 1), r"x must have shape \(2, '...'\) like the state, got \(3, 2\)"),
        (_x(cell, dtype=torch.float32), "x is torch.float32 on cpu but the state is torch.float64"),
        (torch.ones(B, cell.input_size, dtype=torch.int64), "x must be floating point, got torch.int64"),
        (_x(cell).index_fill(1, torch.tensor([0]), float("nan")), "x holds NaN or inf"),
        (_x(cell).index_fill(0, torch.tensor([1]), float("inf")), "x holds NaN or inf"),
        ([[0.0, 1.0], [2.0, 3.0]], "x must be a tensor, got list"),
    ]
    for x, match in cases:
        with pytest.raises(ValueError, match=match):
            est.step(x, state)
    assert state.step == 0  # nothing advanced


def test_bad_grad_h_raises(started):
    est, state, cell = started
    _, state = est.step(_x(cell), state)
    good = torch.randn(B, cell.hidden_size, dtype=DTYPE)
    cases = [
        (good[:, :-1], r"grad_h must have shape \(2, 3\) like the state, got \(2, 2\)"),
        (good[:1], r"grad_h must have shape \(2, 3\) like the state, got \(1, 3\)"),
        (good[None], r"grad_h must be \(streams, features\)"),
        (good.float(), "grad_h is torch.float32"),
        (good.tolist(), "grad_h must be a tensor, got list"),
        (good.T.contiguous().T, None),  # not contiguous: a good grad_h all the same
        (good.index_fill(1, torch.tensor([2]), float("nan")), "grad_h holds NaN or inf"),
    ]
    for grad_h, match in cases:
        for per_stream in (False, True):
            if match is None:
                expected = est.gradient(state, good, per_stream=per_stream)
                for name, value in est.gradient(state, grad_h, per_stream=per_stream).items():
                    torch.testing.assert_close(value, expected[name], rtol=1e-12, atol=1e-12)
                continue
            with pytest.raises(ValueError, match=match):
                est.gradient(state, grad_h, per_stream=per_stream)


def test_bad_reset_raises(started):
    est, state, cell = started
    cases = [
        (torch.tensor([1, 0]), None, r"mask must be a bool tensor of shape \(2,\), got \(2,\)"),
        (torch.tensor([True, False, True]), None, r"mask must be a bool tensor of shape \(2,\), got \(3,\)"),
        (torch.tensor([[True, False]]), None, r"got \(1, 2\)"),
        ([True, False], None, r"mask must be a bool tensor of shape \(2,\), got list"),
        (
            torch.tensor([True, False]),
            torch.zeros(cell.hidden_size + 1, dtype=DTYPE),
            r"h0 must have shape \(2, 3\) or \(3,\), got \(4,\)",
        ),
        (
            torch.tensor([True, False]),
            torch.zeros(3, cell.hidden_size, dtype=DTYPE),
            r"h0 must have shape .* got \(3, 3\)",
        ),
    ]
    for mask, h0, match in cases:
        with pytest.raises(ValueError, match=match):
            est.reset(state, mask, h0)


def test_reset_leaves_other_streams_untouched(started):
    est, state, cell = started
    for _ in range(2):
        _, state = est.step(_x(cell), state)
    new = est.reset(state, torch.tensor([True, False]), torch.full((1, cell.hidden_size), 0.5, dtype=DTYPE))
    assert torch.equal(new.h[1], state.h[1]) and torch.equal(
        new.h[0], torch.full((cell.hidden_size,), 0.5, dtype=DTYPE)
    )
    assert new.step == state.step
    for key, value in new.tensors.items():
        if value.dim() >= 2 and key != "cut":
            assert torch.equal(value[1], state.tensors[key][1]), key


def test_bad_h0_raises():
    est = RTRL(ref.make_cell("tanh"))
    with pytest.raises(ValueError, match=r"h0 must be \(streams, features\), got shape \(3,\)"):
        est.initial_state(torch.zeros(3, dtype=DTYPE))
    with pytest.raises(ValueError, match=r"h0 must be \(streams, features\), got shape \(1, 2, 3\)"):
        est.initial_state(torch.zeros(1, 2, 3, dtype=DTYPE))
    with pytest.raises(ValueError, match="h0 holds NaN or inf"):
        est.initial_state(torch.full((2, 3), float("nan"), dtype=DTYPE))
    with pytest.raises(ValueError, match="h0 must be floating point"):
        est.initial_state(torch.zeros(2, 3, dtype=torch.int32))


class _Free(nn.Module):
    def forward(self, x, h):
        return torch.tanh(h)


@pytest.mark.parametrize("make", [RTRL, lambda c: TruncatedBPTT(c, 2)])
def test_cell_without_parameters_or_not_a_module_raises(make):
    with pytest.raises(ValueError, match="_Free has no parameters: there is no gradient to estimate"):
        make(_Free())
    with pytest.raises(TypeError, match="cell must be an nn.Module"):
        make(lambda x, h: h)


class _Exploding(nn.Module):
    """h' = g h: finite parameters and inputs, states that overflow float64 after a few steps."""

    def __init__(self):
        super().__init__()
        self.input_size, self.hidden_size = 1, 2
        self.gain = nn.Parameter(torch.tensor(1e200, dtype=DTYPE))

    def forward(self, x, h):
        return self.gain * h + x


@pytest.mark.parametrize("make", [RTRL, lambda c: TruncatedBPTT(c, 2)])
def test_exploding_cell_raises_floating_point_error(make):
    est = make(_Exploding())
    state = est.initial_state(torch.ones(B, 2, dtype=DTYPE))
    x = torch.zeros(B, 1, dtype=DTYPE)
    _, state = est.step(x, state)  # 1e200: still finite
    with pytest.raises(FloatingPointError, match="produced NaN/inf states at step 2"):
        est.step(x, state)


def test_any_module_cell_works_with_rtrl():
    """A plain nn.Module with a scalar parameter: RTRL's gradient through 3 steps by hand.
    h_t = g h_{t-1} + x_t, L = h_3: dL/dg = 3 g^2 h_0 + 2 g x_1 + x_2 (per unit)."""
    cell = _Exploding()
    with torch.no_grad():
        cell.gain.fill_(0.7)
    est = RTRL(cell)
    h0 = torch.tensor([[1.0, -2.0]], dtype=DTYPE)
    xs = torch.tensor([[[0.5]], [[-1.5]], [[2.0]]], dtype=DTYPE)
    state = est.initial_state(h0)
    for t in range(3):
        _, state = est.step(xs[t], state)
    got = est.gradient(state, torch.ones(1, 2, dtype=DTYPE))["gain"]
    g = 0.7
    expected = sum(3 * g**2 * h0[0, i] + 2 * g * xs[0, 0, 0] + xs[1, 0, 0] for i in range(2))
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)


def test_influence_cell_float32_state_mismatch():
    """float32 parameters with a float64 stream are caught at the input check (x like the state)."""
    cell = InfluenceBalancingCell(units=3, positive=1)
    est = RTRL(cell)
    state = est.initial_state(torch.zeros(B, 3))
    with pytest.raises(ValueError, match="x is torch.float64 on cpu but the state is torch.float32"):
        est.step(torch.zeros(B, 1, dtype=DTYPE), state)
