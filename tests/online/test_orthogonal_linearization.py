"""OrthogonalRNNCell's closed-form products equal the generic torch.func path, for every transition and
nonlinearity, and the estimators built on them equal those built on the generic path (and BPTT)."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import RTRL, UORO, ParameterLayout, StepLinearization, TruncatedBPTT, linearize
from lightning_ortho.online._orthogonal_transitions import ReflectionTransition
from lightning_ortho.online.orthogonal_linearization import OrthogonalStepLinearization
from lightning_ortho.online.orthogonal_uoro import OrthogonalUOROStep, fusable_orthogonal_cell

from . import references as ref

DTYPE = torch.float64
INPUTS, HIDDEN, B = 2, 4, 4
TRANSITIONS = ["aux", "householder", "cayley", "matrix_exp"]
NONLINEARITIES = ["modrelu", "tanh"]
KINDS = ("parameter", "preactivation", "post_activation")
TRANSITION_CLASSES = {
    "aux": "ReflectionTransition",
    "householder": "HouseholderTransition",
    "cayley": "CayleyTransition",
    "matrix_exp": "ExponentialTransition",
}
TIGHT = dict(rtol=1e-10, atol=1e-12)


def make_cell(transition: str, nonlinearity: str, seed: int = 0, dtype=DTYPE) -> OrthogonalRNNCell:
    torch.manual_seed(seed)
    cell = OrthogonalRNNCell(INPUTS, HIDDEN, transition=transition, nonlinearity=nonlinearity).to(dtype)
    with torch.no_grad():
        cell.bias.copy_(torch.tensor([-5.0, 0.3, -0.2, 0.1]))  # unit 0 in modReLU's dead zone for every stream
        for name, p in cell.named_parameters():
            if name.startswith("transition"):
                p.add_(0.3 * torch.randn_like(p))
        if transition == "aux":
            cell.transition.weight[:, 0] = 0.0  # W e_0 = 0: the row h = e_0 has v = 0 (H(0) := I)
        if transition == "householder":
            cell.transition.vectors[1] = 0.0  # a zero reflection vector: H(0) := I
    return cell


def inputs(cell: OrthogonalRNNCell, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, INPUTS, generator=g, dtype=DTYPE)
    h = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    h[0] = 0.0  # v = W h = 0
    h[1] = torch.tensor([0.7, 0.0, 0.0, 0.0])  # v = 0 with h != 0 for the auxiliary reflection
    return x, h, g


def both(transition, nonlinearity, seed=0):
    cell = make_cell(transition, nonlinearity, seed)
    x, h, g = inputs(cell, seed + 1)
    layout = ParameterLayout(cell)
    return cell, layout, g, StepLinearization(cell, x, h, layout), linearize(cell, x, h, layout)


@pytest.mark.parametrize("nonlinearity", NONLINEARITIES)
@pytest.mark.parametrize("transition", TRANSITIONS)
def test_every_product_equals_the_generic_path(transition, nonlinearity):
    cell, layout, g, generic, fast = both(transition, nonlinearity)
    assert type(fast) is OrthogonalStepLinearization
    assert type(fast.transition).__name__ == TRANSITION_CLASSES[transition]
    if nonlinearity == "modrelu":
        assert (fast.slope[:, 0] == 0).all() and (fast.slope != 0).any()  # the dead zone and live units
    if transition == "aux":
        assert (fast.transition.k[:2] == 0).all() and (fast.transition.k[2:] > 0).all()  # v = 0 rows: U = I
    torch.testing.assert_close(fast.h_new, generic.h_new, **TIGHT)
    torch.testing.assert_close(fast.preactivation, generic.preactivation, **TIGHT)
    v = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    cols = torch.randn(B, HIDDEN, 3, generator=g, dtype=DTYPE)
    n = torch.randn(B, layout.size, generator=g, dtype=DTYPE)
    pairs = [
        (fast.state_jvp(v), generic.state_jvp(v)),
        (fast.state_jvp_columns(cols), generic.state_jvp_columns(cols)),
        (fast.parameter_vjp(v), generic.parameter_vjp(v)),
        (fast.parameter_jvp(n), generic.parameter_jvp(n)),
        (fast.parameter_jacobian(), generic.parameter_jacobian()),
        (fast.activation_jvp(v), generic.activation_jvp(v)),
        (fast.activation_jacobian(), generic.activation_jacobian()),
        (fast.preactivation_vjp(v), generic.preactivation_vjp(v)),
        (fast.post_activation_vjp(v), generic.post_activation_vjp(v)),
    ]
    for got, expected in pairs:
        torch.testing.assert_close(got, expected, **TIGHT)
    assert fast.has_post_activation_parameters() and generic.has_post_activation_parameters()
    for kind in KINDS:
        torch.testing.assert_close(fast.vjp_norm(kind, v), generic.vjp_norm(kind, v), **TIGHT)
        scale = torch.randn(B, generator=g, dtype=DTYPE)
        fast_out, generic_out = n.clone(), n.clone()
        fast.vjp_accumulate(kind, fast_out, v, scale)
        generic.vjp_accumulate(kind, generic_out, v, scale)
        torch.testing.assert_close(fast_out, generic_out, **TIGHT)


@pytest.mark.parametrize("transition", ["aux", "householder"])
def test_products_equal_dense_autograd(transition):
    """An independent reference: the cell's dense per-stream Jacobians by plain autograd."""
    cell = make_cell(transition, "modrelu", seed=2)
    x, h, g = inputs(cell, 3)
    fast = linearize(cell, x, h, ParameterLayout(cell))
    j_h, j_theta = ref.state_jacobian(cell, x, h), ref.parameter_jacobian(cell, x, h)
    c = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    torch.testing.assert_close(fast.state_jvp_columns(torch.eye(HIDDEN, dtype=DTYPE).expand(B, -1, -1)), j_h, **TIGHT)
    torch.testing.assert_close(fast.parameter_jacobian(), j_theta, **TIGHT)
    torch.testing.assert_close(fast.parameter_vjp(c), torch.einsum("bh,bhp->bp", c, j_theta), **TIGHT)
    norms = torch.linalg.vector_norm(torch.einsum("bh,bhp->bp", c, j_theta), dim=1)
    torch.testing.assert_close(fast.vjp_norm("parameter", c), norms, **TIGHT)


def test_dispatch():
    cell, layout, _, generic, fast = both("aux", "modrelu")
    x, h, _ = inputs(cell)
    assert type(fast) is OrthogonalStepLinearization and type(generic) is StepLinearization
    assert type(linearize(cell, x, h, layout, closed_form=False)) is StepLinearization
    network = OrthogonalRNNCell(INPUTS, HIDDEN, network=torch.nn.Linear(HIDDEN, HIDDEN)).double()
    theorem2 = OrthogonalRNNCell(INPUTS, HIDDEN, invertible=True).double()
    for other in (network, theorem2):  # no closed form: the generic path
        assert type(linearize(other, x, h, ParameterLayout(other))) is StepLinearization

    class Custom(OrthogonalRNNCell):  # a subclass may change the step: not ours to linearise
        pass

    custom = Custom(INPUTS, HIDDEN).double()
    assert type(linearize(custom, x, h, ParameterLayout(custom))) is StepLinearization


def _uoro_run(est, xs, h0, cots):
    state, rows = est.initial_state(h0), []
    for t in range(len(xs)):
        h, state = est.step(xs[t], state)
        grads = est.gradient(state, cots[t])
        # w_tilde is updated in place by UORO's fused step: keep a copy of this step's
        rows.append((h, state.tensors["h_tilde"], state.tensors["w_tilde"].clone(), ref.flatten_dict(grads, est.cell)))
    return rows


@pytest.mark.parametrize(
    "transition, nonlinearity, projection",
    [(t, n, "state") for t in TRANSITIONS for n in NONLINEARITIES]
    + [("aux", "modrelu", "preactivation"), ("householder", "tanh", "preactivation"), ("aux", "tanh", "parameter")]
    + [("cayley", "modrelu", "parameter")],
)
def test_uoro_closed_form_equals_generic(transition, nonlinearity, projection):
    cell = make_cell(transition, nonlinearity, seed=4)
    xs, h0, cots = ref.sequence(cell, 4, B, seed=5)
    runs = [
        _uoro_run(UORO(cell, projection=projection, generator=7, closed_form=flag), xs, h0, cots)
        for flag in (True, False)
    ]
    for fast, generic in zip(*runs, strict=True):
        assert fast[2].abs().sum() > 0
        for got, expected in zip(fast, generic, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("transition", TRANSITIONS)
def test_rtrl_closed_form_equals_generic_and_bptt(transition):
    cell = make_cell(transition, "modrelu" if transition in ("aux", "cayley") else "tanh", seed=6)
    xs, h0, cots = ref.sequence(cell, 4, 2, seed=7)
    expected = ref.bptt_gradient(cell, xs, h0, cots)
    assert expected.abs().sum() > 0
    totals = []
    for flag in (True, False):
        est = RTRL(cell, closed_form=flag)
        state, total = est.initial_state(h0), 0.0
        for t in range(len(xs)):
            _, state = est.step(xs[t], state)
            total = total + ref.flatten_dict(est.gradient(state, cots[t]), cell)
        totals.append((total, state.tensors["influence"]))
    torch.testing.assert_close(totals[0][1], totals[1][1], rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(totals[0][0], expected, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(totals[1][0], expected, rtol=1e-9, atol=1e-10)


def test_tbptt_runs_on_the_closed_form_states():
    cell = make_cell("aux", "modrelu", seed=8)
    xs, h0, cots = ref.sequence(cell, 3, 2, seed=9)
    est = TruncatedBPTT(cell, k=3)
    state, total = est.initial_state(h0), 0.0
    for t in range(len(xs)):
        _, state = est.step(xs[t], state)
        total = total + ref.flatten_dict(est.gradient(state, cots[t]), cell)
    torch.testing.assert_close(total, ref.bptt_gradient(cell, xs, h0, cots), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("size", [1e-20, 1e19])
def test_reflection_is_homogeneous_across_the_range(size):
    """float32 rows of 1e-20 (v.v underflows) and 1e19 (v.v overflows) reflect like unit rows: ``U(s h) = s U(h)``
    and the Jacobian and the cotangent factor (degree 0) do not change."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=DTYPE)
    h = torch.randn(3, HIDDEN, generator=g, dtype=DTYPE)
    t, c = torch.randn(3, HIDDEN, generator=g, dtype=DTYPE), torch.randn(3, HIDDEN, generator=g, dtype=DTYPE)
    unit = ReflectionTransition("w", weight, h)
    scaled = ReflectionTransition("w", weight.float(), (h * size).float())
    assert torch.isfinite(scaled.value).all() and (scaled.k > 0).all()
    loose = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scaled.value.double() / size, unit.value, **loose)
    torch.testing.assert_close(scaled.jvp(t.float()).double(), unit.jvp(t), **loose)
    torch.testing.assert_close(scaled.jacobian().double(), unit.jacobian(), **loose)
    torch.testing.assert_close(scaled.outer_factor(c.float()).double(), unit.outer_factor(c), **loose)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("transition", ["aux", "householder"])
def test_half_precision_cells_match_the_float64_closed_form(transition, dtype):
    cell = make_cell(transition, "modrelu", seed=10, dtype=dtype)
    wide = make_cell(transition, "modrelu", seed=10)
    wide.load_state_dict({k: v.double() for k, v in cell.state_dict().items()})
    x, h, g = inputs(wide, 11)
    c = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    half = linearize(cell, x.to(dtype), h.to(dtype), ParameterLayout(cell))
    full = linearize(wide, x.to(dtype).double(), h.to(dtype).double(), ParameterLayout(wide))
    assert half.h_new.dtype == dtype and half.parameter_vjp(c.to(dtype)).dtype == dtype
    loose = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(half.h_new.double(), full.h_new, **loose)
    torch.testing.assert_close(half.state_jvp(c.to(dtype)).double(), full.state_jvp(c.to(dtype).double()), **loose)
    got = half.parameter_vjp(c.to(dtype)).double()
    torch.testing.assert_close(got, full.parameter_vjp(c.to(dtype).double()), **loose)


def test_a_nan_transition_parameter_is_named():
    cell = make_cell("aux", "tanh")
    with torch.no_grad():
        cell.transition.weight[1, 2] = float("nan")
    est = UORO(cell, generator=0)
    state = est.initial_state(torch.full((2, HIDDEN), 0.5, dtype=DTYPE))
    with pytest.raises(FloatingPointError, match=r"\['transition\.weight'\] hold NaN/inf"):
        est.step(torch.ones(2, INPUTS, dtype=DTYPE), state)


# -- the fused UORO step ----------------------------------------------------------------------------------------------
def _step_inputs(cell, seed, generic=True):
    x, h, g = inputs(cell, seed)
    layout = ParameterLayout(cell)
    h_tilde = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    w_tilde = torch.randn(B, layout.size, generator=g, dtype=DTYPE)
    nu = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    tau = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]], dtype=DTYPE)
    return x, h, h_tilde, w_tilde, nu, tau, StepLinearization(cell, x, h, layout) if generic else None


@pytest.mark.parametrize("transition", TRANSITIONS)
def test_fused_gir_step_equals_the_update_on_generic_products(transition):
    """Cooijmans & Martens' GIR: gamma = sqrt((|w~| + eps) / (|J h~| + eps)), beta = sqrt((|nu^T J_theta| + eps) /
    (|nu| + eps)), h~' = gamma J h~ + beta tau nu, w~' = w~ / gamma + (tau / beta) nu^T J_theta."""
    cell = make_cell(transition, "modrelu", seed=12)
    x, h, h_tilde, w_tilde, nu, tau, generic = _step_inputs(cell, 13)
    eps = 1e-7
    propagated, pulled = generic.state_jvp(h_tilde), generic.parameter_vjp(nu)
    norm = lambda t: torch.linalg.vector_norm(t, dim=1, keepdim=True)  # noqa: E731
    gamma = ((norm(w_tilde) + eps) / (norm(propagated) + eps)).sqrt()
    beta = ((norm(pulled) + eps) / (norm(nu) + eps)).sqrt()

    fused = OrthogonalUOROStep(cell, "state", eps)
    h_new, h_tilde_new, inverse_gamma, pending, _ = fused.gir(x, h, h_tilde, w_tilde.clone(), nu, tau)
    torch.testing.assert_close(h_new, generic.h_new, **TIGHT)
    torch.testing.assert_close(h_tilde_new, gamma * propagated + beta * tau * nu, **TIGHT)
    for _ in range(2):  # a new w_tilde tensor each time: nothing of the previous one is reused
        updated = w_tilde.clone()
        fused.commit(updated, inverse_gamma, pending, h, x)
        torch.testing.assert_close(updated, w_tilde / gamma + tau / beta * pulled, **TIGHT)


def test_fused_fixed_step_equals_the_update_on_generic_products():
    cell = make_cell("aux", "tanh", seed=14)
    x, h, h_tilde, w_tilde, scaled, _, generic = _step_inputs(cell, 15)
    dual = torch.randn(B, HIDDEN, dtype=DTYPE)
    h_new, h_tilde_new, w_tilde_new = OrthogonalUOROStep(cell, "state", 1e-7).fixed(
        x, h, h_tilde, w_tilde, scaled, dual, 0.5
    )
    torch.testing.assert_close(h_tilde_new, generic.state_jvp(h_tilde) + 0.5 * scaled, **TIGHT)
    torch.testing.assert_close(w_tilde_new, w_tilde + generic.parameter_vjp(dual) / 0.5, **TIGHT)


@pytest.mark.parametrize("parameter", ["bias", "input_kernel.weight", "transition.weight"])
def test_fused_step_carries_a_nan_state_into_h_tilde(parameter):
    """The estimator checks h_tilde' only: a NaN state must show there, also where modReLU's slope is 0."""
    cell = make_cell("aux", "modrelu", seed=16)
    with torch.no_grad():
        dict(cell.named_parameters())[parameter].view(-1)[1] = float("nan")
    x, h, h_tilde, w_tilde, nu, tau, _ = _step_inputs(cell, 17, generic=False)  # the cell itself raises
    fused = OrthogonalUOROStep(cell, "state", 1e-7)
    h_new, h_tilde_new, _, _, _ = fused.gir(x, h, h_tilde, w_tilde, nu, tau)
    assert not torch.isfinite(h_new).all() and not torch.isfinite(h_tilde_new).all()
    assert not torch.isfinite(fused.fixed(x, h, h_tilde, w_tilde, nu, nu, 1.0)[1]).all()


def test_fused_step_is_offered_for_the_state_cut_of_closed_form_cells_only():
    assert fusable_orthogonal_cell(make_cell("cayley", "tanh"), "state")
    assert not fusable_orthogonal_cell(make_cell("aux", "tanh"), "preactivation")
    network = OrthogonalRNNCell(INPUTS, HIDDEN, network=torch.nn.Linear(HIDDEN, HIDDEN))
    assert not fusable_orthogonal_cell(network, "state")
    with pytest.raises(ValueError, match="projection must be 'state'"):
        OrthogonalUOROStep(make_cell("aux", "tanh"), "parameter", 1e-7)


def test_the_fused_orthogonal_step_draws_what_uoro_draws():
    """nu = randn(streams, H), then tau = 2 randint(0, 2, (streams,)) - 1 from the state's generator: the one draw
    of UORO, which its fused orthogonal step takes as tau (B, 1)."""
    estimator = UORO(make_cell("aux", "tanh"), generator=3)
    assert isinstance(estimator._fused, OrthogonalUOROStep)
    state = estimator.initial_state(torch.zeros(5, HIDDEN, dtype=DTYPE))
    nu, tau = estimator._noise(state, HIDDEN, state.h, (1,))
    reference = torch.Generator().manual_seed(3)
    expected_nu = torch.randn(5, HIDDEN, generator=reference, dtype=DTYPE)
    expected_tau = torch.randint(0, 2, (5,), generator=reference).to(DTYPE) * 2 - 1
    assert torch.equal(nu, expected_nu) and torch.equal(tau[:, 0], expected_tau) and tau.shape == (5, 1)


@pytest.mark.parametrize("transition", ["cayley", "matrix_exp"])
def test_skew_maps_at_a_degenerate_spectrum(transition):
    """A = 0 (every eigenvalue equal, where divided differences of exp would cancel) and A with a repeated pair."""
    cell = make_cell(transition, "tanh", seed=18)
    x, h, g = inputs(cell, 19)
    original = cell.transition.linear.parametrizations.weight.original
    c = torch.randn(B, HIDDEN, generator=g, dtype=DTYPE)
    for skew in (torch.zeros(HIDDEN, HIDDEN, dtype=DTYPE), torch.diag(torch.tensor([0.5, 0.0, 0.5], dtype=DTYPE), -1)):
        with torch.no_grad():
            original.copy_(skew)  # tril(X) - tril(X)^T: rotations by the same angle in two planes
        layout = ParameterLayout(cell)
        fast, generic = linearize(cell, x, h, layout), StepLinearization(cell, x, h, layout)
        torch.testing.assert_close(fast.parameter_vjp(c), generic.parameter_vjp(c), **TIGHT)
