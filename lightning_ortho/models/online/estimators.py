"""Estimators of :mod:`lightning_ortho.online` by name, as :class:`~lightning_ortho.models.OnlineRNNModule` builds them."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from lightning_ortho.online import (
    KFRTRL,
    RFLO,
    RTRL,
    UORO,
    DiagonalRTRL,
    OnlineGradientEstimator,
    OnlineState,
    SnAp,
    TruncatedBPTT,
)
from lightning_ortho.online.estimator import cell_refusal

_CLASSES = {
    "uoro": UORO,
    "rtrl": RTRL,
    "tbptt": TruncatedBPTT,
    "kf_rtrl": KFRTRL,
    "snap": SnAp,
    "diagonal_rtrl": DiagonalRTRL,
    "rflo": RFLO,
}
ESTIMATORS = tuple(_CLASSES)
#: Estimators that draw noise: seeded by the model's ``seed``, with the rows of this process's streams under DDP.
_RANDOM = ("uoro", "kf_rtrl")


def estimator_class(name: str) -> type[OnlineGradientEstimator]:
    """The estimator class of a name in :data:`ESTIMATORS` (``"uoro"``, ``"rtrl"``, ``"tbptt"``, ``"kf_rtrl"``,
    ``"snap"``, ``"diagonal_rtrl"``, ``"rflo"``).

    Raises:
        ValueError: unknown name.
    """
    if name not in _CLASSES:
        raise ValueError(f"OnlineRNNModule: estimator must be one of {ESTIMATORS}, got {name!r}.")
    return _CLASSES[name]


def build_estimator(name: str, cell: nn.Module, options: dict[str, Any], seed: int) -> OnlineGradientEstimator:
    """``estimator_class(name)(cell, **options)``; UORO and KF-RTRL also get ``generator=seed`` (their noise).

    Raises:
        ValueError: unknown name, an option the estimator does not take (the message lists those it takes),
            a cell the estimator cannot train (checked first: the message gives the reason and names the estimators
            that can train the cell), ``tbptt`` without ``k`` or ``rflo`` without ``tau``.
    """
    cls = estimator_class(name)
    # The cell first: no option makes an estimator take a cell that its defaults refuse (UORO's default projection
    # takes the most cells), and the reason matters more than a missing option.
    problem = cls.cell_problem(cell)
    if problem is not None:
        raise cell_refusal(problem, cell)
    taken = list(_option_defaults(cls, with_required=True))
    unknown = sorted(set(options) - set(taken))
    if "generator" in options:
        raise ValueError(
            "OnlineRNNModule: the estimator's noise is seeded by the model's `seed`, not estimator_options."
        )
    if unknown:
        raise ValueError(
            f"OnlineRNNModule: estimator_options {unknown} are not options of estimator={name!r}; it takes {taken}."
        )
    if name == "tbptt" and "k" not in options:
        raise ValueError(
            "OnlineRNNModule: estimator='tbptt' needs the truncation length: estimator_options={'k': 10}"
            " (--model.init_args.estimator_options='{k: 10}')."
        )
    if name == "rflo" and "tau" not in options:
        raise ValueError(
            "OnlineRNNModule: estimator='rflo' needs the trace's time constant: estimator_options={'tau': 10}"
            " (--model.init_args.estimator_options='{tau: 10}')."
        )
    kwargs = dict(options)
    if name in _RANDOM:
        kwargs["generator"] = seed
    return cls(cell, **kwargs)


def initial_state(
    estimator: OnlineGradientEstimator, h0: torch.Tensor, rank: int = 0, world_size: int = 1
) -> OnlineState:
    """The estimator's state for this process's streams ``rank::world_size`` of ``B = b * world_size``.

    UORO and KF-RTRL draw the noise of all ``B`` streams from their seed in every process and keep their own rows,
    so ``W`` processes draw exactly the noise one process with all streams would; the other estimators draw none.
    """
    if estimator.name in _RANDOM:
        total = h0.shape[0] * world_size
        ids = torch.arange(rank, total, world_size, device=h0.device)
        return estimator.initial_state(h0, stream_ids=ids, total_streams=total)
    return estimator.initial_state(h0)


def _option_defaults(cls: type[OnlineGradientEstimator], with_required: bool = False) -> dict[str, Any]:
    """``{option: default}`` of the estimator class's keyword arguments (``cell`` and ``generator``, which the
    model gives, left out); options without a default are included (as ``inspect.Parameter.empty``) only with
    ``with_required``."""
    found = {}
    for option in inspect.signature(cls.__init__).parameters.values():
        if option.name in ("self", "cell", "generator"):
            continue
        if with_required or option.default is not inspect.Parameter.empty:
            found[option.name] = option.default
    return found


def resolved_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the estimator's defaults filled in for those left out: two option dicts that build the same
    estimator (``{}`` and ``{"projection": "state"}`` for UORO, whose default projection is ``"state"``) resolve to
    equal dicts. An unknown estimator name gives ``options`` unchanged."""
    if name not in _CLASSES:
        return dict(options)
    return {**_option_defaults(_CLASSES[name]), **options}


def differing_options(name: str, saved: dict[str, Any], mine: dict[str, Any]) -> str:
    """The options whose resolved values (:func:`resolved_options`) differ, as ``"k: 3 saved, 5 now"`` (joined by
    commas; ``(not set)`` for an option without a default that one side leaves out); ``""`` when both build the same
    estimator."""
    a, b = resolved_options(name, saved), resolved_options(name, mine)
    differ = [key for key in sorted({*a, *b}) if key not in a or key not in b or not same_options(a[key], b[key])]
    shown = lambda side, key: repr(side[key]) if key in side else "(not set)"  # noqa: E731
    return ", ".join(f"{key}: {shown(a, key)} saved, {shown(b, key)} now" for key in differ)


def same_options(a: Any, b: Any) -> bool:
    """``a == b`` for estimator options, whose values may hold tensors (UORO's ``Q0``), lists or tuples."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_options(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_options(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False
