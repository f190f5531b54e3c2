"""Optional dependencies: what each extra of the ``lightning-ortho`` distribution installs, and the error that names
the extra where a missing one is first needed (pure Python; no Lightning).

The core install runs the library's main job (the layers, the estimators, the transforms' B and shear families,
the FCNN on scikit-learn's digits through the CLI). The extras:

* ``vision``: torchvision, for the MNIST and CIFAR-10 data modules and the Glow image grids.
* ``transforms``: networkx (the M-transform's perfect matchings) and Pillow (image patches from photographs or
  image files).
* ``plots``: matplotlib, for the monitors' PNG plots.
* ``docs``: the documentation tools. ``test``: everything the test suite needs. ``all``: every runtime extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

#: Top-level module -> (the distribution that provides it, the extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "torchvision": ("torchvision", "vision"),
    "networkx": ("networkx", "transforms"),
    "PIL": ("Pillow", "transforms"),
    "matplotlib": ("matplotlib", "plots"),
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def install_hint(module: str) -> str:
    """``pip install "lightning-ortho[<extra>]"`` for the extra that provides top-level ``module``."""
    return f'pip install "lightning-ortho[{EXTRAS[module.partition(".")[0]][1]}]"'


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (dotted names allowed; its top level must be in :data:`EXTRAS`) and return it.

    Args:
        module: e.g. ``"torchvision.datasets"``.
        purpose: what needs it, for the message (``"MNISTDataModule reads MNIST"``).

    Raises:
        MissingExtraError: the distribution is not installed (or is blocked); the message says which extra to
            install. Any other import error (a broken install) propagates unchanged.
    """
    top = module.partition(".")[0]
    distribution, extra = EXTRAS[top]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if not _missing(top):
            raise  # the package is there and lacks something else (a broken install): not ours to rename
        raise MissingExtraError(
            f"{purpose} with {distribution}, which is not installed. It comes with the {extra!r} extra: "
            f"{install_hint(top)} (or pip install {distribution})."
        ) from error


def _missing(top: str) -> bool:
    """Whether top-level module ``top`` cannot be imported at all (not installed, or blocked by ``None`` in
    ``sys.modules``)."""
    if top in sys.modules:
        return sys.modules[top] is None
    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):
        return True
