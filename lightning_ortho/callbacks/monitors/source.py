"""Where a monitor comes from (``source``): a user's code or config, or the environment switch of
:mod:`~lightning_ortho.callbacks.factory`. A monitor from the environment stands aside for a fit (every Lightning
``on_*`` hook does nothing) when the Trainer already has a user's monitor of its class, or when the model has
nothing it can measure (one warning instead of the error): the switch turns monitors on for every run and must never
break one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

from torch import nn

from lightning_ortho._lightning import pl, rank_zero_info, rank_zero_warn

Source = Literal["user", "environment"]

#: The environment variable of the switch in :mod:`~lightning_ortho.callbacks.factory` (named in its messages).
MONITORS_VARIABLE = "LIGHTNING_ORTHO_MONITORS"


def gate_hooks(cls: type) -> None:
    """Make every Lightning ``on_*`` hook that ``cls`` defines do nothing while the monitor's ``_idle`` is set."""
    for name, hook in list(vars(cls).items()):
        if name.startswith("on_") and callable(hook) and not getattr(hook, "__gated__", False):
            setattr(cls, name, _gated(hook))


def _gated(hook: Callable) -> Callable:
    @functools.wraps(hook)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._idle:
            return None
        return hook(self, *args, **kwargs)

    method.__gated__ = True
    return method


def stands_aside_for_a_users_monitor(monitor: Any, trainer: pl.Trainer) -> bool:
    """Whether ``monitor``, from the environment, stands aside because the Trainer has a user's monitor of its class
    (the user's settings win); said at info level."""
    if monitor.source != "environment":
        return False
    users = [
        other
        for other in trainer.callbacks
        if isinstance(other, type(monitor)) and getattr(other, "source", "user") == "user"
    ]
    if not users:
        return False
    rank_zero_info(  # named by the user's class (GradientVarianceMonitor is a GradientNoiseMonitor)
        f"lightning-ortho: the Trainer already has a {type(users[0]).__name__}; the {type(monitor).__name__} from "
        f"{MONITORS_VARIABLE} stands aside."
    )
    return True


def select_or_stand_aside(monitor: Any, pl_module: nn.Module) -> dict[str, nn.Module] | None:
    """``monitor.select(pl_module)``; for a monitor from the environment, ``None`` with one warning where that
    raises ``ValueError`` (nothing to measure).

    Raises:
        ValueError: from ``select``, for a user's monitor.
    """
    try:
        return monitor.select(pl_module)
    except ValueError as error:
        if monitor.source != "environment":
            raise
        from lightning_ortho.callbacks.factory import name_of  # the switch's name for this class

        name = name_of(type(monitor))
        rank_zero_warn(
            f"lightning-ortho: {MONITORS_VARIABLE} turned on {type(monitor).__name__} ({name!r}), but it cannot run "
            f"on {type(pl_module).__name__}: {error} It does nothing in this run; remove {name!r} from "
            f"{MONITORS_VARIABLE} to silence this."
        )
        return None
