"""The contract of ``orthogonal(module, name)``: every map x shape (square, tall, wide, batched, convolution kernel,
recurrent gates) x dtype (float32, float64, complex64, complex128) gives orthonormal rows or columns, and the
parametrisation behaves as torch's parametrisations must (gradients, caching, vmap, state, copies, weight decay,
dtype changes). References: ``Q^H Q = I`` computed directly, autograd's numerical Jacobians, dense reflections."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_ortho.nn.orthogonal_weight import WEIGHT_MAPS, OrthogonalWeight, orthogonal, sample_haar_, update_base_
from lightning_ortho.nn.stiefel import householder_stiefel, orthonormality_error, stiefel_coordinates

DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]

#: name: (a module, its parameter, the matrices that parameter is read as: (..., rows, columns))
SHAPES = {
    "square": (lambda: nn.Linear(5, 5, bias=False), "weight", (5, 5)),
    "tall": (lambda: nn.Linear(3, 7, bias=False), "weight", (7, 3)),
    # n > 4k: the Cayley and exponential maps take their low-rank forms (the others are dense enough to solve densely)
    "very tall": (lambda: nn.Linear(3, 13, bias=False), "weight", (13, 3)),
    "wide": (lambda: nn.Linear(7, 3, bias=False), "weight", (3, 7)),
    "batched": (lambda: _Holder(torch.randn(2, 5, 3)), "weight", (2, 5, 3)),
    "conv2d kernel": (lambda: nn.Conv2d(3, 4, 2, bias=False), "weight", (4, 12)),
    "conv1d kernel": (lambda: nn.Conv1d(2, 8, 3, bias=False), "weight", (8, 6)),
    "gru gates": (lambda: nn.GRU(3, 4), "weight_hh_l0", (3, 4, 4)),
}


class _Holder(nn.Module):
    """A module with one parameter of any shape."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)


def _made(shape: str, dtype: torch.dtype, map: str = "householder", **options) -> tuple[nn.Module, str]:
    torch.manual_seed(0)
    make, name, _ = SHAPES[shape]
    module = make().to(dtype)
    return orthogonal(module, name, map=map, **options), name


def _error(weight: torch.Tensor, matrices: tuple[int, ...]) -> float:
    """``max |Q^H Q - I|`` of the shorter side of each matrix."""
    q = weight.reshape(matrices)
    return float(orthonormality_error(q if q.shape[-2] >= q.shape[-1] else q.mT))


def _tolerance(dtype: torch.dtype, matrices: tuple[int, ...]) -> float:
    return 10 * max(matrices[-2:]) * torch.finfo(dtype).eps


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_weight_has_orthonormal_rows_or_columns_and_keeps_its_shape(shape, dtype, map):
    module, name = _made(shape, dtype, map)
    weight, matrices = getattr(module, name), SHAPES[shape][2]
    original_shape = SHAPES[shape][0]().__getattr__(name).shape
    assert weight.shape == original_shape and weight.dtype == dtype
    assert _error(weight, matrices) <= _tolerance(dtype, matrices)


def _coordinates(module: nn.Module, name: str) -> tuple[nn.Module, torch.Tensor]:
    """The parametrisation of ``module.<name>`` and coordinates away from the initial ones' special values."""
    parametrization = getattr(module.parametrizations, name)[0]
    coordinates = getattr(module.parametrizations, name).original.detach().clone()
    coordinates += 0.1 * torch.randn_like(coordinates)
    return parametrization, coordinates.requires_grad_(True)


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gradcheck_of_the_map(shape, dtype, map):
    parametrization, coordinates = _coordinates(*_made(shape, dtype, map))
    assert torch.autograd.gradcheck(parametrization, (coordinates,))


#: the shapes whose second derivatives the default run checks (the others: -m slow)
_SECOND_ORDER = ["square", "tall", "wide"]


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize(
    "shape", [s if s in _SECOND_ORDER else pytest.param(s, marks=pytest.mark.slow) for s in SHAPES]
)
def test_gradgradcheck_of_the_map(shape, dtype, map):
    parametrization, coordinates = _coordinates(*_made(shape, dtype, map))
    assert torch.autograd.gradgradcheck(parametrization, (coordinates,))


def test_the_map_is_the_product_of_dense_reflections_and_signs():
    torch.manual_seed(1)
    coordinates = torch.randn(6, 4, dtype=torch.complex128)
    q = torch.eye(6, dtype=torch.complex128)
    for i in range(4):  # H_1 H_2 H_3 H_4, each I - 2 v v^H / v^H v with v = e_i + (column i below the diagonal)
        v = torch.zeros(6, dtype=torch.complex128)
        v[i] = 1
        v[i + 1 :] = coordinates[i + 1 :, i]
        q = q @ (torch.eye(6, dtype=torch.complex128) - 2 * torch.outer(v, v.conj()) / (v.conj() @ v))
    phases = coordinates.diagonal() / coordinates.diagonal().abs()
    torch.testing.assert_close(householder_stiefel(coordinates), q[:, :4] * phases, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_coordinates_of_an_orthonormal_matrix_map_back_to_it(dtype):
    torch.manual_seed(2)
    q = torch.linalg.qr(torch.randn(3, 9, 4, dtype=dtype)).Q
    torch.testing.assert_close(householder_stiefel(stiefel_coordinates(q)), q, rtol=0, atol=20 * torch.finfo(dtype).eps)


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["square", "tall", "wide", "conv2d kernel"])
def test_cached_weight_equals_the_uncached_one(shape, dtype, map):
    module, name = _made(shape, dtype, map)
    uncached = getattr(module, name)
    with parametrize.cached():
        first, second = getattr(module, name), getattr(module, name)
    assert first is second
    torch.testing.assert_close(first, uncached, rtol=0, atol=0)


@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_vmap_over_coordinates_equals_a_loop(dtype, map):
    module, name = _made("tall", dtype, map)
    parametrization = getattr(module.parametrizations, name)[0]
    batch = torch.randn(4, 7, 3, dtype=dtype)
    looped = torch.stack([parametrization(x) for x in batch])
    torch.testing.assert_close(torch.func.vmap(parametrization)(batch), looped, rtol=1e-13, atol=1e-13)


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["wide", "batched", "gru gates"])
def test_state_dict_saved_and_loaded_and_deepcopy_and_pickle_round_trip(shape, dtype, map):
    module, name = _made(shape, dtype, map, init="haar")
    with torch.no_grad():  # away from the base point, so that the coordinates matter too
        getattr(module.parametrizations, name).original.add_(
            0.1 * torch.randn_like(getattr(module.parametrizations, name).original)
        )
    weight = getattr(module, name).detach().clone()
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    fresh, _ = _made(shape, dtype, map, init="identity")
    fresh.load_state_dict(torch.load(buffer))
    for other in (fresh, copy.deepcopy(module)):
        torch.testing.assert_close(getattr(other, name), weight, rtol=0, atol=0)
    # the parametrisation itself (with its base point) pickles: what it computes is kept
    parametrizations = pickle.loads(pickle.dumps(getattr(module.parametrizations, name)))
    torch.testing.assert_close(parametrizations(), weight, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="state_dict"):  # a whole parametrised module: torch's parametrize refuses
        pickle.dumps(module)


@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("shape", ["square", "tall", "wide", "conv2d kernel"])
def test_weight_decay_keeps_the_weight_orthogonal(shape, map):
    module, name = _made(shape, torch.float64, map, init="haar")
    original = getattr(module.parametrizations, name).original
    optimizer = torch.optim.AdamW([original], lr=0.05, weight_decay=0.9)
    target = torch.randn_like(getattr(module, name))
    for _ in range(200):  # decay shrinks the diagonal that carries the column signs towards zero
        optimizer.zero_grad()
        (getattr(module, name) - target).square().sum().backward()
        optimizer.step()
    matrices = SHAPES[shape][2]
    if map == "householder":
        assert original.diagonal(dim1=-2, dim2=-1).abs().max() < 0.5  # decay did shrink it
    assert _error(getattr(module, name), matrices) <= _tolerance(torch.float64, matrices)


@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("shape", ["square", "tall", "conv1d kernel"])
def test_double_keeps_the_weight_orthogonal_to_float64_precision(shape, map):
    module, name = _made(shape, torch.float32, map, init="haar")
    module.double()
    matrices = SHAPES[shape][2]
    assert getattr(module, name).dtype == torch.float64
    assert _error(getattr(module, name), matrices) <= _tolerance(torch.float64, matrices)


def test_init_identity_haar_and_keep():
    identity, _ = _made("tall", torch.float64, init="identity")
    torch.testing.assert_close(identity.weight, torch.eye(7, 3, dtype=torch.float64), rtol=0, atol=1e-15)
    torch.manual_seed(3)
    linear = nn.Linear(4, 4, bias=False).double()
    q = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64)).Q
    with torch.no_grad():
        linear.weight.copy_(q)
    orthogonal(linear)  # init="keep": an orthogonal weight stays what it is
    torch.testing.assert_close(linear.weight, q, rtol=0, atol=1e-14)
    first = orthogonal(nn.Linear(5, 5), init="haar", generator=torch.Generator().manual_seed(4)).weight
    again = orthogonal(nn.Linear(5, 5), init="haar", generator=torch.Generator().manual_seed(4)).weight
    torch.testing.assert_close(first, again, rtol=0, atol=0)


def test_haar_samples_have_the_moments_of_the_uniform_distribution():
    # Entries of a Haar-random orthogonal n x n matrix: mean 0, E[q^2] = 1/n, E[q^4] = 3 / (n (n + 2)).
    module = orthogonal(nn.Linear(6, 6, bias=False).double())
    generator = torch.Generator().manual_seed(5)
    samples = torch.stack([sample_haar_(module, generator=generator).weight.detach().clone() for _ in range(2000)])
    assert samples.mean().abs() < 0.01
    assert abs(samples.square().mean().item() - 1 / 6) < 0.005
    assert abs(samples.pow(4).mean().item() - 3 / (6 * 8)) < 0.005
    determinants = torch.linalg.det(samples)  # both components of O(n), about evenly
    assert 0.4 < (determinants > 0).double().mean().item() < 0.6


def test_assigning_a_non_orthogonal_weight_is_refused_unless_projection_is_asked_for():
    module = orthogonal(nn.Linear(4, 6, bias=False).double())
    weight = torch.randn(6, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="project=True"):
        module.weight = weight
    projected = orthogonal(nn.Linear(4, 6, bias=False).double(), project=True)
    projected.weight = weight
    q, r = torch.linalg.qr(weight)
    torch.testing.assert_close(projected.weight, q * r.diagonal().sign(), rtol=0, atol=1e-14)
    orthonormal = torch.linalg.qr(torch.randn(6, 4, dtype=torch.float64)).Q
    module.weight = orthonormal  # an orthogonal weight is taken as it is
    torch.testing.assert_close(module.weight, orthonormal, rtol=0, atol=1e-14)


def test_remove_keeps_the_orthogonal_weight_as_a_parameter():
    module, name = _made("conv2d kernel", torch.float64, init="haar")
    weight = module.weight.detach().clone()
    parametrize.remove_parametrizations(module, name)
    assert isinstance(module.weight, nn.Parameter) and not parametrize.is_parametrized(module)
    torch.testing.assert_close(module.weight, weight, rtol=0, atol=1e-15)


def test_layers_still_run_and_train():
    torch.manual_seed(6)
    layers = [
        orthogonal(nn.Linear(5, 3)),
        orthogonal(nn.Conv2d(2, 4, 3, padding=1)),
        orthogonal(nn.Conv3d(2, 6, 2)),  # (6, 2 * 2 * 2 * 2): orthonormal rows
        orthogonal(orthogonal(nn.LSTM(3, 4), "weight_hh_l0"), "weight_ih_l0"),
    ]
    inputs = [torch.randn(2, 5), torch.randn(2, 2, 5, 5), torch.randn(1, 2, 3, 3, 3), torch.randn(6, 2, 3)]
    for layer, x in zip(layers, inputs, strict=True):
        out = layer(x)
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        assert all(p.grad is not None for p in layer.parameters() if p.requires_grad)
    kernel = layers[2].weight.detach().reshape(6, 16)
    torch.testing.assert_close(kernel @ kernel.mT, torch.eye(6), rtol=0, atol=1e-5)
    for block in layers[3].weight_hh_l0.detach().view(4, 4, 4):  # each gate's block orthogonal
        torch.testing.assert_close(block @ block.mT, torch.eye(4), rtol=0, atol=1e-5)


def test_meta_modules_take_the_parametrisation_without_values():
    module = orthogonal(nn.Linear(6, 3, device="meta"))
    assert module.weight.is_meta and module.weight.shape == (3, 6)
    assert module.parametrizations.weight.original.shape == (6, 3)


def test_bad_calls_raise_errors_that_say_what_to_do():
    with pytest.raises(ValueError, match="at least two dims"):
        orthogonal(nn.Linear(3, 3), "bias")
    with pytest.raises(ValueError, match="no parameter 'kernel'"):
        orthogonal(nn.Linear(3, 3), "kernel")
    with pytest.raises(ValueError, match="unknown init"):
        orthogonal(nn.Linear(3, 3), init="uniform")
    with pytest.raises(ValueError, match="unknown map"):
        orthogonal(nn.Linear(3, 3), map="givens")
    with pytest.raises(ValueError, match="already parametrised"):
        orthogonal(orthogonal(nn.Linear(3, 3)))
    with pytest.raises(ValueError, match="rank deficient"):
        orthogonal(_Holder(torch.zeros(3, 3)))
    integer = nn.Module()
    integer.weight = nn.Parameter(torch.zeros(3, 3, dtype=torch.int64), requires_grad=False)
    with pytest.raises(TypeError, match="floating point"):
        orthogonal(integer)
    with pytest.raises(ValueError, match="not an orthogonal weight"):
        sample_haar_(nn.Linear(3, 3))
    parametrization = OrthogonalWeight((4, 3))
    with pytest.raises(ValueError, match="shape"):
        parametrization.right_inverse(torch.eye(3))


@pytest.mark.parametrize("map", ["cayley", "matrix_exp"])
@pytest.mark.parametrize("shape", ["tall", "very tall"])
def test_the_base_maps_equal_their_dense_definitions(map, shape):
    torch.manual_seed(7)
    module, name = _made(shape, torch.complex128, map, init="haar")
    n = SHAPES[shape][2][0]
    parametrization, original = module.parametrizations.weight[0], module.parametrizations.weight.original
    with torch.no_grad():
        original.copy_(torch.randn_like(original))
    base, z = parametrization.base, original.detach()
    p = torch.eye(n, dtype=torch.complex128) - base @ base.mH / 2
    w = p @ z @ base.mH - base @ z.mH @ p  # skew-Hermitian, n x n
    eye = torch.eye(n, dtype=torch.complex128)
    dense = (
        torch.linalg.solve(eye - w / 2, (eye + w / 2) @ base) if map == "cayley" else torch.linalg.matrix_exp(w) @ base
    )
    torch.testing.assert_close(module.weight, dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("map", ["cayley", "matrix_exp"])
def test_update_base_keeps_the_weight_and_zeroes_the_coordinates(map):
    module, name = _made("wide", torch.float64, map, init="haar")
    original = module.parametrizations.weight.original
    with torch.no_grad():
        original.add_(0.3 * torch.randn_like(original))
    weight = module.weight.detach().clone()
    update_base_(module)
    assert not original.any()
    torch.testing.assert_close(module.weight, weight, rtol=0, atol=1e-13)
    assert _error(module.weight, SHAPES["wide"][2]) <= _tolerance(torch.float64, SHAPES["wide"][2])
    with pytest.raises(ValueError, match="no base point"):
        update_base_(orthogonal(nn.Linear(3, 3)))


@pytest.mark.parametrize("map", ["cayley", "matrix_exp"])
def test_a_square_base_reads_the_coordinates_in_its_frame(map):
    torch.manual_seed(8)
    module, _ = _made("square", torch.complex128, map, init="haar")
    parametrization, original = module.parametrizations.weight[0], module.parametrizations.weight.original
    with torch.no_grad():
        original.copy_(torch.randn_like(original))
    a = (original - original.mH).detach() / 2  # skew-Hermitian
    eye = torch.eye(5, dtype=torch.complex128)
    rotation = torch.linalg.solve(eye - a / 2, eye + a / 2) if map == "cayley" else torch.linalg.matrix_exp(a)
    torch.testing.assert_close(module.weight, parametrization.base @ rotation, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("map", WEIGHT_MAPS)
def test_a_compiled_step_is_one_graph_and_equals_eager(map):
    torch.manual_seed(9)
    module, _ = _made("very tall", torch.float64, map, init="haar")
    original = module.parametrizations.weight.original
    with torch.no_grad():
        original.add_(0.1 * torch.randn_like(original))  # away from the base point
    x = torch.randn(4, 3, dtype=torch.float64)

    def step(x):
        return (x @ module.weight.mT).square().sum()

    eager = step(x)
    (eager_grad,) = torch.autograd.grad(eager, original)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    (compiled_grad,) = torch.autograd.grad(compiled, original)
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-12, atol=1e-12)
