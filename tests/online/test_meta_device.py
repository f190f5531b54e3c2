"""Shape inference on the meta device (deferred initialisation, FSDP): every estimator's ``initial_state``, ``step``,
``gradient`` and ``reset`` on a meta cell with meta inputs make meta tensors of the shapes and dtypes that the same
calls make on the CPU; the checks that read values are skipped there (no values), not removed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_ortho.nn import OrthogonalRNNCell
from lightning_ortho.online import (
    KFRTRL,
    RFLO,
    RTRL,
    UORO,
    DiagonalRTRL,
    GRUCell,
    LinearRecurrentUnit,
    LRUStack,
    ModReLURNNCell,
    OnlineLRUStack,
    SnAp,
    TanhRNNCell,
    TruncatedBPTT,
)

B, INPUT, HIDDEN = 2, 3, 4


class ElementwiseCell(nn.Module):
    """``h' = tanh(w * h + U x)`` with a vector ``w`` (DiagonalRTRL's ``torch.func`` path)."""

    diagonal_recurrence = True

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.w = nn.Parameter(torch.rand(hidden_size))
        self.U = nn.Parameter(torch.randn(hidden_size, input_size))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w * h + x @ self.U.T)


CELLS = {
    "tanh": TanhRNNCell,
    "gru": GRUCell,
    "modrelu": ModReLURNNCell,
    "orthogonal": OrthogonalRNNCell,
    "lru": LinearRecurrentUnit,
    "elementwise": ElementwiseCell,
}

CASES = {
    "uoro-state-tanh": ("tanh", lambda c: UORO(c, generator=0)),
    "uoro-state-unfused": ("tanh", lambda c: UORO(c, generator=0, fused=False)),
    "uoro-state-orthogonal": ("orthogonal", lambda c: UORO(c, generator=0)),
    "uoro-state-gru": ("gru", lambda c: UORO(c, generator=0)),
    "uoro-preactivation": ("tanh", lambda c: UORO(c, projection="preactivation", generator=0)),
    "uoro-preactivation-modrelu": ("modrelu", lambda c: UORO(c, projection="preactivation", generator=0)),
    "uoro-parameter": ("gru", lambda c: UORO(c, projection="parameter", generator=0)),
    "uoro-none": ("tanh", lambda c: UORO(c, projection="none", generator=0)),
    "uoro-fixed": ("tanh", lambda c: UORO(c, rescaling=(0.5, None), generator=0)),
    "uoro-fixed-unfused": ("tanh", lambda c: UORO(c, rescaling=(0.5, None), generator=0, fused=False)),
    "kf_rtrl": ("tanh", lambda c: KFRTRL(c, generator=0)),
    "rtrl": ("gru", RTRL),
    "snap-1": ("tanh", SnAp),
    "snap-2-gru": ("gru", lambda c: SnAp(c, order=2)),
    "rflo": ("tanh", lambda c: RFLO(c, tau=2.0)),
    "rflo-gru": ("gru", lambda c: RFLO(c, tau=2.0)),
    "tbptt": ("tanh", lambda c: TruncatedBPTT(c, 2)),
    "diagonal_rtrl-lru": ("lru", DiagonalRTRL),
    "diagonal_rtrl-lru-torch-func": ("lru", lambda c: DiagonalRTRL(c, closed_form=False)),
    "diagonal_rtrl-elementwise": ("elementwise", DiagonalRTRL),
}


def signature(tensors) -> list[tuple]:
    return [(name, tuple(t.shape), t.dtype) for name, t in tensors]


def run(kind: str, device: str) -> tuple[list[tuple], set[str]]:
    """The shapes and dtypes of everything the calls return, and the device types they are on."""
    cell_name, make = CASES[kind]
    torch.manual_seed(0)
    with torch.device(device):
        cell = CELLS[cell_name](INPUT, HIDDEN)
    est = make(cell)
    dtype = cell.state_dtype() if cell_name == "lru" else torch.float32
    state = est.initial_state(torch.zeros(B, HIDDEN, device=device, dtype=dtype))
    out = []
    for _ in range(3):
        h, state = est.step(torch.ones(B, INPUT, device=device), state)
        out.append(("h", h))
    grad_h = torch.ones(B, HIDDEN, device=device, dtype=dtype)
    out += list(est.gradient(state, grad_h).items()) + list(est.gradient(state, grad_h, per_stream=True).items())
    state = est.reset(state, torch.tensor([True, False], device=device))
    out += [("reset " + name, t) for name, t in state.tensors.items()] + [("reset h", state.h)]
    return signature(out), {t.device.type for _, t in out}


@pytest.mark.parametrize("kind", list(CASES))
def test_shapes_propagate_on_meta(kind):
    meta, devices = run(kind, "meta")
    cpu, _ = run(kind, "cpu")
    assert devices == {"meta"}
    assert meta == cpu


def test_stream_ids_of_a_process_on_meta():
    with torch.device("meta"):
        cell = TanhRNNCell(INPUT, HIDDEN)
    for est in (UORO(cell, generator=0), KFRTRL(cell, generator=0)):
        state = est.initial_state(torch.zeros(B, HIDDEN, device="meta"), stream_ids=[1, 3], total_streams=5)
        h, state = est.step(torch.ones(B, INPUT, device="meta"), state)
        assert h.shape == (B, HIDDEN) and h.is_meta
        with pytest.raises(ValueError, match="stream_ids must be 2 indices in"):
            est.initial_state(torch.zeros(B, HIDDEN, device="meta"), stream_ids=[1, 5], total_streams=5)


def test_online_lru_stack_on_meta():
    def run_stack(device: str) -> tuple[list[tuple], set[str]]:
        torch.manual_seed(0)
        with torch.device(device):
            model = LRUStack(INPUT, HIDDEN, 2, 2, model_size=5)
        online = OnlineLRUStack(model)
        state = online.initial_state(B)
        y, state = online.step(torch.ones(B, INPUT, device=device), state)
        grads = online.gradient(state, torch.ones_like(y))
        out = [("y", y), *grads.items()]
        return signature(out), {t.device.type for _, t in out}

    meta, devices = run_stack("meta")
    assert devices == {"meta"} and meta == run_stack("cpu")[0]


def test_diagonal_rtrl_built_on_meta_refuses_a_state_with_values():
    with torch.device("meta"):
        cell = ElementwiseCell(INPUT, HIDDEN)
    est = DiagonalRTRL(cell)  # nothing could be probed on meta
    with pytest.raises(ValueError, match="built for ElementwiseCell on the meta device.*build DiagonalRTRL again"):
        est.initial_state(torch.zeros(B, HIDDEN))


def test_diagonal_rtrl_on_meta_still_needs_the_declaration():
    with torch.device("meta"):
        cell = TanhRNNCell(INPUT, HIDDEN)
    with pytest.raises(ValueError, match="does not declare a diagonal recurrence"):
        DiagonalRTRL(cell)


@pytest.mark.parametrize("kind", list(CASES))
def test_a_meta_state_saves_and_loads(kind):
    cell_name, make = CASES[kind]
    with torch.device("meta"):
        cell = CELLS[cell_name](INPUT, HIDDEN)
    est = make(cell)
    h0 = torch.zeros(B, HIDDEN, device="meta", dtype=cell.state_dtype() if cell_name == "lru" else torch.float32)
    state = est.initial_state(h0)
    for _ in range(3):
        _, state = est.step(torch.ones(B, INPUT, device="meta"), state)
    loaded = est.initial_state(h0)
    loaded.load_state_dict(state.state_dict())
    assert loaded.step == 3
    assert signature(loaded.tensors.items()) == signature(state.tensors.items())
