"""KF-RTRL (Mujika, Meier & Steger 2018): unbiased against exact RTRL, exactly (the mean over every sign sequence)
and statistically (its own generator, a test with a stated false-alarm rate and shown power); its variance against
UORO's; streams, resets, its generator, checkpoints and bad input."""

from __future__ import annotations

import io
import itertools
import math
import statistics

import pytest
import torch

from lightning_ortho.online import RTRL, UORO, GRUCell, ModReLURNNCell, TanhRNNCell
from lightning_ortho.online.kf_rtrl import KFRTRL

DTYPE = torch.float64
HIDDEN, INPUTS, STEPS = 3, 2, 5
DRAWS = 20_000
#: Family-wise false-alarm rate of one unbiasedness test: each of the P parameters is tested at FALSE_ALARM / P
#: (Bonferroni), two-sided, on the mean of DRAWS independent estimates (normal approximation).
FALSE_ALARM = 1e-3
#: Every sign sequence of STEPS steps: (STEPS, 4**STEPS, 2), (c1, c2) of step t for stream s at [t, s].
EVERY_SIGN_SEQUENCE = (
    torch.tensor(list(itertools.product([-1.0, 1.0], repeat=2 * STEPS)), dtype=DTYPE).view(-1, STEPS, 2).transpose(0, 1)
)


def critical_z(parameters: int) -> float:
    return statistics.NormalDist().inv_cdf(1 - FALSE_ALARM / (2 * parameters))


def make_cell(seed: int = 0) -> TanhRNNCell:
    torch.manual_seed(seed)
    return TanhRNNCell(INPUTS, HIDDEN).to(DTYPE)


def sequence(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(STEPS, INPUTS, generator=g, dtype=DTYPE)
    h0 = 0.5 * torch.randn(HIDDEN, generator=g, dtype=DTYPE)
    loss_gradients = torch.randn(STEPS, HIDDEN, generator=g, dtype=DTYPE)
    return xs, h0, loss_gradients


def total_estimates(estimator, xs, h0, loss_gradients, streams: int, reset_at: int | None = None) -> torch.Tensor:
    """``(streams, P)``: each row one estimate of ``d sum_t L_t / d theta`` on identical inputs; ``reset_at``:
    every stream restarts from ``h0`` before that step (0-based)."""
    state = estimator.initial_state(h0.expand(streams, -1).clone())
    total = torch.zeros(streams, estimator.layout.size, dtype=DTYPE)
    for t in range(xs.shape[0]):
        if t == reset_at:
            state = estimator.reset(state, torch.ones(streams, dtype=torch.bool), h0)
        _, state = estimator.step(xs[t].expand(streams, -1).clone(), state)
        grads = estimator.gradient(state, loss_gradients[t].expand(streams, -1).clone(), per_stream=True)
        total += estimator.layout.flatten(grads, lead=1)
    return total


def z_scores(estimates: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-parameter z of the mean against the reference; a parameter of zero spread must equal it exactly."""
    spread = estimates.std(0) / math.sqrt(estimates.shape[0])
    gap = estimates.mean(0) - reference
    constant = spread == 0
    z = gap / torch.where(constant, torch.ones_like(spread), spread)
    return torch.where(constant, torch.where(gap == 0, 0.0, math.inf), z)


class GivenSigns(KFRTRL):
    """KF-RTRL whose signs at step t are ``signs[t]`` ``(B, 2)`` instead of draws; ``p1`` scaled by ``p1_scale``."""

    def __init__(self, cell, signs: torch.Tensor, p1_scale: float = 1.0) -> None:
        super().__init__(cell, generator=0)
        self.given, self.p1_scale = signs, p1_scale

    def _signs(self, state, like):
        signs = self.given[state.step].to(like)
        return signs[:, 0], signs[:, 1]

    def _balance(self, input_factor, propagated, inputs, local):
        p1, p2 = super()._balance(input_factor, propagated, inputs, local)
        return self.p1_scale * p1, p2


class BiasedCoin(KFRTRL):
    """A deliberately biased KF-RTRL: both signs are +1 with probability ``q`` (so ``E[c1 c2] = (2 q - 1)^2``)."""

    def __init__(self, cell, q: float) -> None:
        super().__init__(cell, generator=7)
        self.q = q

    def _signs(self, state, like):
        draws = torch.rand(like.shape[0], 2, generator=state.generator, dtype=like.dtype)
        signs = torch.where(draws < self.q, 1.0, -1.0).to(like)
        return signs[:, 0], signs[:, 1]


def exact_moments(estimator_factory, xs, h0, loss_gradients, reset_at=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact mean ``(P,)`` and total variance of the estimate: every sign sequence, each equally likely."""
    streams = EVERY_SIGN_SEQUENCE.shape[1]
    estimates = total_estimates(estimator_factory(EVERY_SIGN_SEQUENCE), xs, h0, loss_gradients, streams, reset_at)
    return estimates.mean(0), estimates.var(0, correction=0).sum()


# -- unbiasedness ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reset_at", [None, 2])
def test_the_mean_over_every_sign_sequence_is_the_rtrl_gradient(reset_at):
    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1, reset_at)[0]
    mean, _ = exact_moments(lambda signs: GivenSigns(cell, signs), xs, h0, loss_gradients, reset_at)
    torch.testing.assert_close(mean, exact, rtol=1e-12, atol=1e-12)


def test_one_sign_for_both_factors_is_still_unbiased():
    """c2 = c1 (one fair sign per step): tau_t = c2_t c1_1 ... c1_t = c1_1 ... c1_{t-1} are still independent fair
    signs from the second step on (the first has no cross term), so the mean over every sequence is RTRL's."""
    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    one = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=STEPS)), dtype=DTYPE).T[:, :, None].expand(-1, -1, 2)
    estimates = total_estimates(GivenSigns(cell, one), xs, h0, loss_gradients, one.shape[1])
    torch.testing.assert_close(estimates.mean(0), exact, rtol=1e-12, atol=1e-12)
    assert (estimates - exact).abs().max() > 0.1  # random all the same


@pytest.mark.parametrize("p1_scale", [1 / 3, 3.0])
def test_any_positive_balance_is_unbiased_and_the_paper_s_has_less_variance(p1_scale):
    """Mis-scaled ``p1`` keeps the mean (E[c1 c2] = 0 whatever p) but adds variance on this sequence."""
    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    mean, variance = exact_moments(lambda s: GivenSigns(cell, s, p1_scale), xs, h0, loss_gradients)
    _, optimal = exact_moments(lambda s: GivenSigns(cell, s), xs, h0, loss_gradients)
    torch.testing.assert_close(mean, exact, rtol=1e-12, atol=1e-12)
    assert variance > 1.2 * optimal, f"{variance:.3f} vs {optimal:.3f}"


def test_kf_rtrl_with_its_generator_is_unbiased():
    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    estimates = total_estimates(KFRTRL(cell, generator=7), xs, h0, loss_gradients, DRAWS)
    z = z_scores(estimates, exact)
    assert z.abs().max() < critical_z(exact.numel()), f"max |z| = {z.abs().max():.2f}"


def test_the_unbiasedness_test_detects_a_small_bias():
    """Power: the same test rejects signs from a coin of P(+1) = 0.7 (a bias of 6 % of the gradient's norm, max |z|
    12.5 expected), signs never drawn, and a 5 % scaled exact gradient (max |z| about 9)."""
    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    critical = critical_z(exact.numel())
    biased = total_estimates(BiasedCoin(cell, 0.7), xs, h0, loss_gradients, DRAWS)
    assert z_scores(biased, exact).abs().max() > critical
    no_signs = GivenSigns(cell, torch.ones(STEPS, 2, 2, dtype=DTYPE))  # two identical (deterministic) estimates
    assert z_scores(total_estimates(no_signs, xs, h0, loss_gradients, 2), exact).abs().max() > critical
    estimates = total_estimates(KFRTRL(cell, generator=7), xs, h0, loss_gradients, DRAWS)
    assert z_scores(estimates, 1.05 * exact).abs().max() > critical


def test_the_estimate_is_uoro_without_spatial_projection_given_the_same_signs():
    """UORO(projection="none") with tau_t = c2_t c1_1 ... c1_t gives the same estimates (its factors are KF-RTRL's
    up to the sign c1_1 ... c1_t)."""
    c1, c2 = EVERY_SIGN_SEQUENCE[..., 0], EVERY_SIGN_SEQUENCE[..., 1]
    taus = c2 * c1.cumprod(0)  # (STEPS, streams)

    class GivenTau(UORO):
        def _noise(self, state, size, like):
            return like.new_zeros(like.shape[0], size), taus[state.step].to(like)

    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    streams = EVERY_SIGN_SEQUENCE.shape[1]
    kf = total_estimates(GivenSigns(cell, EVERY_SIGN_SEQUENCE), xs, h0, loss_gradients, streams)
    uoro = total_estimates(GivenTau(cell, projection="none", generator=0), xs, h0, loss_gradients, streams)
    torch.testing.assert_close(kf, uoro, rtol=1e-10, atol=1e-12)


def test_variance_is_lower_than_uoro_with_a_spatial_projection():
    """Measured 7-12x lower than UORO's (state or preactivation cut, GIR) over 12 cells and sequences; asserted 3x."""
    cell = make_cell()
    xs, h0, loss_gradients = sequence()
    _, kf_variance = exact_moments(lambda s: GivenSigns(cell, s), xs, h0, loss_gradients)
    for projection in ("state", "preactivation"):
        uoro = total_estimates(UORO(cell, projection=projection, generator=7), xs, h0, loss_gradients, DRAWS)
        uoro_variance = uoro.var(0).sum()
        assert kf_variance * 3 < uoro_variance, f"{projection}: KF-RTRL {kf_variance:.2f}, UORO {uoro_variance:.2f}"


# -- interface properties --------------------------------------------------------------------------------------
def run_steps(estimator, state, xs, loss_gradients):
    grads = []
    for t in range(xs.shape[1]):
        _, state = estimator.step(xs[:, t], state)
        grads.append(estimator.layout.flatten(estimator.gradient(state, loss_gradients[:, t], per_stream=True), 1))
    return state, torch.stack(grads, 1)


def batch(streams: int = 4, steps: int = 6, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(streams, steps, INPUTS, generator=g, dtype=DTYPE)
    loss_gradients = torch.randn(streams, steps, HIDDEN, generator=g, dtype=DTYPE)
    h0 = 0.5 * torch.randn(streams, HIDDEN, generator=g, dtype=DTYPE)
    return xs, loss_gradients, h0


def test_per_stream_estimates_sum_to_the_summed_one_and_the_generic_path_agrees():
    cell = make_cell()
    xs, loss_gradients, h0 = batch()
    closed, generic = KFRTRL(cell, generator=4), KFRTRL(cell, generator=4, closed_form=False)
    a, b = closed.initial_state(h0), generic.initial_state(h0)
    for t in range(xs.shape[1]):
        _, a = closed.step(xs[:, t], a)
        _, b = generic.step(xs[:, t], b)
        per_stream = closed.gradient(a, loss_gradients[:, t], per_stream=True)
        summed = closed.gradient(a, loss_gradients[:, t])
        for name, value in summed.items():
            assert per_stream[name].shape == (h0.shape[0], *value.shape)
            torch.testing.assert_close(per_stream[name].sum(0), value, rtol=1e-12, atol=1e-13)
        for name, value in generic.gradient(b, loss_gradients[:, t], per_stream=True).items():
            torch.testing.assert_close(value, per_stream[name], rtol=1e-10, atol=1e-12)


def test_a_seed_fixes_the_signs_and_the_state_dict_resumes_bit_exactly():
    cell = make_cell()
    xs, loss_gradients, h0 = batch(steps=4)
    estimator = KFRTRL(cell, generator=11)
    _, straight = run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)
    _, again = run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)
    assert torch.equal(straight, again)
    other_estimator = KFRTRL(cell, generator=12)
    _, other = run_steps(other_estimator, other_estimator.initial_state(h0), xs, loss_gradients)
    assert not torch.equal(straight, other)

    first, head = run_steps(estimator, estimator.initial_state(h0), xs[:, :3], loss_gradients[:, :3])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = KFRTRL(cell, generator=999).initial_state(h0)  # a different seed: the saved generator must win
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.step == 3 and resumed.kind == "kf_rtrl"
    _, tail = run_steps(estimator, resumed, xs[:, 3:], loss_gradients[:, 3:])
    assert torch.equal(torch.cat([head, tail], 1), straight)


def test_a_uoro_state_is_not_loaded_into_kf_rtrl():
    cell = make_cell()
    h0 = torch.zeros(2, HIDDEN, dtype=DTYPE)
    saved = UORO(cell, projection="none", generator=0).initial_state(h0).state_dict()
    with pytest.raises(ValueError, match="'uoro' estimator"):
        KFRTRL(cell, generator=0).initial_state(h0).load_state_dict(saved)


def test_streams_split_over_processes_draw_the_signs_of_one_process():
    cell = make_cell()
    xs, loss_gradients, h0 = batch(seed=4)
    estimator = KFRTRL(cell, generator=5)
    _, together = run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)
    for rank in (0, 1):
        rows = torch.arange(rank, 4, 2)
        state = estimator.initial_state(h0[rows], stream_ids=rows, total_streams=4)
        _, alone = run_steps(estimator, state, xs[rows], loss_gradients[rows])
        torch.testing.assert_close(alone, together[rows], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="stream_ids"):
        estimator.initial_state(h0[:2], stream_ids=torch.tensor([0, 4]), total_streams=4)


def test_reset_restarts_only_the_masked_streams():
    cell = make_cell()
    xs, _, h0 = batch(streams=3, seed=6)
    estimator = KFRTRL(cell, generator=2)
    state = estimator.initial_state(h0)
    for t in range(4):
        _, state = estimator.step(xs[:, t], state)
    mask = torch.tensor([False, True, False])
    reset = estimator.reset(state, mask, h0=h0)
    for name in ("input_factor", "hidden_factor"):
        assert torch.equal(reset.tensors[name][~mask], state.tensors[name][~mask])
        assert reset.tensors[name][mask].abs().max() == 0 and state.tensors[name][mask].abs().max() > 0
    assert torch.equal(reset.h[1], h0[1]) and torch.equal(reset.h[0], state.h[0])
    assert torch.equal(reset.tensors["stream_ids"], state.tensors["stream_ids"])


# -- bad input ---------------------------------------------------------------------------------------------------
def test_cells_without_the_factorisation_are_refused():
    with pytest.raises(ValueError, match="z = W a"):
        KFRTRL(GRUCell(INPUTS, HIDDEN).to(DTYPE))
    with pytest.raises(ValueError, match="z = W a"):
        KFRTRL(ModReLURNNCell(INPUTS, HIDDEN).to(DTYPE))  # its bias acts after the preactivation
    cell = make_cell()
    cell.extra = torch.nn.Parameter(torch.zeros(1, dtype=DTYPE))
    with pytest.raises(ValueError, match="outside the preactivation"):
        KFRTRL(cell)


def test_weights_of_different_rows_and_a_mismatched_input_are_refused():
    class WrongInput(TanhRNNCell):
        def preactivation_input(self, x, h):
            return torch.cat([super().preactivation_input(x, h), h[:, :1]], dim=1)

    torch.manual_seed(0)
    with pytest.raises(ValueError, match="preactivation_input returned shape"):  # found at construction
        KFRTRL(WrongInput(INPUTS, HIDDEN).to(DTYPE))
    cell = make_cell()
    cell.bias = torch.nn.Parameter(torch.zeros(HIDDEN + 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="one Z"):
        KFRTRL(cell)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"eps": -1.0}, "eps"), ({"eps": True}, "eps"), ({"generator": "seed"}, "generator")],
)
def test_bad_configuration_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KFRTRL(make_cell(), **kwargs)


def test_bad_step_and_gradient_inputs_are_refused():
    estimator = KFRTRL(make_cell(), generator=0)
    with pytest.raises(ValueError, match="h0 must have shape"):
        estimator.initial_state(torch.zeros(2, HIDDEN + 1, dtype=DTYPE))
    state = estimator.initial_state(torch.zeros(2, HIDDEN, dtype=DTYPE))
    with pytest.raises(ValueError, match="NaN"):
        estimator.step(torch.full((2, INPUTS), float("nan"), dtype=DTYPE), state)
    with pytest.raises(ValueError, match="float64"):
        estimator.step(torch.zeros(2, INPUTS), state)
    with pytest.raises(ValueError, match="input_size"):
        estimator.step(torch.zeros(2, INPUTS + 1, dtype=DTYPE), state)
    with pytest.raises(ValueError, match="shape"):
        estimator.gradient(state, torch.zeros(3, HIDDEN, dtype=DTYPE))
    with pytest.raises(ValueError, match="NaN"):
        estimator.gradient(state, torch.full((2, HIDDEN), float("inf"), dtype=DTYPE))
