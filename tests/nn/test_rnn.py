import math

import pytest
import torch

from lightning_ortho.nn import AuxiliaryReflection, HouseholderProduct
from lightning_ortho.nn.rnn import OrthogonalRNN, OrthogonalRNNCell, cayley_initial_orthogonal, modrelu

DTYPE = torch.float64
MAPS = ["aux", "householder", "cayley", "matrix_exp"]


def test_cayley_initialisation_is_the_cayley_transform_of_the_skew_init():
    d = 9
    generator = torch.Generator().manual_seed(5)
    angles = torch.empty(d // 2, dtype=DTYPE).uniform_(0.0, math.pi / 2, generator=torch.Generator().manual_seed(5))
    s = -torch.sqrt((1 - torch.cos(angles)) / (1 + torch.cos(angles)))  # Helfrich et al. / expRNN
    a = torch.zeros(d, d, dtype=DTYPE)
    for i, value in enumerate(s):
        a[2 * i, 2 * i + 1], a[2 * i + 1, 2 * i] = value, -value
    eye = torch.eye(d, dtype=DTYPE)
    expected = torch.linalg.solve(eye + a, eye - a)
    torch.testing.assert_close(cayley_initial_orthogonal(d, generator=generator, dtype=DTYPE), expected)


def test_modrelu_definition():
    z = torch.tensor([-2.0, -0.5, 0.0, 0.3, 3.0])
    b = torch.tensor([0.1, -1.0, 0.5, -0.1, -4.0])
    expected = torch.tensor([-2.1, -0.0, 0.0, 0.2, 0.0])
    torch.testing.assert_close(modrelu(z, b), expected)


@pytest.fixture
def float64_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("transition", MAPS)
def test_every_map_starts_from_the_same_transition_and_unrolls_like_the_dense_reference(transition, float64_default):
    torch.manual_seed(1)
    rnn = OrthogonalRNN(2, 12, transition=transition)
    assert rnn.cayley_initialised
    torch.manual_seed(1)
    u = cayley_initial_orthogonal(12, dtype=DTYPE)
    cell = rnn.cell
    x = torch.randn(3, 7, 2, dtype=DTYPE)
    h = rnn.initial_state.detach().expand(3, -1)
    v, b = cell.input_kernel.weight.detach(), cell.bias.detach()
    expected = []
    for t in range(7):  # h_t = modReLU(U h + V x_t; b) with the dense U
        h = modrelu(h @ u.T + x[:, t] @ v.T, b)
        expected.append(h)
    outputs, last = rnn(x)
    torch.testing.assert_close(outputs, torch.stack(expected, 1), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(last, expected[-1], rtol=1e-8, atol=1e-8)


def test_one_seed_gives_every_map_the_same_initial_state_input_kernel_and_bias():
    models = []
    for transition, reflections in [(m, None) for m in MAPS] + [("householder", 1)]:
        torch.manual_seed(4)
        models.append(OrthogonalRNN(3, 10, transition=transition, reflections=reflections))
    for other in models[1:]:
        for name in ("initial_state", "cell.input_kernel.weight", "cell.bias"):
            torch.testing.assert_close(other.get_parameter(name), models[0].get_parameter(name))


def test_fewer_reflections_than_h_keep_their_own_init():
    rnn = OrthogonalRNN(1, 10, transition="householder", reflections=1)
    assert not rnn.cayley_initialised and rnn.cell.transition.k == 1
    with pytest.raises(ValueError, match="reflections"):
        OrthogonalRNNCell(1, 10, transition="aux", reflections=3)


@pytest.mark.parametrize("transition", MAPS)
def test_cached_transition_gives_identical_values_and_gradients(transition):
    rnn = OrthogonalRNN(2, 8, transition=transition).to(DTYPE)
    x = torch.randn(4, 6, 2, dtype=DTYPE)
    cached = torch.autograd.grad(rnn(x)[1].pow(2).sum(), list(rnn.parameters()))
    manual_h = rnn.initial_state.expand(4, -1)
    for t in range(6):  # the cell step by step, no caching
        manual_h = rnn.cell(x[:, t], manual_h)
    uncached = torch.autograd.grad(manual_h.pow(2).sum(), list(rnn.parameters()))
    for a, b in zip(cached, uncached, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("transition", ["aux", "householder", "cayley"])
def test_cell_is_a_pure_function_for_torch_func(transition):
    cell = OrthogonalRNNCell(3, 6, transition=transition).to(DTYPE)
    params = {name: p.detach().clone() for name, p in cell.named_parameters()}
    x = torch.randn(2, 3, dtype=DTYPE)
    h = torch.randn(2, 6, dtype=DTYPE)

    def step(p, h):
        return torch.func.functional_call(cell, p, (x, h))

    torch.testing.assert_close(step(params, h), cell(x, h))
    # forward-mode product J_h . t against the reverse-mode Jacobian (both exact, no finite differences)
    tangent = torch.randn_like(h)
    _, jvp_out = torch.func.jvp(lambda h: step(params, h), (h,), (tangent,))
    jac = torch.func.jacrev(lambda h: step(params, h))(h)  # (2, 6, 2, 6)
    torch.testing.assert_close(jvp_out, torch.einsum("bihj,hj->bi", jac, tangent))
    # and with respect to the parameters
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    _, jvp_params = torch.func.jvp(lambda p: step(p, h), (params,), (tangents,))
    jac_params = torch.func.jacrev(lambda p: step(p, h))(params)
    expected = sum(torch.einsum("bi...,...->bi", jac_params[k], tangents[k]) for k in params)
    torch.testing.assert_close(jvp_params, expected)


def test_initial_state_and_input_checks():
    rnn = OrthogonalRNN(1, 50)
    bound = math.sqrt(3 / 100)
    assert rnn.initial_state.abs().max() <= bound and rnn.initial_state.abs().max() > 0
    with pytest.raises(ValueError, match=r"\(batch, time, 1\)"):
        rnn(torch.randn(4, 10))
    with pytest.raises(ValueError, match=r"\(\.\.\., 1\)"):
        rnn(torch.randn(4, 10, 2))
    with pytest.raises(ValueError, match="NaN"):
        rnn(torch.full((2, 3, 1), float("nan")))


def test_transition_types():
    assert isinstance(OrthogonalRNNCell(1, 4, transition="aux").transition, AuxiliaryReflection)
    assert isinstance(OrthogonalRNNCell(1, 4, transition="householder").transition, HouseholderProduct)


def test_zero_time_steps_and_zero_sizes():
    # Issue 9, smaller items: zero steps crashed in torch.stack; OrthogonalRNN(1, 0) divided by zero.
    rnn = OrthogonalRNN(1, 4)
    outputs, last = rnn(torch.rand(3, 0, 1))
    assert outputs.shape == (3, 0, 4)
    torch.testing.assert_close(last, rnn.initial_state.expand(3, 4))  # no step taken: the state is h0
    for args in ((1, 0), (0, 4)):
        with pytest.raises(ValueError, match="must be a positive integer"):
            OrthogonalRNN(*args)
