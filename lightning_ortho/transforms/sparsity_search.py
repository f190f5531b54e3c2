"""The fewest nonzeros per code row that meet an error budget: what ``compress_linear(max_error=...)`` and
``compress_conv(max_error=...)`` search, and what :func:`~lightning_ortho.transforms.model_compression.compress_model`
asks of every layer.

The operations of a compressed layer grow with ``s`` (each output row pays ``s`` multiplications and ``s - 1``
additions), and its error falls with ``s`` (``s = in`` is exact), so the cheapest ``s`` that meets a budget is the
smallest one: a binary search over a ladder of ``s`` values (:func:`sparsity_ladder`: 1, 2, 3, 4, 6, 8, 12, ...,
steps of at most half, so the ``s`` found is within 1.5x of the smallest that would do), each step a full
compression. The error is not guaranteed to fall at every step (the learners are heuristics): the search trusts it
to, and reports every ``s`` it tried with its error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


def sparsity_ladder(n: int) -> list[int]:
    """The ``s`` values tried for ``n`` inputs: ``1, 2, 3, 4, 6, 8, 12, 16, 24, ...`` up to ``n``, and ``n``."""
    values, power = {1, n}, 2
    while power <= n:
        values.update(v for v in (power, power + power // 2) if v <= n)
        power *= 2
    return sorted(values)


@dataclass
class SparsitySearch:
    """What :func:`search_sparsity` found.

    Attributes:
        layer: the compressed layer of the chosen ``s`` (the last one tried where none meets the budget).
        s: its nonzeros per code row.
        met: whether its error is within the budget.
        tried: every ``s`` tried and its error (percent), in the order tried.
    """

    layer: nn.Module
    s: int
    met: bool
    tried: dict[int, float] = field(default_factory=dict)


def search_sparsity(
    compress: Callable[[int], nn.Module],
    error_of: Callable[[nn.Module], float],
    n: int,
    max_error: float,
    *,
    cache: dict[int, Any] | None = None,
) -> SparsitySearch:
    """The smallest ``s`` of :func:`sparsity_ladder` ``(n)`` whose ``compress(s)`` has ``error_of(layer) <=
    max_error`` (binary search, trusting the error to fall with ``s``). ``cache`` (``s -> layer``) keeps the
    compressions across searches of the same layer with other budgets. The compressions' own warnings (a layer
    dearer than dense at some ``s``) are silenced here: the caller judges the layer it keeps.

    Raises:
        ValueError: ``max_error`` is not a positive number.
    """
    if not isinstance(max_error, int | float) or isinstance(max_error, bool) or not max_error > 0:
        raise ValueError(f"max_error must be a positive number (percent), got {max_error!r}.")
    cache = {} if cache is None else cache
    ladder, tried = sparsity_ladder(n), {}

    def attempt(s: int) -> tuple[nn.Module, float]:
        if s not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                cache[s] = compress(s)
        layer = cache[s]
        tried[s] = error_of(layer)
        return layer, tried[s]

    low, high = 0, len(ladder) - 1  # invariant: ladder[high] meets the budget or is the last resort
    best = None
    while low <= high:
        middle = (low + high) // 2
        layer, error = attempt(ladder[middle])
        if error <= max_error:
            best, high = (ladder[middle], layer), middle - 1
        else:
            low = middle + 1
    if best is not None:
        return SparsitySearch(layer=best[1], s=best[0], met=True, tried=tried)
    layer, _ = attempt(ladder[-1])
    return SparsitySearch(layer=layer, s=ladder[-1], met=False, tried=tried)
