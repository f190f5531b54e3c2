"""The readout and the chunk format of :class:`~lightning_ortho.models.OnlineRNNModule`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

LOSSES = ("cross_entropy", "mse")
READOUTS = ("linear", "units")


class Readout(nn.Module):
    """Outputs from hidden states: ``(..., H) -> (..., output_size)``.

    Args:
        kind: ``"linear"``: ``nn.Linear(hidden_size, output_size)``; ``"units"``: the first ``output_size``
            units of ``h`` themselves, no parameters (the influence-balancing task reads its first unit).
        hidden_size, output_size: sizes.

    Raises:
        ValueError: unknown ``kind``, or ``"units"`` with ``output_size > hidden_size``.
    """

    def __init__(self, kind: str, hidden_size: int, output_size: int) -> None:
        super().__init__()
        if kind not in READOUTS:
            raise ValueError(f"OnlineRNNModule: readout must be one of {READOUTS}, got {kind!r}.")
        if kind == "units" and output_size > hidden_size:
            raise ValueError(
                f"OnlineRNNModule: readout='units' reads the first output_size={output_size} units of the state, but"
                f" the cell has only {hidden_size}; use readout='linear' or a larger cell."
            )
        self.kind, self.output_size = kind, output_size
        self.linear = nn.Linear(hidden_size, output_size) if kind == "linear" else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h) if self.linear is not None else h[..., : self.output_size]

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, output_size={self.output_size}"


@dataclass
class Chunk:
    """One chunk of ``b`` parallel streams, checked: ``x`` ``(b, T, I)``, ``y`` ``(b, T)`` or ``(b, T, O)``,
    ``mask`` ``(b, T)`` bool, ``reset`` ``(b,)`` bool, ``index`` the chunk's position in its stream."""

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    reset: torch.Tensor
    index: int

    @property
    def streams(self) -> int:
        return self.x.shape[0]

    @property
    def steps(self) -> int:
        return self.x.shape[1]


def read_chunk(batch: object, *, input_size: int | None, output_size: int, loss: str) -> Chunk:
    """Check a batch of the stream contract (``lightning_ortho.datamodules.StreamDataModule``) and unpack it.

    ``mask`` (all true) and ``reset`` (none) may be left out; ``x``, ``y`` and ``chunk`` are required.

    Raises:
        ValueError: the batch is not such a dict, or a shape, dtype or size disagrees with the model; the message
            names the option to change.
    """
    where = "OnlineRNNModule"
    if not isinstance(batch, dict) or not {"x", "y", "chunk"} <= set(batch):
        got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(
            f"{where}: a batch must be a dict with 'x' (B, T, I), 'y', 'chunk' (and optionally 'mask', 'reset'), as"
            f" the stream data modules (lightning_ortho.datamodules.StreamDataModule) yield; got {got}."
        )
    x, y = batch["x"], batch["y"]
    if x.dim() != 3 or not x.is_floating_point():
        raise ValueError(
            f"{where}: batch['x'] must be a float (streams, steps, features) tensor, got {x.dtype} {tuple(x.shape)}."
        )
    b, steps = x.shape[:2]
    if input_size is not None and x.shape[2] != input_size:
        raise ValueError(
            f"{where}: the data has {x.shape[2]} input features per step but the cell's input_size is {input_size};"
            f" set --model.init_args.cell.init_args.input_size={x.shape[2]}."
        )
    hard = y.dtype == torch.long
    if hard and (loss != "cross_entropy" or tuple(y.shape) != (b, steps)):
        raise ValueError(
            f"{where}: integer targets must be (streams, steps) class indices for loss='cross_entropy', got"
            f" {tuple(y.shape)} with loss={loss!r}; use float (streams, steps, outputs) targets for 'mse'."
        )
    if not hard and (not y.is_floating_point() or tuple(y.shape) != (b, steps, output_size)):
        raise ValueError(
            f"{where}: batch['y'] must be int64 ({b}, {steps}) or float ({b}, {steps}, output_size={output_size}),"
            f" got {y.dtype} {tuple(y.shape)}; if the data has {y.shape[-1]} outputs, set"
            f" --model.init_args.output_size={y.shape[-1]}."
        )
    mask = batch.get("mask")
    mask = torch.ones(b, steps, dtype=torch.bool, device=x.device) if mask is None else mask
    reset = batch.get("reset")
    reset = torch.zeros(b, dtype=torch.bool, device=x.device) if reset is None else reset
    if mask.dtype != torch.bool or tuple(mask.shape) != (b, steps):
        raise ValueError(f"{where}: batch['mask'] must be bool ({b}, {steps}), got {mask.dtype} {tuple(mask.shape)}.")
    if reset.dtype != torch.bool or tuple(reset.shape) != (b,):
        raise ValueError(f"{where}: batch['reset'] must be bool ({b},), got {reset.dtype} {tuple(reset.shape)}.")
    index = batch["chunk"]
    index = int(index.item()) if isinstance(index, torch.Tensor) and index.numel() == 1 else index
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(
            f"{where}: batch['chunk'] must be the chunk's non-negative index in its stream, got {index!r}."
        )
    return Chunk(x, y, mask, reset, index)
