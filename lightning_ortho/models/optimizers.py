"""Building the modules' optimizers, refusing an ``eps`` that underflows in the parameters' dtype.

Adam, RMSprop and their kin keep their moments in the parameters' dtype and divide by ``sqrt(v) + eps``. Under
``Trainer(precision="16-true")`` the parameters are float16, where the default ``eps = 1e-8`` rounds to zero and
squared gradients below about ``2.4e-4`` underflow to zero: the first update divides zero by zero and every
parameter becomes NaN (the later error then blames the learning rate). Every module of this package builds its
optimizers through :func:`build_optimizer`, so the mismatch is a clear error before the first step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def build_optimizer(
    owner: str,
    optimizer_class: type[torch.optim.Optimizer],
    params: Iterable[Any],
    *,
    alternative: str = "",
    **options: Any,
) -> torch.optim.Optimizer:
    """``optimizer_class(params, **options)``, checked by :func:`check_optimizer_precision`.

    Args:
        owner: the module's name, for the error message.
        optimizer_class: a torch optimizer class; params and options: its arguments.
        alternative: another way out that the module offers, appended to the error (e.g. ``"optimizer='sgd'"``).

    Raises:
        ValueError: see :func:`check_optimizer_precision`.
    """
    optimizer = optimizer_class(params, **options)
    check_optimizer_precision(optimizer, owner, alternative)
    return optimizer


def check_optimizer_precision(optimizer: torch.optim.Optimizer, owner: str, alternative: str = "") -> None:
    """Refuse an optimizer whose ``eps`` is below the smallest normal number of a parameter's dtype.

    With ``eps`` under ``torch.finfo(dtype).tiny`` (float16: ``6.1e-5``) the denominator ``sqrt(v) + eps``
    is zero or a few units of the last place once the squared gradients underflow, so the update is NaN or
    wildly large. Optimizers without ``eps`` (SGD) pass; ``alternative`` is appended to the advice.

    Raises:
        ValueError: such an ``eps``; the message names the dtype and what to train with instead.
    """
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            continue
        for p in group["params"]:
            if not p.is_floating_point():
                continue
            tiny = torch.finfo(p.dtype).tiny
            if eps < tiny:
                raise ValueError(
                    f"{owner}: {type(optimizer).__name__} keeps its moments in the parameters' dtype, {p.dtype} here"
                    f" (as precision='16-true' makes them), where eps={eps:g} is below the smallest normal number"
                    f" {tiny:.2g} (it rounds to {float(torch.tensor(eps, dtype=p.dtype)):g}) and small squared"
                    " gradients underflow to zero: the first update would divide by zero and turn the parameters"
                    " into NaN. Train with precision='16-mixed' (float32 weights and optimizer state, float16"
                    f" compute), 'bf16-true' or 'bf16-mixed'{', or ' + alternative if alternative else ''}."
                )
