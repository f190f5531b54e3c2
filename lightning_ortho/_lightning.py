"""The Lightning package lightning-ortho builds on: ``lightning.pytorch`` (``import lightning as L``) or
``pytorch_lightning``.

The two are the same framework shipped twice, under two names whose classes are distinct: a ``lightning.Trainer``
refuses a ``pytorch_lightning.LightningModule`` and the reverse. lightning-ortho works with either:

* **Callbacks** (the monitors, TransformCompression, the Glow callbacks) derive from the ``Callback`` of every
  Lightning package installed, so the same class is a callback for either Trainer, whatever was imported first: in
  code, in a ``LightningCLI`` YAML (``class_path: lightning_ortho.callbacks.OrthogonalityMonitor``) and through the
  environment switch (the factory is registered under both packages' ``callbacks_factory`` entry-point groups).
* **LightningModules and data modules** derive from one package, chosen once per process when lightning-ortho's
  Lightning code is first imported: the one named by ``LIGHTNING_ORTHO_LIGHTNING`` (``lightning`` or
  ``pytorch_lightning``) when set; else the one the program has already imported (``lightning`` if it imported
  both); else ``lightning`` where it is installed (lightning-ortho depends on ``pytorch_lightning`` only, so an
  installed ``lightning`` is the user's choice), else ``pytorch_lightning``. A program that imports its Lightning
  before lightning-ortho gets modules for its Trainer without doing anything; the variable settles a
  ``pytorch_lightning`` program that imports lightning-ortho first where ``lightning`` is installed too.

Everything in lightning-ortho that touches Lightning imports it from here, never by name: :data:`pl` is the chosen
package (``pl.Trainer``, ``pl.LightningModule``, ``pl.callbacks``, ``pl.cli``, ...).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lightning_ortho._lightning_choice import (
    PACKAGE_VARIABLE,
    PACKAGES,
    LightningChoiceError,
    _installed,
    choose_package,
)

PACKAGE: str = choose_package()
pl: ModuleType = importlib.import_module(PACKAGES[PACKAGE][0])
fabric: ModuleType = importlib.import_module(PACKAGES[PACKAGE][1])


def every_package(path: str) -> tuple[type, ...]:
    """The class at ``path`` (``"callbacks.RichProgressBar"``) in every installed Lightning package, the chosen one
    first: for ``isinstance`` checks that hold whichever Trainer runs a callback, and for bases of callbacks."""
    module_path, _, name = f".{path}".rpartition(".")
    found = []
    for package in sorted(PACKAGES, key=lambda p: p != PACKAGE):
        if _installed(package):
            found.append(getattr(importlib.import_module(PACKAGES[package][0] + module_path), name))
    return tuple(found)


def _callback_base() -> type:
    """``pl.Callback``, joined by the other installed package's ``Callback`` so that one class serves both
    Trainers. Their hooks are the same no-ops and the Trainers find a callback's hooks by name, so the order only
    decides whose (identical) defaults a subclass inherits."""
    bases = every_package("callbacks.Callback")
    if len(bases) == 1:
        return bases[0]
    return type("Callback", bases, {"__module__": __name__, "__doc__": _callback_base.__doc__})


#: Base class of every lightning-ortho callback: a ``Callback`` of each installed Lightning package.
Callback: type = _callback_base()

rank_zero_only = pl.utilities.rank_zero_only
rank_zero_info = pl.utilities.rank_zero_info
rank_zero_warn = pl.utilities.rank_zero_warn
MisconfigurationException = pl.utilities.exceptions.MisconfigurationException

__all__ = [
    "PACKAGE",
    "PACKAGES",
    "PACKAGE_VARIABLE",
    "Callback",
    "LightningChoiceError",
    "MisconfigurationException",
    "choose_package",
    "every_package",
    "fabric",
    "pl",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]
