"""Deprecations (the policy: docs/changelog.md). A public name or argument that changes keeps working for at least
one minor release and warns :class:`LightningOrthoDeprecationWarning`: module ``__getattr__`` that resolve old
names, and the category every shim warns with. Pure Python, below every package."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


class LightningOrthoDeprecationWarning(DeprecationWarning, FutureWarning):
    """What a deprecated name or argument of lightning_ortho warns. A ``DeprecationWarning``, so filters, ``-W
    error::DeprecationWarning`` and ``pytest.deprecated_call`` treat it as one, and a ``FutureWarning``, which it
    also is, for code that caught those before. Python hides ``DeprecationWarning`` outside ``__main__``; the
    filter below shows this category once per call site, as it shows a ``FutureWarning``, so that every user sees
    what to change before the name goes."""


# Only this package's category: every other warning keeps the filters the program set.
warnings.filterwarnings("default", category=LightningOrthoDeprecationWarning)


def warn_deprecated(message: str, stacklevel: int = 2) -> None:
    """Warn ``message`` as a :class:`LightningOrthoDeprecationWarning` (``stacklevel`` as ``warnings.warn``'s,
    counted from the caller of this function)."""
    warnings.warn(message, LightningOrthoDeprecationWarning, stacklevel=stacklevel + 1)


def renamed_attributes(module: str, renamed: dict[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` that answers each old name of ``renamed`` (old name -> (new name, the
    object)) with the object and a ``FutureWarning`` naming the new name; any other name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in renamed:
            new_name, value = renamed[name]
            warnings.warn(
                f"{module}.{name} is deprecated and will be removed in the next release; use {module}.{new_name}.",
                LightningOrthoDeprecationWarning,
                stacklevel=2,
            )
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def moved_attributes(package: str, moved: dict[str, str]) -> Callable[[str], Any]:
    """A package ``__getattr__`` for names that left the package's ``__all__`` (name -> the module that defines it):
    each is imported from its module and returned, with a :class:`LightningOrthoDeprecationWarning` (for one release) saying where to import
    it from; any other name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in moved:
            warnings.warn(
                f"{package}.{name} is internal and no longer exported by {package}; import it from {moved[name]} "
                "(the package-level name will be removed in the next release).",
                LightningOrthoDeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(moved[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def moved_module(old: str, new: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a module left at its old path ``old`` when its contents moved to ``new``: each name
    is taken from ``new`` (imported on first use), with a :class:`LightningOrthoDeprecationWarning` that names the
    new path; a name ``new`` lacks raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name)  # AttributeError for a name new lacks
        warn_deprecated(
            f"{old} moved to {new} and the old path will be removed in the next minor release; import {name} from {new}."
        )
        return value

    return __getattr__
