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
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from types import ModuleType

#: Environment variable that forces the package: ``lightning`` or ``pytorch_lightning``.
PACKAGE_VARIABLE = "LIGHTNING_ORTHO_LIGHTNING"

#: Distribution name -> (its trainer package, its fabric package).
PACKAGES: dict[str, tuple[str, str]] = {
    "lightning": ("lightning.pytorch", "lightning.fabric"),
    "pytorch_lightning": ("pytorch_lightning", "lightning_fabric"),
}
_ALIASES = {"lightning.pytorch": "lightning", "pytorch-lightning": "pytorch_lightning", "pl": "pytorch_lightning"}


def _installed(name: str) -> bool:
    top = PACKAGES[name][0].split(".")[0]
    return importlib.util.find_spec(top) is not None


def choose_package(
    environ: Mapping[str, str] | None = None,
    imported: Mapping[str, object] | None = None,
    installed: Iterable[str] | None = None,
) -> str:
    """The Lightning package to build on, ``"lightning"`` or ``"pytorch_lightning"``, by the rule in the module
    docstring (``environ``, ``imported`` and ``installed`` default to ``os.environ``, ``sys.modules`` and the
    packages Python can find).

    Raises:
        ValueError: ``LIGHTNING_ORTHO_LIGHTNING`` names neither package.
        ImportError: the package it names, or any Lightning package, is not installed.
    """
    environ = os.environ if environ is None else environ
    imported = sys.modules if imported is None else imported
    installed = [name for name in PACKAGES if _installed(name)] if installed is None else list(installed)
    raw = environ.get(PACKAGE_VARIABLE, "").strip()
    if raw:
        name = _ALIASES.get(raw.lower(), raw.lower())
        if name not in PACKAGES:
            raise ValueError(f"{PACKAGE_VARIABLE}={raw!r}: use 'lightning' or 'pytorch_lightning'.")
        if name not in installed:
            raise ImportError(f"{PACKAGE_VARIABLE}={raw!r} but {name} is not installed: pip install {name}.")
        return name
    already = [name for name, (trainer_package, _) in PACKAGES.items() if trainer_package in imported]
    if already:
        return already[0]
    for name in PACKAGES:  # lightning first: installed beside our pytorch_lightning, it is the user's choice
        if name in installed:
            return name
    raise ImportError("lightning-ortho needs PyTorch Lightning: pip install pytorch-lightning (or lightning).")


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
    "MisconfigurationException",
    "choose_package",
    "every_package",
    "fabric",
    "pl",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]
