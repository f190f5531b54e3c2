"""Every estimator configuration on every cell we ship that it takes: the cases of the sync and compile tests."""

from __future__ import annotations

from collections.abc import Callable

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
    ModReLURNNCell,
    OnlineGradientEstimator,
    SnAp,
    TanhRNNCell,
    TruncatedBPTT,
)

INPUT, HIDDEN, STREAMS = 3, 4, 2

CELLS: dict[str, Callable[[], nn.Module]] = {
    "tanh": lambda: TanhRNNCell(INPUT, HIDDEN),
    "modrelu": lambda: ModReLURNNCell(INPUT, HIDDEN),
    "gru": lambda: GRUCell(INPUT, HIDDEN),
    "orthogonal": lambda: OrthogonalRNNCell(INPUT, HIDDEN),  # transition="aux", nonlinearity="modrelu"
    "lru": lambda: LinearRecurrentUnit(INPUT, HIDDEN),
}
#: The orthogonal cell with every other transition and nonlinearity: ``orthogonal-<transition>-<nonlinearity>``.
CELLS.update(
    {
        f"orthogonal-{transition}-{nonlinearity}": (
            lambda transition=transition, nonlinearity=nonlinearity: OrthogonalRNNCell(
                INPUT, HIDDEN, transition=transition, nonlinearity=nonlinearity
            )
        )
        for transition in ("aux", "householder", "cayley", "matrix_exp")
        for nonlinearity in ("modrelu", "tanh")
        if (transition, nonlinearity) != ("aux", "modrelu")  # "orthogonal" above
    }
)

#: ``name: (class, options)``; each is tried on every cell and kept where ``cell_problem`` takes the cell.
ESTIMATORS: dict[str, tuple[type[OnlineGradientEstimator], dict]] = {
    "uoro": (UORO, {"generator": 0}),
    "uoro-unfused": (UORO, {"generator": 0, "fused": False}),
    "uoro-preactivation": (UORO, {"projection": "preactivation", "generator": 0}),
    "uoro-parameter": (UORO, {"projection": "parameter", "generator": 0}),
    "uoro-none": (UORO, {"projection": "none", "generator": 0}),
    "uoro-fixed": (UORO, {"rescaling": (0.5, None), "generator": 0}),
    "kf_rtrl": (KFRTRL, {"generator": 0}),
    "rtrl": (RTRL, {}),
    "snap-1": (SnAp, {"order": 1}),
    "snap-2": (SnAp, {"order": 2}),
    "rflo": (RFLO, {"tau": 2.0}),
    "tbptt": (TruncatedBPTT, {"k": 2}),
    "diagonal_rtrl": (DiagonalRTRL, {}),
}

#: Options that decide which cells an estimator takes (passed to ``cell_problem``).
_CELL_OPTIONS = ("projection",)


def _takes(cls: type[OnlineGradientEstimator], options: dict, cell: nn.Module) -> bool:
    return cls.cell_problem(cell, **{k: v for k, v in options.items() if k in _CELL_OPTIONS}) is None


def cases() -> list[str]:
    """``"estimator/cell"`` for every pair where the estimator takes the cell."""
    found = []
    for cell_name, make_cell in CELLS.items():
        torch.manual_seed(0)
        cell = make_cell()
        for name, (cls, options) in ESTIMATORS.items():
            if _takes(cls, options, cell):
                found.append(f"{name}/{cell_name}")
    return found


def build(case: str, dtype: torch.dtype = torch.float64, seed: int = 0, device: str | torch.device = "cpu"):
    """``(estimator, state, xs (T, B, I), grad_hs (T, B, H))`` for ``case``: a fresh cell of ``dtype`` on ``device``
    and its estimator's initial state, with inputs and readout errors for ``T = 8`` steps. The cell's parameters and
    the data are drawn on the CPU and then moved, so every device gets the same numbers from the same seed."""
    name, cell_name = case.split("/")
    torch.manual_seed(seed)
    # moved before the estimator is built (it may keep views or caches of the parameters); .to draws nothing
    cell = CELLS[cell_name]().to(device=device, dtype=dtype)
    cls, options = ESTIMATORS[name]
    estimator = cls(cell, **options)
    complex_state = getattr(cell, "complex_state", False)
    state_dtype = cell.state_dtype() if complex_state else dtype
    state = estimator.initial_state(torch.zeros(STREAMS, HIDDEN, dtype=state_dtype, device=device))
    xs = torch.randn(8, STREAMS, INPUT, dtype=dtype).to(device)
    grad_hs = torch.randn(8, STREAMS, HIDDEN, dtype=state_dtype).to(device)
    return estimator, state, xs, grad_hs


def covering_cases() -> list[str]:
    """A subset of :func:`cases` for the default suite's share of the costly tests (the rest run with ``-m slow``):
    every estimator configuration on the tanh cell, every other cell with RTRL (the generic products or its closed
    form; DiagonalRTRL for the LRU), and the fused UORO step of the orthogonal cell."""
    chosen = []
    for case in cases():
        name, cell = case.split("/")
        if cell == "tanh" or name in ("rtrl", "diagonal_rtrl") or case == "uoro/orthogonal":
            chosen.append(case)
    return chosen
