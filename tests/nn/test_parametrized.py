"""The maps built on PyTorch's ``parametrizations.orthogonal`` return an orthogonal ``Q`` to the precision of their
dtype: under weight decay (PyTorch's Householder map read the column signs with ``diagonal().int()``, so a decayed
``-0.9999`` became 0 and ``Q = 0``), after ``.double()`` and after loading a float32 ``state_dict`` into float64 (the
trivialisation base stayed orthogonal to float32 precision only)."""

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

from lightning_ortho.nn import ParametrizedOrthogonal, orthogonal_map

MATRIX_KINDS = ["householder", "cayley", "matrix_exp", "torch_householder"]
TORCH_KINDS = ["cayley", "matrix_exp", "torch_householder"]
D = 6


def orthogonality_error(q: torch.Tensor) -> float:
    """``max |Q^T Q - I|``."""
    return float((q.mT @ q - torch.eye(q.shape[-1], dtype=q.dtype)).abs().amax())


def tolerance(dtype: torch.dtype) -> float:
    """``10 d eps``: PyTorch's own test of orthogonality (``parametrizations._is_orthogonal``)."""
    return 10 * D * torch.finfo(dtype).eps


def torch_kind(kind: str) -> str:
    return "householder" if kind == "torch_householder" else kind


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", MATRIX_KINDS)
def test_weight_decay_keeps_every_map_orthogonal(kind, optimizer, dtype):
    torch.manual_seed(0)
    layer = orthogonal_map(D, kind).to(dtype)
    if optimizer == "sgd":
        step = torch.optim.SGD(layer.parameters(), lr=0.05, weight_decay=1e-4)
    else:
        step = torch.optim.AdamW(layer.parameters())  # weight_decay=0.01 by default
    x, target = torch.randn(32, D, dtype=dtype), torch.randn(32, D, dtype=dtype)
    for _ in range(100):
        step.zero_grad()
        ((layer(x) - target) ** 2).mean().backward()
        step.step()
    with torch.no_grad():
        q = layer.matrix()
        assert orthogonality_error(q) <= tolerance(dtype)
        torch.testing.assert_close(layer(x), x @ q.mT)
        torch.testing.assert_close(torch.linalg.vector_norm(layer(x), dim=-1), torch.linalg.vector_norm(x, dim=-1))


def test_the_householder_map_equals_pytorchs_with_the_diagonal_it_was_written_with():
    # PyTorch's right_inverse writes -1 on the diagonal and nothing ever differentiates it; weight decay shrinks it.
    # Our Q from the decayed state must be PyTorch's Q from the same state with the diagonal back at -1.
    torch.manual_seed(1)
    layer = ParametrizedOrthogonal(D, "householder").double()
    with torch.no_grad():
        original = layer.linear.parametrizations.weight.original
        original.add_(0.05 * torch.randn_like(original).tril(-1))  # trained reflectors
        original.diagonal().mul_(0.9999)  # decayed signs
        reference = parametrizations.orthogonal(nn.Linear(D, D, bias=False).double(), orthogonal_map="householder")
        reference.load_state_dict(layer.linear.state_dict())
        assert float(reference.weight.abs().amax()) == 0.0  # PyTorch's own map: int(-0.9999) = 0, Q = 0
        reference.parametrizations.weight.original.diagonal().fill_(-1.0)
        torch.testing.assert_close(layer.matrix(), reference.weight, rtol=0, atol=1e-15)


@pytest.mark.parametrize("cast", ["double", "to"])
@pytest.mark.parametrize("kind", MATRIX_KINDS)
def test_after_double_every_map_is_orthogonal_to_float64_precision(kind, cast):
    torch.manual_seed(2)
    layer = orthogonal_map(D, kind)
    with torch.no_grad():
        for parameter in layer.parameters():  # away from the initial state
            parameter.add_(0.1 * torch.randn_like(parameter))
        before = layer.matrix().double()
    layer = layer.double() if cast == "double" else layer.to(torch.float64)
    with torch.no_grad():
        q = layer.matrix()
        assert q.dtype == torch.float64
        assert orthogonality_error(q) <= tolerance(torch.float64)
        torch.testing.assert_close(q, before, rtol=0, atol=1e-6)  # the map moved by its float32 error, no more
        x = torch.randn(5, D, dtype=torch.float64)
        torch.testing.assert_close(layer(x), x @ q.mT, rtol=0, atol=1e-14)


@pytest.mark.parametrize("kind", TORCH_KINDS)
def test_a_float32_state_dict_loaded_into_float64_is_orthogonal_to_float64_precision(kind):
    torch.manual_seed(3)
    float32 = orthogonal_map(D, kind)
    float64 = orthogonal_map(D, kind).double()
    float64.load_state_dict(float32.state_dict())
    with torch.no_grad():
        assert orthogonality_error(float64.matrix()) <= tolerance(torch.float64)
        torch.testing.assert_close(float64.matrix(), float32.matrix().double(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kind", TORCH_KINDS)
def test_state_dict_round_trips_bit_for_bit_with_pytorchs_keys(kind, dtype):
    torch.manual_seed(4)
    layer = orthogonal_map(D, kind).to(dtype)
    step = torch.optim.AdamW(layer.parameters())
    x = torch.randn(8, D, dtype=dtype)
    for _ in range(5):
        step.zero_grad()
        layer(x).pow(3).sum().backward()
        step.step()
    state = layer.state_dict()
    assert set(state) == {"linear.parametrizations.weight.original", "linear.parametrizations.weight.0.base"}
    restored = orthogonal_map(D, kind).to(dtype)
    restored.load_state_dict(state)
    for name, tensor in restored.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    with torch.no_grad():
        assert torch.equal(restored.matrix(), layer.matrix())
    # A checkpoint of PyTorch's own parametrisation (same keys under the module's prefix) loads too.
    torch_layer = parametrizations.orthogonal(nn.Linear(D, D, bias=False), orthogonal_map=torch_kind(kind)).to(dtype)
    torch_layer.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
    if kind != "torch_householder":  # (PyTorch's Householder map reads the decayed diagonal as 0)
        with torch.no_grad():
            torch.testing.assert_close(torch_layer.weight, layer.matrix(), rtol=0, atol=0)
