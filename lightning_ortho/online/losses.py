"""The per-step loss of online recurrent training: masked cross-entropy or half squared error, summed over streams."""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812


def masked_loss_sum(outputs: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, loss: str) -> torch.Tensor:
    """The sum of the per-stream losses of one time step over the streams where ``mask`` is true (a scalar).

    ``outputs`` ``(b, O)``; ``target`` ``(b,)`` int64 class indices or ``(b, O)`` float (probabilities for
    ``"cross_entropy"``, real targets for ``"mse"``); ``mask`` ``(b,)`` bool. Per stream, ``"cross_entropy"`` is
    ``-log softmax(o)[y]`` (or ``-sum_k y_k log softmax(o)_k``) in nats and ``"mse"`` is ``0.5 ||o - y||^2`` (so
    that ``dl/do = o - y``, spec section 11). Computed in at least float32 (also under autocast); entries where
    ``mask`` is false (their targets may be padding) contribute exactly zero, also to the gradient.
    """
    outputs = outputs.to(torch.promote_types(outputs.dtype, torch.float32))
    if loss == "cross_entropy":
        if target.dtype == torch.long:
            target = torch.where(mask, target, torch.zeros_like(target))  # padding may be out of range
        else:
            target = target.to(outputs.dtype)
        per_stream = F.cross_entropy(outputs, target, reduction="none")
    else:
        per_stream = 0.5 * (outputs - target.to(outputs.dtype)).square().sum(-1)
    return torch.where(mask, per_stream, torch.zeros_like(per_stream)).sum()
