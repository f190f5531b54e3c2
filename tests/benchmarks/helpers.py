"""Shared by the tests of benchmarks/: the repository root and the benchmark modules (imported as the package
``benchmarks``, as ``python -m benchmarks.NAME`` runs them)."""

import importlib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """``benchmarks.NAME``."""
    return importlib.import_module(f"benchmarks.{name}")
