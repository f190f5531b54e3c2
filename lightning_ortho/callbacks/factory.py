"""Turn the monitors on from the environment, with no code change: Lightning's ``pytorch_lightning.callbacks_factory``
entry point.

Installing lightning-ortho registers :func:`monitors_from_environment` under that entry-point group; every
``pl.Trainer`` calls it and appends what it returns to its callbacks. It is opt-in: with ``LIGHTNING_ORTHO_MONITORS``
unset or empty it returns ``[]`` at once, so a Trainer in an environment where lightning-ortho is installed behaves
exactly as without it (the one cost is importing ``lightning_ortho.callbacks``, once per process).

Environment variables:

``LIGHTNING_ORTHO_MONITORS``
    Monitors to add, separated by commas or spaces (case-insensitive), or ``all``: ``orthogonality``
    (:class:`~lightning_ortho.callbacks.orthogonality_monitor.OrthogonalityMonitor`), ``jacobian``
    (``JacobianDeterminantMonitor``), ``invertibility`` (``InvertibilityMonitor``), ``gradient_variance``
    (``GradientVarianceMonitor``).
``LIGHTNING_ORTHO_EVERY_N_STEPS``
    A positive int passed as ``every_n_steps`` (each monitor's default otherwise); raised, with a warning, to the
    smallest value a monitor accepts (``GradientVarianceMonitor`` needs 2).
``LIGHTNING_ORTHO_PROBE_SIZE``
    A positive int passed as ``probe_size`` to the monitors that take a probe batch.
``LIGHTNING_ORTHO_PLOT``
    ``1``/``0`` (``true``/``false``, ``yes``/``no``): write the PNG at the end of fit (each monitor's default
    otherwise).

Example, with a training script that knows nothing of lightning-ortho::

    LIGHTNING_ORTHO_MONITORS=orthogonality,jacobian LIGHTNING_ORTHO_EVERY_N_STEPS=10 python train.py

Monitors created here differ from the ones a user constructs in four ways, so that switching them on for any
project never breaks its training, nor nags it:

* a model with nothing such a monitor can measure gets one warning and the monitor does nothing for that fit
  (a monitor constructed in code raises instead: there the user asked for that model);
* where the Trainer already has a monitor of the same class (constructed in code or in a config), the one from the
  environment stands aside for that fit (the user's settings win), with an info message;
* their checkpoint ``state_key`` is ``"<Class>{'source': 'environment'}"``, so they never collide with a
  user-constructed monitor of the same class in Lightning's check for unique stateful callbacks;
* a fit too short for a monitor to measure anything (a smoke test, a ``fast_dev_run``: ``GradientVarianceMonitor``
  at its defaults needs 20 steps) is reported at info level, not as a warning: the switch turns the monitors on for
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
import warnings
from typing import Any

from lightning_ortho._lightning import pl, rank_zero_info, rank_zero_warn

#: Monitor name -> ``"module:Class"``; imported only when named in ``LIGHTNING_ORTHO_MONITORS``.
MONITORS: dict[str, str] = {
    "orthogonality": "lightning_ortho.callbacks.orthogonality_monitor:OrthogonalityMonitor",
    "jacobian": "lightning_ortho.callbacks.jacobian_monitor:JacobianDeterminantMonitor",
    "invertibility": "lightning_ortho.callbacks.invertibility_monitor:InvertibilityMonitor",
    "gradient_variance": "lightning_ortho.callbacks.gradient_variance:GradientVarianceMonitor",
}

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


def monitors_from_environment() -> list:
    """The ``pytorch_lightning.callbacks_factory`` entry point: the monitors named in ``LIGHTNING_ORTHO_MONITORS``
    (``[]`` when it is unset or empty), built with the settings of the other variables (see the module docstring).

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
        cls = environment_monitor_class(name)
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
    """``cls(**kwargs)`` where the constructor accepts the settings; a setting it refuses never breaks the Trainer
    (the switch promises that): ``every_n_steps`` below the monitor's ``min_every_n_steps`` is raised to it, and a
    setting the constructor still refuses is dropped for the monitor's default; each with a warning naming the
    variable and the value used instead."""
    owner = f"{cls.__name__} ({cls.monitor_name!r})"
    low = getattr(cls, "min_every_n_steps", 1)
    if kwargs.get("every_n_steps", low) < low:
        warnings.warn(
            f"lightning-ortho: {EVERY_N_STEPS_VARIABLE}={kwargs['every_n_steps']}, but {owner} needs every_n_steps "
            f">= {low}; it uses every_n_steps={low}.",
            stacklevel=3,
        )
        kwargs = {**kwargs, "every_n_steps": low}
    try:
        return cls(**kwargs)
    except ValueError as error:
        defaults = inspect.signature(cls.__init__).parameters
        used = ", ".join(f"{key}={defaults[key].default!r}" for key in kwargs)
        warnings.warn(
            f"lightning-ortho: {owner} refuses {', '.join(f'{_VARIABLES[k]}={v!r}' for k, v in kwargs.items())} "
            f"({error}); it uses its defaults instead: {used}.",
            stacklevel=3,
        )
        return cls()


# ------------------------------------------------------------------------------------ monitors from the environment
class EnvironmentMonitor:
    """Mixin put in front of a monitor class by :func:`environment_monitor_class` (see the module docstring): at
    ``setup`` (every stage) it stands aside for a user-constructed monitor of the same class, and turns a
    ``ValueError`` of the monitor's setup (nothing to measure) into one warning; while stood aside every ``on_*`` hook
    does nothing."""

    #: The name in :data:`MONITORS` this class was made for.
    monitor_name: str
    #: The monitor class this one extends.
    monitor_base: type
    _environment_idle = False
    #: A fit too short to measure is said at info level (see the module docstring).
    short_fit_is_info = True

    @property
    def state_key(self) -> str:
        return self._generate_state_key(source="environment")

    @property
    def idle(self) -> bool:
        """True while this monitor stands aside for this fit (nothing to measure, or a user's monitor instead)."""
        return self._environment_idle

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._environment_idle = False
        name = self.monitor_base.__name__
        if any(
            isinstance(other, self.monitor_base) and not isinstance(other, EnvironmentMonitor)
            for other in trainer.callbacks
        ):
            self._environment_idle = True
            rank_zero_info(
                f"lightning-ortho: the Trainer already has a {name}; the one from {MONITORS_VARIABLE} stands aside."
            )
            return None
        try:
            return super().setup(trainer, pl_module, stage)
        except ValueError as error:
            self._environment_idle = True
            rank_zero_warn(
                f"lightning-ortho: {MONITORS_VARIABLE} turned on {name} ({self.monitor_name!r}), but it cannot run on "
                f"{type(pl_module).__name__}: {error} It does nothing in this run; remove {self.monitor_name!r} from "
                f"{MONITORS_VARIABLE} to silence this."
            )
            return None

    def __reduce__(self):  # noqa: ANN204
        # A class made at run time pickles by its monitor name; the watched modules and hook handles of the last fit
        # are the model's, not the callback's (a parametrized module cannot even be pickled): setup finds them again.
        state = {**self.__dict__, "_watched": {}, "_hooks": [], "_probe_hooks": {}}
        return _new_environment_monitor, (self.monitor_name,), state


def _gated(hook: str):  # noqa: ANN202
    def method(self, *args: Any, **kwargs: Any) -> Any:
        if self._environment_idle:
            return None
        return getattr(super(EnvironmentMonitor, self), hook)(*args, **kwargs)

    method.__name__ = method.__qualname__ = hook
    return method


for _hook in [name for name in vars(pl.Callback) if name.startswith("on_") and callable(getattr(pl.Callback, name))]:
    setattr(EnvironmentMonitor, _hook, _gated(_hook))

_ENVIRONMENT_CLASSES: dict[str, type] = {}


def environment_monitor_class(name: str) -> type:
    """The class of the monitors ``name`` created from the environment: :class:`EnvironmentMonitor` in front of
    :func:`monitor_class` ``(name)``, with the same name and constructor (made once per name)."""
    if name not in _ENVIRONMENT_CLASSES:
        base = monitor_class(name)
        namespace = {
            "monitor_name": name,
            "monitor_base": base,
            "__module__": __name__,
            "__qualname__": base.__qualname__,
        }
        _ENVIRONMENT_CLASSES[name] = type(base.__name__, (EnvironmentMonitor, base), namespace)
    return _ENVIRONMENT_CLASSES[name]


def _new_environment_monitor(name: str) -> EnvironmentMonitor:
    cls = environment_monitor_class(name)
    return cls.__new__(cls)
