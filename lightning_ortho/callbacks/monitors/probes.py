"""A monitor's probes and first-forward checks, both taken by forward hooks on the watched modules.

A probe is the first ``probe_size`` rows of the first input a watched module receives in a training step (never a
sanity-check or validation batch); its hook is removed once it has fired, so a monitor never asks the model for data
and pays nothing on later forwards. A module named in ``modules`` is probed whatever its mode (a frozen flow in eval
mode is the common case); an automatically chosen one only while it trains (a frozen pretrained part is left alone,
and said at the end of fit). The first-forward check runs once on each watched module's first forward, where what
the module returns is known: a named module with a problem is a clear error, an automatically chosen one is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lightning_ortho._lightning import pl, rank_zero_warn

Hook = Callable[[nn.Module, tuple, object], None]


def hook_watched_modules(monitor: Any, trainer: pl.Trainer, check_first_forward: bool) -> None:
    """Hook ``monitor``'s watched modules: the first-forward check of each one not yet checked (where
    ``check_first_forward``; handles in ``monitor._hooks``), and the probe of each one without a probe (where
    ``monitor.needs_probe()``; handles in ``monitor._probe_hooks``)."""
    if check_first_forward:
        for name, module in monitor._watched.items():
            if name not in monitor._first_checked:
                monitor._hooks.append(module.register_forward_hook(first_forward_hook(monitor, name)))
    if monitor.needs_probe():
        for name, module in monitor._watched.items():
            if name not in monitor.probes:
                monitor._probe_hooks[name] = module.register_forward_hook(probe_hook(monitor, name, trainer))


def first_forward_hook(monitor: Any, name: str) -> Hook:
    """The forward hook that checks the watched module ``name`` with ``monitor.first_forward_problem`` once: a
    module without a problem is marked checked; an automatically chosen one with a problem moves to
    ``monitor.skipped`` (with one warning when no module is left to measure).

    Raises:
        ValueError: from the hook, for a module named in ``modules`` that has a problem.
    """

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        if name in monitor._first_checked or name not in monitor._watched:
            return
        reason = monitor.first_forward_problem(name, module, args, output)
        if reason is None:
            monitor._first_checked.add(name)
            return
        if name in monitor._explicit:
            raise ValueError(f"{type(monitor).__name__}: cannot monitor {name!r}: {reason}")
        monitor.skipped[name] = reason
        del monitor._watched[name]
        monitor.probes.pop(name, None)
        if not monitor._watched:
            rank_zero_warn(
                f"{type(monitor).__name__}: no module left to measure: "
                + "; ".join(f"{n!r}: {r}" for n, r in monitor.skipped.items())
                + " Pass modules=[...] naming the modules to watch."
            )

    return hook


def probe_hook(monitor: Any, name: str, trainer: pl.Trainer) -> Hook:
    """The forward hook that stores the probe of the watched module ``name`` in ``monitor.probes`` (a detached copy
    of the first ``probe_size`` rows of its first tensor argument) and then removes itself."""

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        # A probe is a training input: not a sanity-check or validation batch (the trainer's stage says which,
        # whatever the module's mode).
        if name in monitor.probes or not trainer.training or not args or not isinstance(args[0], torch.Tensor):
            return
        if not module.training and name not in monitor._explicit:
            # An automatically chosen module the user froze is left alone (said at the end of fit); a named one
            # is measured in any mode.
            monitor._eval_only.add(name)
            return
        monitor.probes[name] = args[0][: monitor.probe_size].detach().clone()
        handle = monitor._probe_hooks.pop(name, None)
        if handle is not None:  # the probe is fixed: stop paying for the hook on every later forward
            handle.remove()

    return hook


def missing_probe_reason(monitor: Any, name: str) -> str:
    """Why the watched module ``name`` has no probe after a fit, and what to change (said at the end of fit)."""
    if name in monitor._eval_only:
        return (
            "it ran only in eval mode in training, and an automatically chosen module is measured only while "
            f"it trains (a frozen part is left alone); name it (modules=[{name!r}, ...]) to measure it in any "
            "mode"
        )
    return (
        "it was never called as a module with a batch tensor in a training step, so it has no probe; call it "
        "as module(x) in training_step (not module.forward(x) or another method)"
    )
