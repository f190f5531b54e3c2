"""Which Lightning package lightning-ortho builds on, decided without importing either: the rule that
:mod:`lightning_ortho._lightning` applies once per process (see its docstring), kept apart so that the command can
report a bad ``LIGHTNING_ORTHO_LIGHTNING`` in one line before any Lightning code is imported."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping

#: Environment variable that forces the package: ``lightning`` or ``pytorch_lightning``.
PACKAGE_VARIABLE = "LIGHTNING_ORTHO_LIGHTNING"

#: Distribution name -> (its trainer package, its fabric package).
PACKAGES: dict[str, tuple[str, str]] = {
    "lightning": ("lightning.pytorch", "lightning.fabric"),
    "pytorch_lightning": ("pytorch_lightning", "lightning_fabric"),
}
_ALIASES = {"lightning.pytorch": "lightning", "pytorch-lightning": "pytorch_lightning", "pl": "pytorch_lightning"}


class LightningChoiceError(ImportError, ValueError):
    """``LIGHTNING_ORTHO_LIGHTNING`` names no Lightning package, or one that is not installed, or none is installed
    (an ImportError, and a ValueError for a bad value)."""


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
        LightningChoiceError: ``LIGHTNING_ORTHO_LIGHTNING`` names neither package, or the package it names (or any
            Lightning package) is not installed.
    """
    environ = os.environ if environ is None else environ
    imported = sys.modules if imported is None else imported
    installed = [name for name in PACKAGES if _installed(name)] if installed is None else list(installed)
    raw = environ.get(PACKAGE_VARIABLE, "").strip()
    if raw:
        name = _ALIASES.get(raw.lower(), raw.lower())
        if name not in PACKAGES:
            raise LightningChoiceError(f"{PACKAGE_VARIABLE}={raw!r}: use 'lightning' or 'pytorch_lightning'.")
        if name not in installed:
            raise LightningChoiceError(f"{PACKAGE_VARIABLE}={raw!r} but {name} is not installed: pip install {name}.")
        return name
    already = [name for name, (trainer_package, _) in PACKAGES.items() if trainer_package in imported]
    if already:
        return already[0]
    for name in PACKAGES:  # lightning first: installed beside our pytorch_lightning, it is the user's choice
        if name in installed:
            return name
    raise LightningChoiceError("lightning-ortho needs PyTorch Lightning: pip install pytorch-lightning (or lightning).")
