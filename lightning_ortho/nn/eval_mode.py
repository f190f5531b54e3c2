"""Evaluation mode for the length of a measurement, then every submodule back in its own mode (pure PyTorch)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Put ``module`` and all its submodules in eval mode for the block; afterwards (also after an exception) give
    each of them back the mode it had, by calling ``submodule.train(own_mode)`` on every submodule in pre-order.

    ``module.train(was_training)`` alone would put every submodule in one mode: a BatchNorm or a flow the user froze
    in eval mode would train again from the next step on, and its running statistics would change. Writing the
    ``.training`` flags back instead would skip a ``train(mode)`` override, so what ``eval()`` changed besides the
    flag (a noise level, a frozen part) would stay in place while training goes on. ``train`` recurses into the
    children, so in pre-order each submodule's last call is its own (every ancestor's comes first), and an override
    that sets a child's mode is corrected by the child's own call after it.

    Args:
        module: any ``nn.Module``; gradients are not touched (combine with ``torch.no_grad()`` as needed).
    """
    modes = [(submodule, submodule.training) for submodule in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for submodule, training in modes:
            submodule.train(training)
