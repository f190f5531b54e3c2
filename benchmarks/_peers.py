"""Peer libraries for side-by-side benchmarks, installed on first use into ``benchmarks/.peers`` (git-ignored).

A peer is never a dependency of lightning_ortho: it is installed only here, pinned, with
``pip install --no-deps --target benchmarks/.peers NAME==VERSION``, and imported only inside the benchmark that
compares against it. Where it cannot be installed or imported (no network, no wheel for this Python), the
benchmark records the reason instead of crashing.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

PEERS = Path(__file__).resolve().parent / ".peers"
#: Seconds that one ``pip install`` of a peer may take.
INSTALL_TIMEOUT = 300


def _installed(requirement: str, target: Path) -> bool:
    name, _, version = requirement.partition("==")
    return any(target.glob(f"{name.replace('-', '_')}-{version}.dist-info"))


def import_peer(module: str, requirement: str, target: Path = PEERS) -> tuple[ModuleType | None, str | None]:
    """``(module, None)`` for ``import module`` from ``target`` after installing the pinned ``requirement``
    (``"NAME==VERSION"``) there if that exact version is not there yet; ``(None, reason)`` where it could not be
    installed or imported. ``target`` goes first on ``sys.path``, so the pinned version wins over any other copy.
    """
    try:
        if not _installed(requirement, target):
            command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade"]
            command += ["--target", str(target), requirement]
            done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if done.returncode != 0:
                tail = " ".join((done.stderr or done.stdout).split())[-300:]
                return None, f"pip install {requirement} failed (exit {done.returncode}): {tail}"
        if str(target) not in sys.path:
            sys.path.insert(0, str(target))
        importlib.invalidate_caches()
        return importlib.import_module(module), None
    except subprocess.TimeoutExpired:
        return None, f"pip install {requirement} took more than {INSTALL_TIMEOUT} s"
    except Exception as error:  # any failure of a third-party import must not stop the benchmark
        return None, f"{requirement} could not be installed or imported: {type(error).__name__}: {error}"


#: The geotorch the orthogonal benchmarks compare with (bench_orthogonal, bench_orthogonal_weights).
GEOTORCH = "geotorch==0.4.0"


def load_geotorch() -> tuple[ModuleType | None, str | None]:
    """``(geotorch, None)``, installing the pinned :data:`GEOTORCH` into benchmarks/.peers on first use, or
    ``(None, reason)``."""
    return import_peer("geotorch", GEOTORCH)
