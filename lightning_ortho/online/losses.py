"""The per-step loss of online recurrent training: masked cross-entropy or half squared error, summed over streams."""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812


def masked_loss_sum(outputs: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, loss: str) -> torch.Tensor:
    """The sum of the per-stream losses of one time step over the streams where ``mask`` is true (a scalar).

    ``outputs`` ``(b, O)``; ``target`` ``(b,)`` class indices (any integer dtype) or ``(b, O)`` float (probabilities
    for ``"cross_entropy"``, real targets for ``"mse"``); ``mask`` ``(b,)`` bool. Per stream, ``"cross_entropy"`` is
    ``-log softmax(o)[y]`` (or ``-sum_k y_k log softmax(o)_k``) in nats and ``"mse"`` is ``0.5 ||o - y||^2`` (so
    that ``dl/do = o - y``). Computed in at least float32 (also under autocast); entries where ``mask`` is false
    contribute exactly zero, also to the gradient: their targets may hold anything (padding, NaN, inf), since they
    are replaced by a neutral one (class 0, or zeros) before the loss. Masking the loss alone would not do: its
    gradient at a masked entry is ``0 * (o - y)``, NaN where ``y`` is NaN or inf.
    """
    outputs = outputs.to(torch.promote_types(outputs.dtype, torch.float32))
    if not (target.is_floating_point() or target.is_complex() or target.dtype == torch.bool):
        target = target.long()  # class indices of any integer dtype (int32, uint8...); cross_entropy takes int64
    if target.dtype == torch.long:
        target = torch.where(mask, target, torch.zeros_like(target))  # padding may be out of range
    else:
        target = target.to(outputs.dtype)
        target = torch.where(mask[:, None], target, torch.zeros_like(target))  # padding may be NaN or inf
    if loss == "cross_entropy":
        per_stream = F.cross_entropy(outputs, target, reduction="none")
    else:
        per_stream = 0.5 * (outputs - target).square().sum(-1)
    return torch.where(mask, per_stream, torch.zeros_like(per_stream)).sum()
