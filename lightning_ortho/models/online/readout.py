"""The readout and the chunk format of :class:`~lightning_ortho.models.OnlineRNNModule`, and the diagnosis of a
non-finite loss gradient at its readout."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

LOSSES = ("cross_entropy", "mse")
READOUTS = ("linear", "units")
#: A class target of this value is not scored (PyTorch's ``ignore_index`` of ``cross_entropy``): masked out.
IGNORE_INDEX = -100


class Readout(nn.Module):
    """Outputs from hidden states: ``(..., H) -> (..., output_size)``.

    Args:
        kind: ``"linear"``: ``nn.Linear(hidden_size, output_size)``; ``"units"``: the first ``output_size``
            units of ``h`` themselves, no parameters (the influence-balancing task reads its first unit).
        hidden_size, output_size: sizes.
        complex_state: the state is complex: the readout reads its real and imaginary parts
            (:func:`real_features`, ``2 hidden_size`` features).

    Raises:
        ValueError: unknown ``kind``, or ``"units"`` with ``output_size > hidden_size``.
    """

    def __init__(self, kind: str, hidden_size: int, output_size: int, *, complex_state: bool = False) -> None:
        super().__init__()
        if kind not in READOUTS:
            raise ValueError(f"OnlineRNNModule: readout must be one of {READOUTS}, got {kind!r}.")
        if kind == "units" and output_size > hidden_size:
            raise ValueError(
                f"OnlineRNNModule: readout='units' reads the first output_size={output_size} units of the state, but"
                f" the cell has only {hidden_size}; use readout='linear' or a larger cell."
            )
        self.kind, self.output_size, self.complex_state = kind, output_size, complex_state
        features = 2 * hidden_size if complex_state else hidden_size
        self.linear = nn.Linear(features, output_size) if kind == "linear" else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = real_features(h)
        return self.linear(h) if self.linear is not None else h[..., : self.output_size]


def real_features(h: torch.Tensor) -> torch.Tensor:
    """``h`` itself if real; for a complex ``(..., H)`` state its real and imaginary parts interleaved,
    ``(..., 2H)`` = ``[Re h_1, Im h_1, Re h_2, ...]`` (a view): what the readout of a complex state reads."""
    return torch.view_as_real(h).flatten(-2) if h.is_complex() else h

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, output_size={self.output_size}"


@dataclass
class Chunk:
    """One chunk of ``b >= 1`` parallel streams, checked: ``x`` ``(b, T, I)``, ``y`` ``(b, T)`` int64 or ``(b, T, O)``,
    ``mask`` ``(b, T)`` bool (false also where a class target is ``IGNORE_INDEX``), ``reset`` ``(b,)`` bool,
    ``index`` the chunk's position in its stream; ``bad_classes`` ``None``, or (read with ``check_classes=False``) the
    ``(b, T)`` bool tensor of the scored class targets outside ``[0, output_size)`` (those entries left the mask)."""

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    reset: torch.Tensor
    index: int
    bad_classes: torch.Tensor | None = None

    @property
    def streams(self) -> int:
        return self.x.shape[0]

    @property
    def steps(self) -> int:
        return self.x.shape[1]


def read_chunk(
    batch: object, *, input_size: int | None, output_size: int, loss: str, check_classes: bool = True
) -> Chunk:
    """Check a batch of the stream contract (``lightning_ortho.datamodules.StreamDataModule``) and unpack it.

    ``mask`` (all true) and ``reset`` (none) may be left out; ``x``, ``y`` and ``chunk`` are required. Class
    indices of any integer dtype (int32, uint8, ...) are returned as int64, as cross-entropy takes them. Class
    targets of ``IGNORE_INDEX`` (-100, as ``torch.nn.functional.cross_entropy`` ignores) are not scored: they
    leave the returned mask, so they count neither in the loss nor in the number of scored entries.

    Raises:
        ValueError: the batch is not such a dict, has no streams, or a shape, dtype or size disagrees with the
            model (a ``y`` that is neither integer nor floating, or float class indices: the message names the
            conversion), or a scored class target is outside ``[0, output_size)`` (and not -100); the message names the
            option to change. The class check is one host synchronisation per chunk; with ``check_classes=False``
            it is not read: out-of-range class targets leave the mask and ``Chunk.bad_classes`` says whether there
            were any (the caller reads it later, raising :func:`bad_classes_error`).
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
    if b == 0:
        raise ValueError(
            f"{where}: the batch has no streams: batch['x'] is {tuple(x.shape)} (streams, steps, features). Every"
            " process needs at least one stream; under DDP each of the W processes takes every W-th stream, so give"
            " the data at least as many streams as processes."
        )
    if input_size is not None and x.shape[2] != input_size:
        raise ValueError(
            f"{where}: the data has {x.shape[2]} input features per step but the cell's input_size is {input_size};"
            f" set --model.init_args.cell.init_args.input_size={x.shape[2]}."
        )
    if is_integer(y):
        y = y.long()  # class indices of any integer dtype; cross_entropy takes int64
    hard = y.dtype == torch.long
    if hard and (loss != "cross_entropy" or tuple(y.shape) != (b, steps)):
        raise ValueError(
            f"{where}: integer targets must be (streams, steps) class indices for loss='cross_entropy', got"
            f" {tuple(y.shape)} with loss={loss!r}; use float (streams, steps, outputs) targets for 'mse'."
        )
    if not hard and not y.is_floating_point():
        raise ValueError(
            f"{where}: batch['y'] must hold integer class indices ({b}, {steps}) or float targets ({b}, {steps},"
            f" output_size={output_size}), got a {y.dtype} tensor {tuple(y.shape)}; convert it with .long() (class"
            " indices) or .float() (a target per output)."
        )
    if not hard and tuple(y.shape) == (b, steps):
        raise ValueError(
            f"{where}: batch['y'] is a float ({b}, {steps}) tensor: float targets are ({b}, {steps},"
            f" output_size={output_size}) (probabilities, or real targets for 'mse'); if it holds class indices,"
            " convert it with .long()."
        )
    if not hard and tuple(y.shape) != (b, steps, output_size):
        raise ValueError(
            f"{where}: batch['y'] must be integer ({b}, {steps}) class indices or float ({b}, {steps},"
            f" output_size={output_size}), got {y.dtype} {tuple(y.shape)}; if the data has {y.shape[-1]} outputs, set"
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
    bad = None
    if hard and check_classes:
        mask = _check_classes(y, mask, output_size)
    elif hard:
        mask = mask & (y != IGNORE_INDEX)
        outside = mask & ((y < 0) | (y >= output_size))
        mask, bad = mask & ~outside, outside
    index = batch["chunk"]
    index = int(index.item()) if isinstance(index, torch.Tensor) and index.numel() == 1 else index
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(
            f"{where}: batch['chunk'] must be the chunk's non-negative index in its stream, got {index!r}."
        )
    return Chunk(x, y, mask, reset, index, bad)


def is_integer(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` has an integer dtype (signed or unsigned; not bool, floating or complex)."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def _check_classes(y: torch.Tensor, mask: torch.Tensor, output_size: int) -> torch.Tensor:
    """The mask without the ``IGNORE_INDEX`` targets; raise if a scored class is outside ``[0, output_size)``.

    Without the check, cross-entropy fails with a bare ``IndexError`` (or a device assert on a GPU) at the step
    of the bad target; masked-out entries may hold anything (padding).
    """
    mask = mask & (y != IGNORE_INDEX)
    bad = mask & ((y < 0) | (y >= output_size))
    if bool(bad.any()):  # one host synchronisation per chunk
        raise bad_classes_error(y, bad, output_size)
    return mask


def bad_classes_error(
    y: torch.Tensor | None, bad: torch.Tensor | None, output_size: int, chunk: int | None = None
) -> ValueError:
    """The ``ValueError`` for scored class targets outside ``[0, output_size)``: naming them where ``y`` and ``bad``
    (where they are) are given (error path: host reads), else the training ``chunk`` that held them."""
    shown = ""
    if y is not None and bad is not None:
        found = y[bad].unique()
        shown = " [" + ", ".join(str(v) for v in found[:5].tolist()) + (", ..." if found.numel() > 5 else "") + "]"
    where = f" of training chunk {chunk}" if chunk is not None else ""
    return ValueError(
        f"OnlineRNNModule: batch['y'] holds the class indices{shown} at scored (masked) entries{where}, but the model"
        f" has output_size={output_size} classes (0 .. {output_size - 1}); set --model.init_args.output_size to"
        f" the number of classes, give unscored entries a false mask or the target {IGNORE_INDEX} (ignored)."
    )


def explain_nonfinite_grad_h(
    grad_h: torch.Tensor,
    h: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    readout: Readout,
    parameters: list[tuple[str, torch.Tensor]],
    update: int,
    lr: float,
) -> Exception | None:
    """Why ``grad_h = dL_t/dh_t`` ``(b, H)`` holds NaN/inf, as an error to raise, or ``None`` (the estimator's
    error stands) when ``grad_h`` is finite or none of these is the cause (error path only: host syncs).

    The estimator sees only ``grad_h`` and blames the data; the module also knows the readout, the targets ``y``
    of the step (with its ``mask``) and every parameter (``(name, tensor)`` pairs): NaN/inf parameters, or finite
    ones so large that the readout's outputs or loss overflow (a diverging run), give a ``FloatingPointError``
    naming them and their size; NaN/inf targets at scored entries a ``ValueError``.
    """
    if bool(torch.isfinite(grad_h).all()):
        return None
    where = f"OnlineRNNModule: dL/dh (the loss's gradient at the hidden state) holds NaN/inf at update {update}"
    advice = (
        f"lower the learning rate (lr={lr:g}), clip the updates (clip_gradient_norm), or train in a wider dtype"
        " (precision='32-true' or '64-true')"
    )
    bad = [name for name, p in parameters if not bool(torch.isfinite(p).all())]
    if bad:
        return FloatingPointError(
            f"{where}: the parameters {bad} hold NaN/inf, so training has diverged (the updates grew until they"
            f" overflowed); {advice}."
        )
    if y.is_floating_point() and not bool(torch.isfinite(y[mask]).all()):
        return ValueError(
            f"{where}: batch['y'] holds NaN/inf at scored (masked) entries; fix the data, or set their mask to false."
        )
    with torch.no_grad():
        outputs = readout(h)
        outputs = outputs.to(torch.promote_types(outputs.dtype, torch.float32))  # as masked_loss_sum computes
    largest = sorted(((float(p.detach().abs().max()), name) for name, p in parameters if p.numel()), reverse=True)
    sizes = ", ".join(f"{name} (max |entry| {size:.3g})" for size, name in largest[:3])
    if bool(torch.isfinite(outputs).all()):
        overflowed = f"outputs reach {float(outputs.abs().max()):.3g} and the loss or its gradient overflowed"
    else:
        overflowed = "outputs overflowed"
    return FloatingPointError(
        f"{where}: every parameter is finite, but the readout's {overflowed} {outputs.dtype}: the largest"
        f" parameters are {sizes}, so training is diverging; {advice}."
    )
