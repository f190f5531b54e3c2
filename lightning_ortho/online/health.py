"""NaN/inf checks without host synchronisation: a record, on the state's device, of the first step that failed.

Reading a tensor's value from the host (``bool(t)``, ``t.item()``) makes a GPU wait for all its queued work, and
``torch.compile`` cannot trace it. An estimator that is not told to check every step (``check_every != 1``, or any
step under ``torch.compile``) therefore only *records* a failure, with tensor operations: the record is an
``int64`` tensor ``(3,)`` on the state's device,

    ``(step, kind, index)``  with ``step = 0`` while nothing has failed,

written once, at the first step (or gradient) where one of the checked tensors holds NaN/inf: ``kind`` says which
call (:data:`STEP` or :data:`GRADIENT`) and ``index`` which of its checked tensors (the first non-finite one, in the
order the call checked them). Later failures leave it as it is: the first is the one that explains the others.
:func:`read_failure` reads it with one host synchronisation, once per update window.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["GRADIENT", "STEP", "new_record", "read_failure", "record_failure"]

#: ``kind`` of a failure found by ``step`` (its checked tensors: ``x``, the new state ``h``, the watched entries).
STEP = 1
#: ``kind`` of a failure found by ``gradient`` (its checked tensors: ``grad_h``, the estimate).
GRADIENT = 2


def new_record(device: torch.device | str) -> torch.Tensor:
    """A clear record ``(0, 0, 0)``: ``int64`` ``(3,)`` on ``device``."""
    return torch.zeros(3, dtype=torch.int64, device=device)


def record_failure(record: torch.Tensor, step: int, kind: int, tensors: Sequence[torch.Tensor]) -> None:
    """Write ``(step, kind, index of the first non-finite tensor)`` into ``record`` in place if it is clear and one
    of ``tensors`` holds NaN/inf; no host synchronisation (every decision is a tensor operation).

    Args:
        record: the ``int64`` ``(3,)`` record (:func:`new_record`).
        step: the step the tensors belong to (``>= 1``), a Python int (a symbolic one under ``torch.compile``).
        kind: :data:`STEP` or :data:`GRADIENT`.
        tensors: the checked tensors, real or complex, in the order whose index the record keeps. Each is tested
            entry by entry (``isfinite(t).all()``), so finite entries whose sum would overflow are no failure.
    """
    if record.is_meta or not tensors:  # shape inference: no values to check
        return
    bad = ~torch.stack([torch.isfinite(t).all() for t in tensors])
    index = torch.argmax(bad.to(torch.int64))  # the first non-finite tensor (argmax returns the first maximum)
    entry = torch.stack((torch.zeros_like(index) + step, torch.full_like(index, kind), index))
    record.copy_(torch.where((record[0] == 0) & bad.any(), entry, record))


def read_failure(record: torch.Tensor | None) -> tuple[int, int, int] | None:
    """``(step, kind, index)`` of the recorded failure, or ``None`` when there is none (or no record, or a meta
    one); one host synchronisation."""
    if record is None or record.is_meta:
        return None
    step, kind, index = record.tolist()
    return None if step == 0 else (step, kind, index)
