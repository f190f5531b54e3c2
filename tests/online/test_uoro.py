"""UORO: unbiased for every projection and rescaling (a statistical test with a stated false-alarm rate),
streams, resets, its generator, checkpoints, and bad configuration."""

from __future__ import annotations

import io
import math
import statistics

import pytest
import torch

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import RTRL, UORO, GRUCell, ModReLURNNCell, TanhRNNCell, TruncatedBPTT

HIDDEN, INPUTS, STEPS = 3, 2, 5
DRAWS = 20_000
#: Family-wise false-alarm rate of one unbiasedness test: each of the P parameters is tested at FALSE_ALARM / P
#: (Bonferroni), two-sided, on the mean of DRAWS independent estimates (normal approximation).
FALSE_ALARM = 1e-3


def critical_z(parameters: int) -> float:
    return statistics.NormalDist().inv_cdf(1 - FALSE_ALARM / (2 * parameters))


def make_cell(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "tanh":
        cell = TanhRNNCell(INPUTS, HIDDEN)
    elif kind == "gru":
        cell = GRUCell(INPUTS, HIDDEN)
    elif kind == "modrelu":
        cell = ModReLURNNCell(INPUTS, HIDDEN)
    else:
        cell = OrthogonalRNNCell(INPUTS, HIDDEN, transition=kind)
    return cell.double()


def sequence(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(STEPS, INPUTS, generator=g, dtype=torch.float64)
    h0 = 0.5 * torch.randn(HIDDEN, generator=g, dtype=torch.float64)
    loss_gradients = torch.randn(STEPS, HIDDEN, generator=g, dtype=torch.float64)
    return xs, h0, loss_gradients


def total_estimates(estimator, xs, h0, loss_gradients, streams: int) -> torch.Tensor:
    """``(streams, P)``: each row one independent estimate of ``d sum_t L_t / d theta`` (identical inputs)."""
    state = estimator.initial_state(h0.expand(streams, -1).clone())
    total = torch.zeros(streams, estimator.layout.size, dtype=torch.float64)
    for t in range(xs.shape[0]):
        _, state = estimator.step(xs[t].expand(streams, -1).clone(), state)
        grads = estimator.gradient(state, loss_gradients[t].expand(streams, -1).clone(), per_stream=True)
        total += estimator.layout.flatten(grads, lead=1)
    return total


def z_scores(estimates: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-parameter z of the mean against the reference; a parameter the estimate never moves (zero spread, e.g.
    the unused upper triangle of a Cayley map's matrix) must equal the reference exactly and gets z = 0 or inf."""
    spread = estimates.std(0) / math.sqrt(estimates.shape[0])
    gap = estimates.mean(0) - reference
    constant = spread == 0
    z = gap / torch.where(constant, torch.ones_like(spread), spread)
    return torch.where(constant, torch.where(gap == 0, 0.0, math.inf), z)


CONFIGS = [
    ("tanh", "state", "gir"),
    ("tanh", "preactivation", "gir"),
    ("tanh", "parameter", "gir"),
    ("tanh", "none", "gir"),
    ("tanh", "state", "fixed"),
    ("tanh", "preactivation", "fixed-q0"),
    ("tanh", "none", "fixed"),
    ("gru", "state", "gir"),
    ("gru", "parameter", "fixed"),
    ("aux", "state", "gir"),
    ("aux", "preactivation", "gir"),  # modReLU's bias acts after z: projected at h with its own noise
    ("cayley", "preactivation", "fixed-q0"),
    ("modrelu", "preactivation", "gir"),  # closed form, bias after z
    ("modrelu", "state", "fixed"),
]


def rescaling_for(name: str, cut_size: int):
    if name == "gir":
        return "gir"
    alpha = torch.linspace(0.6, 1.4, STEPS, dtype=torch.float64)
    if name == "fixed":
        return (alpha, None)
    g = torch.Generator().manual_seed(5)
    return (
        alpha,
        torch.eye(cut_size, dtype=torch.float64)
        + 0.3 * torch.randn(cut_size, cut_size, generator=g, dtype=torch.float64),
    )


@pytest.mark.parametrize(("kind", "projection", "rescaling"), CONFIGS)
def test_uoro_is_unbiased(kind, projection, rescaling):
    cell = make_cell(kind)
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    # The cut of an OrthogonalRNNCell at its preactivation is {z, h}: 2 H entries (the bias acts after z).
    cut_size = 2 * HIDDEN if (kind in ("aux", "cayley", "modrelu") and projection == "preactivation") else HIDDEN
    estimator = UORO(cell, projection=projection, rescaling=rescaling_for(rescaling, cut_size), generator=7)
    estimates = total_estimates(estimator, xs, h0, loss_gradients, DRAWS)
    z = z_scores(estimates, exact)
    assert z.abs().max() < critical_z(exact.numel()), f"max |z| = {z.abs().max():.2f}"


def test_the_unbiasedness_test_detects_a_small_bias():
    """Power: the same test rejects the gradient of truncated BPTT (k = 2) and a 5 % scaled exact gradient."""
    cell = make_cell("tanh")
    xs, h0, loss_gradients = sequence()
    exact = total_estimates(RTRL(cell), xs, h0, loss_gradients, 1)[0]
    truncated = total_estimates(TruncatedBPTT(cell, 2), xs, h0, loss_gradients, 1)[0]
    estimates = total_estimates(UORO(cell, projection="none", generator=7), xs, h0, loss_gradients, DRAWS)
    assert z_scores(estimates, truncated).abs().max() > critical_z(exact.numel())
    assert z_scores(estimates, 1.05 * exact).abs().max() > critical_z(exact.numel())


def test_preactivation_projection_needs_a_preactivation():
    with pytest.raises(ValueError, match="preactivation"):
        UORO(make_cell("gru"), projection="preactivation")


def test_none_projection_needs_every_parameter_in_the_linear_preactivation():
    with pytest.raises(ValueError, match="z = W a"):
        UORO(make_cell("gru"), projection="none")
    with pytest.raises(ValueError, match="outside the preactivation"):
        cell = make_cell("tanh")
        cell.extra = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        UORO(cell, projection="none")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"projection": "spatial"}, "projection must be one of"),
        ({"rescaling": "greedy"}, "rescaling must be 'gir'"),
        ({"rescaling": (0.0, None)}, "alpha must be positive"),
        ({"rescaling": (1.0, torch.zeros(3, 3, dtype=torch.float64))}, "singular"),
        ({"rescaling": (1.0, torch.eye(3, 2, dtype=torch.float64))}, "square"),
        ({"projection": "none", "rescaling": (1.0, torch.eye(3, dtype=torch.float64))}, "Q0 must be None"),
        ({"eps": -1.0}, "eps"),
        ({"generator": "seed"}, "generator"),
    ],
)
def test_bad_configuration_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UORO(make_cell("tanh"), **kwargs)


def test_q0_of_the_wrong_size_for_the_cut_is_refused_at_the_first_step():
    estimator = UORO(make_cell("tanh"), projection="parameter", rescaling=(1.0, torch.eye(HIDDEN, dtype=torch.float64)))
    state = estimator.initial_state(torch.zeros(2, HIDDEN, dtype=torch.float64))
    with pytest.raises(ValueError, match="cut vertex"):
        estimator.step(torch.zeros(2, INPUTS, dtype=torch.float64), state)


def run_steps(estimator, state, xs, loss_gradients):
    grads = []
    for t in range(xs.shape[1]):
        _, state = estimator.step(xs[:, t], state)
        grads.append(estimator.layout.flatten(estimator.gradient(state, loss_gradients[:, t], per_stream=True), 1))
    return state, torch.stack(grads, 1)


def test_a_seed_fixes_the_noise_and_the_state_dict_resumes_bit_exactly():
    cell = make_cell("tanh")
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(4, 8, INPUTS, generator=g, dtype=torch.float64)
    loss_gradients = torch.randn(4, 8, HIDDEN, generator=g, dtype=torch.float64)
    h0 = torch.zeros(4, HIDDEN, dtype=torch.float64)
    estimator = UORO(cell, generator=11)
    _, straight = run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)
    _, again = run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)
    assert torch.equal(straight, again)

    first, head = run_steps(estimator, estimator.initial_state(h0), xs[:, :3], loss_gradients[:, :3])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = UORO(cell, generator=999).initial_state(h0)  # a different seed: the saved generator must win
    resumed.load_state_dict(torch.load(buffer))
    _, tail = run_steps(estimator, resumed, xs[:, 3:], loss_gradients[:, 3:])
    assert torch.equal(torch.cat([head, tail], 1), straight)


def test_no_seed_draws_one_from_the_global_generator():
    cell = make_cell("tanh")
    xs = torch.randn(2, 3, INPUTS, dtype=torch.float64)
    loss_gradients = torch.randn(2, 3, HIDDEN, dtype=torch.float64)
    h0 = torch.zeros(2, HIDDEN, dtype=torch.float64)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        estimator = UORO(cell)
        runs.append(run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)[1])
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_streams_split_over_processes_draw_the_noise_of_one_process():
    """Rows ``r::2`` of a 4-stream run equal a run that holds only those streams (DDP with 2 ranks)."""
    cell = make_cell("tanh")
    g = torch.Generator().manual_seed(4)
    xs = torch.randn(4, 6, INPUTS, generator=g, dtype=torch.float64)
    loss_gradients = torch.randn(4, 6, HIDDEN, generator=g, dtype=torch.float64)
    h0 = torch.zeros(4, HIDDEN, dtype=torch.float64)
    estimator = UORO(cell, projection="preactivation", generator=5)
    _, together = run_steps(estimator, estimator.initial_state(h0), xs, loss_gradients)
    for rank in (0, 1):
        rows = torch.arange(rank, 4, 2)
        state = estimator.initial_state(h0[rows], stream_ids=rows, total_streams=4)
        _, alone = run_steps(estimator, state, xs[rows], loss_gradients[rows])
        # The same noise; equal up to the rounding of batched products of another batch size.
        torch.testing.assert_close(alone, together[rows], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="stream_ids"):
        estimator.initial_state(h0[:2], stream_ids=torch.tensor([0, 4]), total_streams=4)


@pytest.mark.parametrize("projection", ["state", "none"])
def test_reset_restarts_only_the_masked_streams(projection):
    cell = make_cell("tanh")
    g = torch.Generator().manual_seed(6)
    xs = torch.randn(3, 6, INPUTS, generator=g, dtype=torch.float64)
    h0 = torch.randn(3, HIDDEN, generator=g, dtype=torch.float64)
    estimator = UORO(cell, projection=projection, generator=2)
    state = estimator.initial_state(h0)
    for t in range(4):
        _, state = estimator.step(xs[:, t], state)
    mask = torch.tensor([False, True, False])
    reset = estimator.reset(state, mask, h0=h0)
    for name in ("h_tilde", "w_tilde", "a_tilde"):
        if name in state.tensors:
            assert torch.equal(reset.tensors[name][~mask], state.tensors[name][~mask])
            assert reset.tensors[name][mask].abs().max() == 0
    assert torch.equal(reset.h[1], h0[1]) and torch.equal(reset.h[0], state.h[0])
    assert torch.equal(reset.tensors["stream_ids"], state.tensors["stream_ids"])


def test_bad_step_inputs_are_refused():
    estimator = UORO(make_cell("tanh"), generator=0)
    state = estimator.initial_state(torch.zeros(2, HIDDEN, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        estimator.step(torch.full((2, INPUTS), float("nan"), dtype=torch.float64), state)
    with pytest.raises(ValueError, match="float64"):
        estimator.step(torch.zeros(2, INPUTS), state)
    with pytest.raises(ValueError, match="shape"):
        estimator.gradient(state, torch.zeros(3, HIDDEN, dtype=torch.float64))


def test_an_overflowing_influence_approximation_raises_instead_of_poisoning_the_gradient():
    cell = make_cell("tanh")
    estimator = UORO(cell, generator=0)
    state = estimator.initial_state(torch.zeros(2, HIDDEN, dtype=torch.float64))
    _, state = estimator.step(torch.zeros(2, INPUTS, dtype=torch.float64), state)
    state.tensors["w_tilde"] = torch.full_like(state.tensors["w_tilde"], 1e308) * 10  # inf
    with pytest.raises(FloatingPointError, match="influence approximation .* overflowed"):
        estimator.step(torch.zeros(2, INPUTS, dtype=torch.float64), state)
