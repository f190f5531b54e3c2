"""SnAp-1 and SnAp-2 (Menick et al. 2021) against backprop through time, exact RTRL and a closed-form reference.

Where SnAp is exact (an element-wise recurrence for SnAp-1; a cell whose reach closes within two steps for SnAp-2;
the first steps from a zero influence) it must equal BPTT to float64 rounding; where it is not, it must differ.
"""

import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_ortho.online import RTRL, TanhRNNCell
from lightning_ortho.online.snap import SnAp, snap_mask

from . import references as ref
from .references import DTYPE

T, B = 6, 2
TOL = dict(rtol=1e-10, atol=1e-10)


class ElementwiseCell(nn.Module):
    """``h' = tanh(w * h + U x + b)`` with ``w`` a vector: each unit reads only itself."""

    def __init__(self, input_size: int = 2, hidden_size: int = 3) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.w = nn.Parameter(torch.empty(hidden_size).uniform_(-0.9, 0.9))
        self.U = nn.Parameter(torch.randn(hidden_size, input_size) / math.sqrt(input_size))
        self.b = nn.Parameter(0.3 * torch.randn(hidden_size))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w * h + x @ self.U.T + self.b)


class ChainCell(ElementwiseCell):
    """``h'_i = tanh(w_i h_i + c_i h_{i-1} + U_i x + b_i)``: unit ``i`` also reads unit ``i - 1`` (``c_0 = 0``), so a
    parameter of unit ``i`` reaches unit ``i + n`` after ``n + 1`` steps."""

    def __init__(self, input_size: int = 2, hidden_size: int = 4) -> None:
        super().__init__(input_size, hidden_size)
        self.c = nn.Parameter(torch.randn(hidden_size - 1))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        previous = torch.cat([torch.zeros_like(h[:, :1]), self.c * h[:, :-1]], dim=1)
        return torch.tanh(self.w * h + previous + x @ self.U.T + self.b)


class DeclaredChainCell(ChainCell):
    """A chain cell that declares every unit reads every unit (a superset of its structure)."""

    def jacobian_pattern(self):
        hidden, size = self.hidden_size, ref.param_count(self)
        return torch.ones(hidden, hidden, dtype=torch.bool), torch.ones(hidden, size, dtype=torch.bool)


class TwoLayerCell(nn.Module):
    """``h1' = tanh(w1 * h1 + U1 x + b1)``, ``h2' = tanh(w2 * h2 + V h1 + U2 x + b2)``: the second half of the units
    reads the first half densely, nothing reads back, so whatever a parameter reaches it reaches within two steps."""

    def __init__(self, input_size: int = 2, first: int = 2, second: int = 2) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.first = input_size, first + second, first
        self.w = nn.Parameter(torch.empty(first + second).uniform_(-0.9, 0.9))
        self.V = nn.Parameter(torch.randn(second, first))
        self.U = nn.Parameter(torch.randn(first + second, input_size) / math.sqrt(input_size))
        self.b = nn.Parameter(0.3 * torch.randn(first + second))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        lower = torch.cat([torch.zeros_like(h[:, : self.first]), h[:, : self.first] @ self.V.T], dim=1)
        return torch.tanh(self.w * h + lower + x @ self.U.T + self.b)


def make(kind, seed=0):
    torch.manual_seed(seed)
    if kind in ("tanh", "gru", "ortho-cayley-modrelu"):
        return ref.make_cell(kind, seed)
    return {
        "elementwise": ElementwiseCell,
        "chain": ChainCell,
        "declared": DeclaredChainCell,
        "two-layer": TwoLayerCell,
    }[kind]().to(DTYPE)


def run(est, xs, h0, cots, resets=None, per_stream=False):
    """Sum over t of est.gradient(state_t, dL_t/dh_t), flattened, and the last state."""
    state, total = est.initial_state(h0), 0.0
    for t in range(len(xs)):
        if resets and t in resets:
            state = est.reset(state, *resets[t])
        _, state = est.step(xs[t], state)
        total = total + ref.flatten_dict(est.gradient(state, cots[t], per_stream=per_stream), est.cell, int(per_stream))
    return total, state


def step_gradient(est, xs, h0, cot):
    """The estimate of d<cot, h_T>/dtheta after the steps xs, per stream."""
    state = est.initial_state(h0)
    for x in xs:
        _, state = est.step(x, state)
    return ref.flatten_dict(est.gradient(state, cot, per_stream=True), est.cell, 1)


def exact_step_gradient(cell, xs, h0, cot):
    """d<cot, h_T>/dtheta per stream by BPTT, each stream alone."""
    cots = torch.zeros(len(xs), *cot.shape, dtype=DTYPE)
    cots[-1] = cot
    return torch.stack(
        [ref.bptt_gradient(cell, xs[:, b : b + 1], h0[b : b + 1], cots[:, b : b + 1]) for b in range(len(h0))]
    )


@pytest.mark.parametrize("product", ["auto", "sparse", "dense"])
@pytest.mark.parametrize("order", [1, 2])
def test_snap_is_exact_on_an_elementwise_recurrence(order, product):
    cell = make("elementwise")
    xs, h0, cots = ref.sequence(cell, T, B)
    est = SnAp(cell, order=order, product=product)
    assert est.kept == ref.param_count(cell)  # one entry per parameter: O(P) memory
    got, state = run(est, xs, h0, cots)
    torch.testing.assert_close(got, ref.bptt_gradient(cell, xs, h0, cots), **TOL)
    assert state.tensors["influence"].shape == (B, ref.param_count(cell))


@pytest.mark.parametrize("product", ["sparse", "dense"])
def test_snap2_is_exact_where_reach_closes_within_two_steps_and_snap1_is_not(product):
    cell = make("two-layer")
    xs, h0, cots = ref.sequence(cell, T, B)
    expected = ref.bptt_gradient(cell, xs, h0, cots)
    snap2 = SnAp(cell, order=2, product=product)
    assert not snap2.full  # layer 2's parameters never reach layer 1
    torch.testing.assert_close(run(snap2, xs, h0, cots)[0], expected, **TOL)
    snap1, _ = run(SnAp(cell, order=1, product=product), xs, h0, cots)
    assert (snap1 - expected).abs().max() > 1e-3


@pytest.mark.parametrize("product", ["sparse", "dense"])
def test_snap_on_a_chain_is_exact_for_order_steps_from_a_zero_influence(product):
    cell = make("chain")
    xs, h0, cots = ref.sequence(cell, 3, B, seed=4)
    for order in (1, 2):
        est = SnAp(cell, order=order, product=product)
        for t in (1, 2, 3):
            got = step_gradient(est, xs[:t], h0, cots[t - 1])
            exact = exact_step_gradient(cell, xs[:t], h0, cots[t - 1])
            if t <= order:
                torch.testing.assert_close(got, exact, **TOL)
            else:  # the reach beyond `order` units is dropped
                assert (got - exact).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["tanh", "gru", "chain", "ortho-cayley-modrelu"])
@pytest.mark.parametrize("order", [1, 2])
def test_first_step_from_zero_influence_is_rtrl_for_any_order(kind, order):
    cell = make(kind)
    xs, h0, cots = ref.sequence(cell, 1, B, seed=5)
    est = SnAp(cell, order=order)
    _, state = est.step(xs[0], est.initial_state(h0))
    _, exact = RTRL(cell).step(xs[0], RTRL(cell).initial_state(h0))
    full = exact.tensors["influence"]
    kept = state.tensors["influence"]
    torch.testing.assert_close(kept, full[:, est.rows, est.cols], rtol=0, atol=1e-13)
    dropped = full.clone()
    dropped[:, est.rows, est.cols] = 0
    assert torch.equal(dropped, torch.zeros_like(full))  # RTRL's first influence lies inside every mask
    torch.testing.assert_close(step_gradient(est, xs, h0, cots[0]), exact_step_gradient(cell, xs, h0, cots[0]), **TOL)


def test_snap1_on_a_dense_tanh_rnn_follows_its_closed_form_and_differs_from_bptt():
    """SnAp-1 of ``tanh(W_h h + W_x x + b)`` keeps ``e[i, j] = dh_i/dW[i, j]`` for ``W = [W_h W_x b]`` with
    ``e_t = d_t * (a_t + diag(W_h) e_{t-1})``, ``a = [h; x; 1]``: reference written out here."""
    cell = make("tanh")
    xs, h0, cots = ref.sequence(cell, T, B)
    est = SnAp(cell, order=1, product="sparse")
    size = ref.param_count(cell)
    assert est.kept == size and est.pairs == size and est.plan_size <= 8 * size  # O(P) memory and work
    got, _ = run(est, xs, h0, cots)

    hidden = cell.hidden_size
    diagonal = torch.diagonal(cell.weight_hh.detach())
    trace, h, expected = torch.zeros(B, hidden, hidden + cell.input_size + 1, dtype=DTYPE), h0, 0.0
    with torch.no_grad():
        for t in range(T):
            a = torch.cat([h, xs[t], torch.ones(B, 1, dtype=DTYPE)], dim=1)
            h = cell(xs[t], h)
            trace = (1 - h.square())[:, :, None] * (a[:, None, :] + diagonal[None, :, None] * trace)
            g = (cots[t][:, :, None] * trace).sum(0)
            expected = expected + torch.cat([g[:, :hidden].reshape(-1), g[:, hidden:-1].reshape(-1), g[:, -1]])
    torch.testing.assert_close(got, expected, **TOL)
    assert (got - ref.bptt_gradient(cell, xs, h0, cots)).abs().max() > 1e-3  # biased on a dense recurrence


def test_snap2_on_a_dense_tanh_rnn_is_rtrl():
    cell = make("tanh")
    xs, h0, cots = ref.sequence(cell, T, B)
    est = SnAp(cell, order=2)
    assert est.full and est.dense and est.kept == cell.hidden_size * ref.param_count(cell)
    torch.testing.assert_close(run(est, xs, h0, cots)[0], ref.bptt_gradient(cell, xs, h0, cots), **TOL)


@pytest.mark.parametrize("kind", ["tanh", "chain", "gru", "ortho-cayley-modrelu"])
@pytest.mark.parametrize("order", [1, 2])
def test_sparse_and_dense_products_and_closed_form_agree(kind, order):
    """The orthogonal cell's transition parameters touch every unit: one vector-Jacobian product per unit."""
    cell = make(kind)
    xs, h0, cots = ref.sequence(cell, T, B, seed=6)
    results = [
        run(SnAp(cell, order=order, product=product, closed_form=closed), xs, h0, cots)
        for product in ("sparse", "dense")
        for closed in (True, False)
    ]
    for got, state in results[1:]:
        torch.testing.assert_close(got, results[0][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(state.tensors["influence"], results[0][1].tensors["influence"], rtol=0, atol=1e-12)


def rows_of_a_dense_rnn(hidden, inputs):
    """``dF/dtheta``'s pattern for parameters ``W_h (H, H)``, ``W_x (H, I)``, ``b (H,)`` acting on unit ``i`` by row."""
    expected = torch.zeros(hidden, hidden * (hidden + inputs + 1), dtype=torch.bool)
    for i in range(hidden):  # W_h[i, :], W_x[i, :] and b[i] touch unit i only
        expected[i, i * hidden : (i + 1) * hidden] = True
        expected[i, hidden * hidden + i * inputs : hidden * hidden + (i + 1) * inputs] = True
        expected[i, hidden * hidden + hidden * inputs + i] = True
    return expected


def test_derived_patterns():
    cell = make("tanh")
    est = SnAp(cell, order=1)
    assert est.state_pattern.all()
    expected = rows_of_a_dense_rnn(cell.hidden_size, cell.input_size)
    assert torch.equal(est.parameter_pattern, expected)
    assert snap_mask(est.state_pattern, expected, 2).all()

    chain = SnAp(make("chain"), order=2)
    links = torch.eye(4, dtype=torch.bool) | torch.diag(torch.ones(3, dtype=torch.bool), -1)
    assert torch.equal(chain.state_pattern, links)
    assert torch.equal(
        snap_mask(links, chain.parameter_pattern, 2), (links.double() @ chain.parameter_pattern.double()) > 0
    )


class ReluCell(nn.Module):
    """``h' = relu(W h + U x + b)``: a unit that is off at a probe hides its row of both Jacobians there."""

    def __init__(self, input_size: int = 2, hidden_size: int = 6) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.W = nn.Parameter(torch.randn(hidden_size, hidden_size) / math.sqrt(hidden_size))
        self.U = nn.Parameter(torch.randn(hidden_size, input_size))
        self.b = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(h @ self.W.T + x @ self.U.T + self.b)


def test_the_pattern_is_structural_not_accidental():
    # a parameter that is zero now (c = 0: no unit reads its neighbour yet) still links the units it can link
    cell = make("chain")
    with torch.no_grad():
        cell.c.zero_()
    links = torch.eye(4, dtype=torch.bool) | torch.diag(torch.ones(3, dtype=torch.bool), -1)
    assert torch.equal(SnAp(cell).state_pattern, links)
    # units switched off at one random point: the union over probes recovers the whole structure
    torch.manual_seed(0)
    relu = ReluCell().to(DTYPE)
    one, many = SnAp(relu, probes=1), SnAp(relu, probes=20)
    assert many.state_pattern.all()
    assert torch.equal(many.parameter_pattern, rows_of_a_dense_rnn(relu.hidden_size, relu.input_size))
    assert not one.state_pattern.all()  # some unit was off at the single probe
    assert torch.equal(one.state_pattern | many.state_pattern, many.state_pattern)


class FixedInputCell(ElementwiseCell):
    """An element-wise cell whose input map is a plain float32 tensor (no buffer): it cannot run in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed = torch.randn(self.hidden_size, self.input_size)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w * h + x @ self.fixed.T + x @ self.U.T + self.b)


def test_a_cell_that_cannot_run_in_float64_is_probed_in_its_own_dtype():
    torch.manual_seed(0)
    cell = FixedInputCell()  # float32
    est = SnAp(cell)
    assert torch.equal(est.state_pattern, torch.eye(cell.hidden_size, dtype=torch.bool))
    assert est.kept == ref.param_count(cell)
    xs, h0, cots = (t.float() for t in ref.sequence(cell, 3, B))
    total, _ = run(est, xs, h0, cots)
    params = ref.parameters(cell)
    h, loss = h0, 0.0
    for t in range(3):
        h = cell(xs[t], h)
        loss = loss + (cots[t] * h).sum()
    torch.testing.assert_close(total, ref.flat(torch.autograd.grad(loss, params), params))


def test_a_declared_pattern_is_used_and_checked():
    cell = make("declared")
    xs, h0, cots = ref.sequence(cell, T, B)
    est = SnAp(cell, order=1)  # the declared (full) pattern: SnAp keeps everything, hence RTRL
    assert est.full
    torch.testing.assert_close(run(est, xs, h0, cots)[0], ref.bptt_gradient(cell, xs, h0, cots), **TOL)

    class Wrong(ChainCell):
        def __init__(self, pattern):
            super().__init__()
            self.pattern = pattern

        def jacobian_pattern(self):
            return self.pattern

    size = ref.param_count(ChainCell())
    for pattern in [
        (torch.ones(4, 4), torch.ones(4, size, dtype=torch.bool)),  # not bool
        (torch.ones(4, 4, dtype=torch.bool), torch.ones(4, size + 1, dtype=torch.bool)),  # wrong P
        (torch.ones(3, 3, dtype=torch.bool), torch.ones(4, size, dtype=torch.bool)),  # wrong H
    ]:
        with pytest.raises(ValueError, match="jacobian_pattern"):
            SnAp(Wrong(pattern).to(DTYPE))


@pytest.mark.parametrize("order", [1, 2])
def test_reset_mid_sequence_equals_bptt_with_a_cut(order):
    cell = make("elementwise" if order == 1 else "two-layer")
    xs, h0, cots = ref.sequence(cell, T, B, seed=3)
    mask, start = torch.tensor([True, False]), torch.randn(cell.hidden_size, dtype=DTYPE)
    est = SnAp(cell, order=order)
    got, _ = run(est, xs, h0, cots, resets={3: (mask, start)})
    torch.testing.assert_close(got, ref.bptt_gradient(cell, xs, h0, cots, resets={3: (mask, start)}), **TOL)
    assert not torch.allclose(got, ref.bptt_gradient(cell, xs, h0, cots), rtol=1e-6, atol=1e-8)

    state = est.initial_state(h0)
    for t in range(3):
        _, state = est.step(xs[t], state)
    before = state.tensors["influence"]
    after = est.reset(state, mask, start)
    assert torch.equal(after.tensors["influence"][0], torch.zeros_like(before[0]))
    assert torch.equal(after.tensors["influence"][1], before[1]) and before[1].abs().sum() > 0
    assert torch.equal(after.h[0], start) and torch.equal(after.h[1], state.h[1])


@pytest.mark.parametrize(("kind", "order"), [("chain", 2), ("tanh", 1), ("tanh", 2)])
def test_state_dict_round_trip_continues_exactly(kind, order):
    cell = make(kind)
    xs, h0, cots = ref.sequence(cell, T, B, seed=7)
    est = SnAp(cell, order=order)
    state = est.initial_state(h0)
    for t in range(3):
        _, state = est.step(xs[t], state)
    restored = est.initial_state(torch.zeros_like(h0))
    restored.load_state_dict(state.state_dict())
    assert restored.step == 3
    for t in range(3, T):
        h, state = est.step(xs[t], state)
        h_restored, restored = est.step(xs[t], restored)
        assert torch.equal(h, h_restored)
        assert torch.equal(state.tensors["influence"], restored.tensors["influence"])
        for name, g in est.gradient(state, cots[t]).items():
            assert torch.equal(g, est.gradient(restored, cots[t])[name])


def test_a_state_of_another_order_does_not_load():
    cell = make("tanh")
    h0 = torch.zeros(B, cell.hidden_size, dtype=DTYPE)
    saved = SnAp(cell, order=1).initial_state(h0).state_dict()
    with pytest.raises(ValueError, match="influence"):
        SnAp(cell, order=2).initial_state(h0).load_state_dict(saved)


@pytest.mark.parametrize(("kind", "order"), [("elementwise", 1), ("tanh", 1), ("chain", 2), ("tanh", 2)])
def test_per_stream_rows_sum_to_the_summed_gradient(kind, order):
    cell = make(kind)
    xs, h0, cots = ref.sequence(cell, T, 3, seed=2)
    est = SnAp(cell, order=order)
    rows, _ = run(est, xs, h0, cots, per_stream=True)
    summed, _ = run(est, xs, h0, cots)
    assert rows.shape == (3, ref.param_count(cell))
    torch.testing.assert_close(rows.sum(0), summed, rtol=0, atol=1e-12)
    assert not torch.allclose(rows[0], rows[1])
    if kind == "elementwise":  # exact: each row is its own stream's BPTT
        for b in range(3):
            own = ref.bptt_gradient(cell, xs[:, b : b + 1], h0[b : b + 1], cots[:, b : b + 1])
            torch.testing.assert_close(rows[b], own, **TOL)


@pytest.mark.parametrize("order", [0, 3, -1, True, 1.0, "1", None])
def test_an_order_other_than_1_or_2_is_refused(order):
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        SnAp(make("tanh"), order=order)


def test_an_integer_order_of_any_integer_type_is_taken():
    assert SnAp(make("tanh"), order=np.int64(2)).order == 2


def test_bad_options_and_cells_are_refused():
    with pytest.raises(ValueError, match="product"):
        SnAp(make("tanh"), product="csr")
    with pytest.raises(ValueError, match="probes"):
        SnAp(make("tanh"), probes=0)

    class Anonymous(nn.Module):  # no input_size / hidden_size, no declared pattern
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x, h):
            return torch.tanh(self.w * h)

    with pytest.raises(ValueError, match="jacobian_pattern"):
        SnAp(Anonymous())


def test_gradient_shapes_match_the_parameters():
    cell = TanhRNNCell(2, 3).to(DTYPE)
    est = SnAp(cell)
    xs, h0, cots = ref.sequence(cell, 1, B)
    _, state = est.step(xs[0], est.initial_state(h0))
    per_stream = est.gradient(state, cots[0], per_stream=True)
    assert {n: tuple(g.shape) for n, g in per_stream.items()} == {n: (B, *p.shape) for n, p in cell.named_parameters()}
