"""Turn the monitors on from the environment, with no code change: Lightning's ``callbacks_factory`` entry point.

Installing lightning-ortho registers :func:`monitors_from_environment` under the entry-point groups of both Lightning
packages (``pytorch_lightning.callbacks_factory`` and ``lightning.pytorch.callbacks_factory``); every Trainer of
either calls it and appends what it returns to its callbacks. It is opt-in: with ``LIGHTNING_ORTHO_MONITORS``
unset or empty it returns ``[]`` at once, so a Trainer in an environment where lightning-ortho is installed behaves
exactly as without it (the one cost is importing ``lightning_ortho.callbacks``, once per process).

Environment variables:

``LIGHTNING_ORTHO_MONITORS``
    Monitors to add, separated by commas or spaces (case-insensitive), or ``all``: ``orthogonality``
    (:class:`~lightning_ortho.callbacks.orthogonality_monitor.OrthogonalityMonitor`), ``jacobian``
    (``JacobianDeterminantMonitor``), ``invertibility`` (``InvertibilityMonitor``), ``gradient_noise``
    (``GradientNoiseMonitor``; ``gradient_variance``, its name before, is accepted with a ``LightningOrthoDeprecationWarning``).
``LIGHTNING_ORTHO_EVERY_N_STEPS``
    A positive int passed as ``every_n_steps``, the optimizer steps between measurements of every monitor (each
    monitor's default otherwise); raised, with a warning, to the smallest value a monitor accepts
    (``GradientNoiseMonitor`` needs 2: its window of gradients, at most 20 steps, fits in the interval).
``LIGHTNING_ORTHO_PROBE_SIZE``
    A positive int passed as ``probe_size`` to the monitors that take a probe batch.
``LIGHTNING_ORTHO_PLOT``
    ``1``/``0`` (``true``/``false``, ``yes``/``no``): write the PNG at the end of fit (default: no PNG; it needs
    matplotlib, ``pip install "lightning-ortho[plots]"``, and without it the monitors run without PNG, with a
    warning).

Example, with a training script that knows nothing of lightning-ortho::

    LIGHTNING_ORTHO_MONITORS=orthogonality,jacobian LIGHTNING_ORTHO_EVERY_N_STEPS=10 python train.py

Monitors created here are the same classes, built with the base's option ``source="environment"``, which makes
them differ from the ones a user constructs in four ways, so that switching them on for any
project never breaks its training, nor nags it:

* a model with nothing such a monitor can measure gets one warning and the monitor does nothing for that fit
  (a monitor constructed in code raises instead: there the user asked for that model);
* where the Trainer already has a monitor of the same class (constructed in code or in a config), the one from the
  environment stands aside for that fit (the user's settings win), with an info message;
* their checkpoint ``state_key`` is ``"<Class>{'source': 'environment'}"``, so they never collide with a
  user-constructed monitor of the same class in Lightning's check for unique stateful callbacks;
* a fit too short for a monitor to measure anything (a smoke test, a ``fast_dev_run``: ``GradientNoiseMonitor``
  at its defaults needs 100 steps) is reported at info level, not as a warning: the switch turns the monitors on for
  every run, and a warning on each short one would teach users to ignore them. Anything else that left a monitor
  without values (a module never called, steps with inf/NaN gradients) is still a warning.

Bad settings (unknown names, a non-integer interval) raise ``ValueError`` when the Trainer is constructed,
before any training. A well-formed setting that a monitor's constructor refuses never breaks the Trainer: it is
raised to the monitor's minimum, or else that monitor uses its own default for it, with a warning naming the variable
and the value used instead.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from typing import Any

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning

#: Monitor name -> ``"module:Class"``; imported only when named in ``LIGHTNING_ORTHO_MONITORS``.
MONITORS: dict[str, str] = {
    "orthogonality": "lightning_ortho.callbacks.orthogonality_monitor:OrthogonalityMonitor",
    "jacobian": "lightning_ortho.callbacks.jacobian_monitor:JacobianDeterminantMonitor",
    "invertibility": "lightning_ortho.callbacks.invertibility_monitor:InvertibilityMonitor",
    "gradient_noise": "lightning_ortho.callbacks.gradient_noise:GradientNoiseMonitor",
}

#: Deprecated monitor names -> their names in :data:`MONITORS` (accepted with a ``LightningOrthoDeprecationWarning``; removed in the
#: next release).
RENAMED_MONITORS: dict[str, str] = {"gradient_variance": "gradient_noise"}

MONITORS_VARIABLE = "LIGHTNING_ORTHO_MONITORS"
EVERY_N_STEPS_VARIABLE = "LIGHTNING_ORTHO_EVERY_N_STEPS"
PROBE_SIZE_VARIABLE = "LIGHTNING_ORTHO_PROBE_SIZE"
PLOT_VARIABLE = "LIGHTNING_ORTHO_PLOT"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def requested_monitors(environ: dict[str, str] | None = None) -> list[str]:
    """The monitor names in ``LIGHTNING_ORTHO_MONITORS`` (in order, without repeats; ``all`` means every one).

    Raises:
        ValueError: a name that is not one of :data:`MONITORS`.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(MONITORS_VARIABLE, "")
    names: list[str] = []
    for token in raw.replace(",", " ").split():
        token = token.strip().lower().replace("-", "_")
        if token in RENAMED_MONITORS:
            warnings.warn(
                f"{MONITORS_VARIABLE}: the monitor name {token!r} is deprecated and will be removed in the next "
                f"release; use {RENAMED_MONITORS[token]!r}.",
                LightningOrthoDeprecationWarning,
                stacklevel=2,
            )
            token = RENAMED_MONITORS[token]
        expanded = list(MONITORS) if token == "all" else [token]
        for name in expanded:
            if name not in MONITORS:
                raise ValueError(
                    f"{MONITORS_VARIABLE}={raw!r}: unknown monitor {token!r}. Valid names: "
                    f"{', '.join(MONITORS)} (separated by commas), or 'all'."
                )
            if name not in names:
                names.append(name)
    return names


def settings_from_environment(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The constructor arguments set by ``LIGHTNING_ORTHO_EVERY_N_STEPS``, ``..._PROBE_SIZE`` and ``..._PLOT``
    (only those that are set).

    Raises:
        ValueError: a value that is not a positive int (intervals, sizes) or a boolean word (plot).
    """
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {}
    for variable, argument in ((EVERY_N_STEPS_VARIABLE, "every_n_steps"), (PROBE_SIZE_VARIABLE, "probe_size")):
        raw = environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{variable}={raw!r}: must be a positive integer ({argument} of the monitors).")
        settings[argument] = value
    raw = environ.get(PLOT_VARIABLE, "").strip().lower()
    if raw:
        if raw not in _TRUE | _FALSE:
            raise ValueError(f"{PLOT_VARIABLE}={raw!r}: must be 1 or 0 (true/false, yes/no).")
        settings["plot"] = raw in _TRUE
    return settings


def monitor_class(name: str) -> type:
    """The monitor class registered as ``name`` in :data:`MONITORS` (imported now).

    Raises:
        ValueError: unknown name. ImportError: its module cannot be imported.
    """
    if name not in MONITORS:
        raise ValueError(f"Unknown monitor {name!r}. Valid names: {', '.join(MONITORS)}.")
    module_name, _, class_name = MONITORS[name].partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"{MONITORS_VARIABLE} asks for {name!r}, but {MONITORS[name]} cannot be imported ({error}). "
            f"Remove {name!r} from {MONITORS_VARIABLE}, or reinstall lightning-ortho."
        ) from error


def monitors_for_lightning() -> list:
    """The ``lightning.pytorch.callbacks_factory`` entry point: :func:`monitors_from_environment`, after
    :func:`check_trainer_package` for a ``lightning`` Trainer."""
    check_trainer_package("lightning")
    return monitors_from_environment()


def monitors_for_pytorch_lightning() -> list:
    """The ``pytorch_lightning.callbacks_factory`` entry point: :func:`monitors_from_environment`, after
    :func:`check_trainer_package` for a ``pytorch_lightning`` Trainer."""
    check_trainer_package("pytorch_lightning")
    return monitors_from_environment()


def check_trainer_package(trainer_package: str) -> None:
    """Warn (once) when a Trainer of ``trainer_package`` is built in a process whose lightning-ortho LightningModules
    and data modules derive from the other Lightning package: that Trainer will refuse them with Lightning's bare
    "must be a LightningModule", so say here which package lightning-ortho chose and how to choose the other.

    Each package's Trainer calls its own entry-point group, so the caller's package is known; nothing is imported.
    """
    choice = sys.modules.get("lightning_ortho._lightning")
    built = [name for name in ("lightning_ortho.models", "lightning_ortho.datamodules") if name in sys.modules]
    if choice is None or not built or choice.PACKAGE == trainer_package:
        return
    warnings.warn(
        f"lightning-ortho: this Trainer is {trainer_package}'s, but lightning-ortho's LightningModules and data "
        f"modules in this process derive from {choice.PACKAGE} (chosen when lightning-ortho was first imported, "
        f"before the program imported {trainer_package}): this Trainer refuses them. Import {trainer_package} "
        f"before lightning_ortho, or set {choice.PACKAGE_VARIABLE}={trainer_package}. (lightning-ortho's callbacks "
        "serve either Trainer.)",
        stacklevel=2,
    )


def monitors_from_environment() -> list:
    """The monitors named in ``LIGHTNING_ORTHO_MONITORS`` (``[]`` when it is unset or empty), built with the settings
    of the other variables (see the module docstring): what both Lightning packages' ``callbacks_factory`` entry
    points return.

    Raises:
        ValueError: unknown monitor names or bad settings. ImportError: a named monitor cannot be imported.
    """
    if not os.environ.get(MONITORS_VARIABLE, "").strip():
        return []
    names = requested_monitors()
    settings = settings_from_environment()
    callbacks = []
    unused = set(settings)
    for name in names:
        cls = monitor_class(name)
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = {key: value for key, value in settings.items() if key in accepted}
        unused -= set(kwargs)
        callbacks.append(_build(cls, kwargs))
    if unused:
        warnings.warn(
            f"lightning-ortho: {', '.join(sorted(unused))} set in the environment, but none of the monitors "
            f"{', '.join(names)} takes it; it is ignored.",
            stacklevel=2,
        )
    return callbacks


#: Constructor argument -> the variable that sets it.
_VARIABLES = {"every_n_steps": EVERY_N_STEPS_VARIABLE, "probe_size": PROBE_SIZE_VARIABLE, "plot": PLOT_VARIABLE}


def _build(cls: type, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)`` with ``source="environment"`` (see :class:`~lightning_ortho.callbacks.monitors.base.Monitor`),
    where the constructor accepts the settings; a setting it refuses never breaks the Trainer (the switch promises
    that): ``every_n_steps`` below the monitor's ``min_every_n_steps`` is raised to it, and a setting the constructor
    still refuses (``ValueError``, or ``ImportError`` for ``LIGHTNING_ORTHO_PLOT=1`` without matplotlib) is dropped
    for the monitor's default; each with a warning naming the variable and the value used instead."""
    owner = f"{cls.__name__} ({name_of(cls)!r})"
    low = getattr(cls, "min_every_n_steps", 1)
    if kwargs.get("every_n_steps", low) < low:
        warnings.warn(
            f"lightning-ortho: {EVERY_N_STEPS_VARIABLE}={kwargs['every_n_steps']}, but {owner} needs every_n_steps "
            f">= {low}; it uses every_n_steps={low}.",
            stacklevel=3,
        )
        kwargs = {**kwargs, "every_n_steps": low}
    try:
        monitor = cls(**kwargs)
    except (ValueError, ImportError) as error:
        defaults = inspect.signature(cls.__init__).parameters
        used = ", ".join(f"{key}={defaults[key].default!r}" for key in kwargs)
        warnings.warn(
            f"lightning-ortho: {owner} refuses {', '.join(f'{_VARIABLES[k]}={v!r}' for k, v in kwargs.items())} "
            f"({error}); it uses its defaults instead: {used}.",
            stacklevel=3,
        )
        monitor = cls()
    monitor.source = "environment"  # the base's option (set here: a subclass need not forward it)
    return monitor


def name_of(cls: type) -> str:
    """The name in :data:`MONITORS` of the monitor class ``cls`` (or of its nearest registered base), else its class
    name."""
    registered = {}
    for name in MONITORS:
        try:
            registered.setdefault(monitor_class(name), name)
        except ImportError:  # a broken registration names no class
            continue
    return next((registered[base] for base in cls.__mro__ if base in registered), cls.__name__)
