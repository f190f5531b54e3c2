"""Evaluation mode for the length of a measurement, then every submodule back in its own mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Put ``module`` and all its submodules in eval mode for the block; afterwards (also after an exception) give
    each of them back the mode it had.

    ``module.train(was_training)`` would instead put every submodule in one mode: a BatchNorm or a flow the user
    froze in eval mode would train again from the next step on, and its running statistics would change.
    """
    modes = [(submodule, submodule.training) for submodule in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for submodule, training in modes:
            submodule.training = training
