"""``orthogonal(..., use_trivialization=False)`` (the Cayley and exponential maps read in the fixed identity frame,
no base point) and the torus initialisations of expRNN. References: dense Cayley transforms and
``torch.linalg.matrix_exp`` of the skew matrices, ``torch.linalg.det``, autograd's numerical Jacobians."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_ortho.nn import orthogonal, sample_haar_, update_base_
from lightning_ortho.nn.orthogonal_weight import WEIGHT_MAPS
from lightning_ortho.nn.stiefel import (
    cayley_coordinates,
    cayley_stiefel,
    exp_coordinates,
    exp_stiefel,
    orthonormality_error,
    sample_haar_stiefel,
)

BASE_MAPS = ["cayley", "matrix_exp"]
DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]
#: (out_features, in_features) of a Linear: square, tall, very tall (the low-rank forms), wide
SHAPES = {"square": (5, 5), "tall": (7, 3), "very tall": (13, 3), "wide": (3, 7)}


def _linear(shape: str, dtype: torch.dtype) -> nn.Linear:
    out_features, in_features = SHAPES[shape]
    return nn.Linear(in_features, out_features, bias=False).to(dtype)


def _tall(weight: torch.Tensor) -> torch.Tensor:
    return weight if weight.shape[-2] >= weight.shape[-1] else weight.mT


def _skew(a: torch.Tensor) -> torch.Tensor:
    return (a - a.mH) / 2


def _dense_frame_map(map: str, coordinates: torch.Tensor) -> torch.Tensor:
    """The definition, with n x n matrices: ``cayley(W) E_k`` or ``exp(W) E_k`` for
    ``W = [[(Z_1 - Z_1^H) / 2, -Z_2^H], [Z_2, 0]]``."""
    n, k = coordinates.shape[-2:]
    w = torch.zeros(n, n, dtype=coordinates.dtype)
    w[:k, :k] = _skew(coordinates[:k])
    w[k:, :k] = coordinates[k:]
    w[:k, k:] = -coordinates[k:].mH
    eye = torch.eye(n, dtype=coordinates.dtype)
    full = torch.linalg.solve(eye - w / 2, eye + w / 2) if map == "cayley" else torch.linalg.matrix_exp(w)
    return full[:, :k]


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", BASE_MAPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_frame_maps_are_their_dense_definitions_and_orthonormal(shape, dtype, map):
    torch.manual_seed(0)
    module = orthogonal(_linear(shape, dtype), map=map, init="identity", use_trivialization=False)
    original = module.parametrizations.weight.original
    assert list(module.state_dict()) == ["parametrizations.weight.original"]  # no base point
    with torch.no_grad():
        original.copy_(torch.randn_like(original))
    weight = _tall(module.weight.detach())
    n = max(SHAPES[shape])
    assert float(orthonormality_error(weight)) <= 10 * n * torch.finfo(dtype).eps
    wide = torch.complex128 if dtype.is_complex else torch.float64
    reference = _dense_frame_map(map, original.detach().to(wide))
    tolerance = 1e-12 if dtype in (torch.float64, torch.complex128) else 1e-5
    torch.testing.assert_close(weight.to(wide), reference, rtol=tolerance, atol=tolerance)


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", BASE_MAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gradcheck_of_the_frame_maps(shape, dtype, map):
    torch.manual_seed(1)
    module = orthogonal(_linear(shape, dtype), map=map, init="identity", use_trivialization=False)
    parametrization = module.parametrizations.weight[0]
    coordinates = 0.5 * torch.randn_like(module.parametrizations.weight.original)
    torch.autograd.gradcheck(parametrization, (coordinates.requires_grad_(),))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", [(7, 3), (13, 3), (5, 5), (6, 6)])
def test_cayley_coordinates_invert_the_frame_map(shape, dtype):
    q = sample_haar_stiefel((3, *shape), dtype=dtype, generator=torch.Generator().manual_seed(2))
    if shape[0] == shape[1] and not dtype.is_complex:  # the real square map reaches SO(n) only
        q[..., 0] *= torch.linalg.det(q).sign().unsqueeze(-1)
    coordinates = cayley_coordinates(q)
    torch.testing.assert_close(cayley_stiefel(coordinates), q, rtol=0, atol=1e-13)
    for one, z in zip(q, coordinates, strict=True):  # and the dense definition agrees
        torch.testing.assert_close(_dense_frame_map("cayley", z), one, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_exp_coordinates_are_the_principal_logarithm(dtype):
    q = sample_haar_stiefel((3, 6, 6), dtype=dtype, generator=torch.Generator().manual_seed(3))
    if not dtype.is_complex:
        q[..., 0] *= torch.linalg.det(q).sign().unsqueeze(-1)
    logarithm = exp_coordinates(q)
    torch.testing.assert_close(logarithm, -logarithm.mH, rtol=0, atol=1e-14)  # skew(-Hermitian)
    torch.testing.assert_close(torch.linalg.matrix_exp(logarithm), q, rtol=0, atol=1e-12)
    torch.testing.assert_close(exp_stiefel(logarithm), q, rtol=0, atol=1e-12)
    # principal: every eigenvalue i theta with |theta| < pi
    assert float(torch.linalg.eigvals(logarithm).abs().max()) < math.pi
    with pytest.raises(ValueError, match="square"):
        exp_coordinates(q[..., :3])


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize("map", BASE_MAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_an_assigned_weight_is_stored_as_frame_coordinates(dtype, map):
    shape = "square" if map == "matrix_exp" else "tall"
    module = orthogonal(_linear(shape, dtype), map=map, init="identity", use_trivialization=False)
    q = sample_haar_stiefel(tuple(module.weight.shape), dtype=dtype, generator=torch.Generator().manual_seed(4))
    if q.shape[0] == q.shape[1] and not dtype.is_complex:
        q[:, 0] *= torch.linalg.det(q).sign()
    module.weight = q
    torch.testing.assert_close(module.weight, q, rtol=0, atol=1e-12)
    assert module.parametrizations.weight[0].base is None
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    fresh = orthogonal(_linear(shape, dtype), map=map, init="identity", use_trivialization=False)
    fresh.load_state_dict(torch.load(buffer))
    torch.testing.assert_close(fresh.weight, module.weight, rtol=0, atol=0)


@pytest.mark.parametrize("map", BASE_MAPS)
def test_a_weight_out_of_the_frame_maps_reach_is_refused_with_what_to_do(map):
    module = orthogonal(nn.Linear(4, 4, bias=False).double(), map=map, init="identity", use_trivialization=False)
    reflection = torch.eye(4, dtype=torch.float64)
    reflection[0, 0] = -1  # determinant -1
    with pytest.raises(ValueError, match="use_trivialization=True"):
        module.weight = reflection
    with pytest.raises(ValueError, match="use_trivialization=True"):
        orthogonal(_Holder(reflection.clone()), map=map, use_trivialization=False)  # init="keep"
    with pytest.raises(ValueError, match="no base point.*use_trivialization=True"):
        update_base_(module)
    tall = orthogonal(nn.Linear(3, 7, bias=False).double(), map="matrix_exp", init="identity", use_trivialization=False)
    with pytest.raises(ValueError, match="rows below the first 3 are zero"):
        tall.weight = sample_haar_stiefel((7, 3), dtype=torch.float64)


class _Holder(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)


@pytest.mark.parametrize("map", BASE_MAPS)
def test_haar_init_of_a_frame_map_is_haar_on_the_half_it_reaches(map):
    # A real square frame map reaches SO(n): the sample is on it, with the moments of Haar on O(n) (the sign flip
    # of a column is a bijection from the other half that keeps each entry's distribution).
    module = orthogonal(nn.Linear(4, 4, bias=False).double(), map=map, init="identity", use_trivialization=False)
    generator = torch.Generator().manual_seed(5)
    samples = torch.stack([sample_haar_(module, generator=generator).weight.detach().clone() for _ in range(1500)])
    torch.testing.assert_close(torch.linalg.det(samples), torch.ones(1500, dtype=torch.float64), rtol=0, atol=1e-12)
    assert samples.mean().abs() < 0.01
    assert abs(samples.square().mean().item() - 1 / 4) < 0.005
    assert abs(samples.pow(4).mean().item() - 3 / (4 * 6)) < 0.006


def test_sample_haar_gives_every_map_the_same_sample():
    weights = []
    for map in WEIGHT_MAPS:
        module = orthogonal(nn.Linear(3, 6, bias=False).double(), map=map)
        sample_haar_(module, generator=torch.Generator().manual_seed(6))
        weights.append(module.weight.detach())
    expected = sample_haar_stiefel((6, 3), dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    for weight in weights:
        torch.testing.assert_close(weight, expected, rtol=0, atol=1e-12)


def _rotation_angles(tall: torch.Tensor) -> torch.Tensor:
    """The angles ``s`` of the ``2 x 2`` rotation blocks ``[[cos s, sin s], [-sin s, cos s]]`` on the diagonal."""
    k = tall.shape[-1]
    even = torch.arange(0, 2 * (k // 2), 2)
    return torch.atan2(tall[..., even, even + 1], tall[..., even, even])


@pytest.mark.parametrize("use_trivialization", [True, False])
@pytest.mark.parametrize("map", WEIGHT_MAPS)
@pytest.mark.parametrize("shape", [(6, 6), (9, 5), (4, 10)])
def test_torus_inits_are_block_rotations_with_their_angles(shape, map, use_trivialization):
    out_features, in_features = shape
    weights = {}
    for init in ("torus_henaff", "torus_cayley"):
        module = orthogonal(
            nn.Linear(in_features, out_features, bias=False).double(),
            map=map,
            init=init,
            use_trivialization=use_trivialization,
            generator=torch.Generator().manual_seed(7),
        )
        tall = _tall(module.weight.detach())
        n, k = tall.shape
        angles = _rotation_angles(tall)
        rotations = torch.zeros(k, k, dtype=torch.float64)  # the log: block diagonal, skew
        even = torch.arange(0, 2 * (k // 2), 2)
        rotations[even, even + 1], rotations[even + 1, even] = angles, -angles
        expected = torch.zeros(n, k, dtype=torch.float64)
        expected[:k] = torch.linalg.matrix_exp(rotations)
        torch.testing.assert_close(tall, expected, rtol=0, atol=1e-12)
        weights[init] = angles
        if map == "matrix_exp":  # as expRNN starts: the base at the identity frame, the log in the coordinates
            original = module.parametrizations.weight.original.detach()
            torch.testing.assert_close(original[:k], rotations, rtol=0, atol=1e-12)
            assert not original[k:].any()
            if use_trivialization:
                torch.testing.assert_close(module.parametrizations.weight[0].base, torch.eye(n, k, dtype=torch.float64))
    assert bool((weights["torus_cayley"] <= 0).all() and (weights["torus_cayley"] > -1).all())  # -tan(t/2)
    assert bool((weights["torus_henaff"].abs() < math.pi).all())


def test_torus_henaff_angles_are_uniform_on_the_circle():
    module = orthogonal(
        nn.Linear(2000, 2000, bias=False).double(),
        init="torus_henaff",
        map="matrix_exp",
        generator=torch.Generator().manual_seed(8),
    )
    angles = _rotation_angles(module.weight.detach())
    assert abs(angles.mean().item()) < 0.15  # 1000 angles: standard error pi / sqrt(3000) ~ 0.06
    assert abs(angles.square().mean().item() - math.pi**2 / 3) < 0.3
    cayley = orthogonal(
        nn.Linear(2000, 2000, bias=False).double(), init="torus_cayley", generator=torch.Generator().manual_seed(8)
    )
    t = 2 * torch.atan(-_rotation_angles(cayley.weight.detach()))  # the angle is s = -tan(t / 2)
    assert float(t.min()) >= 0 and float(t.max()) < math.pi / 2
    assert abs(t.mean().item() - math.pi / 4) < 0.05  # uniform on (0, pi / 2): standard error 0.014


def test_frame_maps_compile_to_one_graph_equal_to_eager():
    torch.manual_seed(9)
    module = orthogonal(nn.Linear(3, 13, bias=False).double(), map="cayley", init="haar", use_trivialization=False)
    original = module.parametrizations.weight.original
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
    assert parametrize.is_parametrized(module, "weight")
