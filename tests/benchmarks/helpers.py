"""Shared by the tests of benchmarks/: the repository root, the benchmark modules (imported as the package
``benchmarks``, as ``python -m benchmarks.NAME`` runs them) and the committed results pages."""

import importlib
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
RESULTS_PAGES = ROOT / "docs" / "results"


def load(name: str) -> ModuleType:
    """``benchmarks.NAME``."""
    return importlib.import_module(f"benchmarks.{name}")


def results_section(name: str) -> str:
    """The body between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` on the one results page
    (``docs/results/*.md``) that holds benchmark ``name``'s section; fails unless exactly one page has it."""
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->\n(.*?)<!-- {re.escape(name)}:end -->", re.S)
    found = [m.group(1) for page in sorted(RESULTS_PAGES.glob("*.md")) for m in pattern.finditer(page.read_text())]
    assert len(found) == 1, f"{len(found)} sections of {name} in docs/results/*.md (expected one)"
    return found[0]
