"""Deprecated names kept for one release: a module ``__getattr__`` that resolves an old name to the new object with a
``FutureWarning``. Pure Python, below every package."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def renamed_attributes(module: str, renamed: dict[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` that answers each old name of ``renamed`` (old name -> (new name, the
    object)) with the object and a ``FutureWarning`` naming the new name; any other name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in renamed:
            new_name, value = renamed[name]
            warnings.warn(
                f"{module}.{name} is deprecated and will be removed in the next release; use {module}.{new_name}.",
                FutureWarning,
                stacklevel=2,
            )
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def moved_attributes(package: str, moved: dict[str, str]) -> Callable[[str], Any]:
    """A package ``__getattr__`` for names that left the package's ``__all__`` (name -> the module that defines it):
    each is imported from its module and returned, with a ``FutureWarning`` (for one release) saying where to import
    it from; any other name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in moved:
            warnings.warn(
                f"{package}.{name} is internal and no longer exported by {package}; import it from {moved[name]} "
                "(the package-level name will be removed in the next release).",
                FutureWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(moved[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
