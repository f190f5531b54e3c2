"""Small C kernels, compiled with the machine's C compiler on first use and loaded with :mod:`ctypes`.

Some of the library's hot paths at small sizes are a GEMM plus a handful of row-wise passes; in eager PyTorch each
pass is a kernel launch, which at ``d = 64`` costs more than the arithmetic. The row passes are
written once in C (the ``.c`` files beside this module) and compiled in well under a second with ``-O3`` (portable
code: no ``-march``, no fast-math, no contraction of a multiply and an add, so results are IEEE). On x86-64 Linux
each kernel is built twice, for AVX2 and for the baseline, and the CPU's clone is chosen at load (``vector_clones.h``).
The GEMMs stay with PyTorch's BLAS.

The shared library is cached per source, compiler and platform under ``$LIGHTNING_ORTHO_CACHE_DIR`` (default
``~/.cache/lightning_ortho``) and written atomically, so concurrent processes (DDP, test workers) may build it at
once. Where no C compiler is found, or the build or the load fails, :func:`load` warns once
(:class:`NativeKernelsUnavailableWarning`) and returns ``None``; callers then use their PyTorch implementation,
which computes the same expression. ``LIGHTNING_ORTHO_NATIVE=0`` turns the kernels off without a warning.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

__all__ = ["NativeKernelsUnavailableWarning", "cache_dir", "compiler", "enabled", "load"]

#: Compiler flags: optimised, portable (no ``-march=native``: the cache may be shared between machines; the AVX2
#: clones of ``vector_clones.h`` are chosen per CPU at load), IEEE semantics (no ``-ffast-math``, and
#: ``-ffp-contract=off``: clang would otherwise fuse ``a * b + c`` into an FMA where the CPU has one);
#: ``-fopenmp-simd`` only honours the ``omp simd`` pragmas (no OpenMP runtime).
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fopenmp-simd", "-ffp-contract=off")
#: Linked after the source: the C math library (tanh, sqrt).
LIBRARIES = ("-lm",)


class NativeKernelsUnavailableWarning(UserWarning):
    """The C kernels could not be built or loaded; the PyTorch implementation (slower at small sizes) is used."""


def enabled() -> bool:
    """False when ``LIGHTNING_ORTHO_NATIVE`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get("LIGHTNING_ORTHO_NATIVE", "1").strip().lower() not in {"0", "false", "no", "off"}


def cache_dir() -> Path:
    """Where built libraries are kept: ``$LIGHTNING_ORTHO_CACHE_DIR``, else ``$XDG_CACHE_HOME/lightning_ortho``,
    else ``~/.cache/lightning_ortho``."""
    if configured := os.environ.get("LIGHTNING_ORTHO_CACHE_DIR"):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lightning_ortho"


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC``, else the one Python was built with, else ``cc``, ``gcc`` or ``clang``
    (whichever is on ``PATH`` first); ``None`` when there is none."""
    candidates = [os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"]
    for candidate in candidates:
        if not candidate:
            continue
        command = shlex.split(candidate)
        if command and shutil.which(command[0]):
            return command
    return None


def _build(source: Path, command: list[str]) -> Path:
    """Compile ``source`` into the cache (if not there yet) and return the library's path; raises ``OSError`` or
    ``subprocess.SubprocessError`` on failure."""
    text = source.read_bytes()
    headers = [path.read_bytes() for path in sorted(source.parent.glob("*.h"))]  # what the sources may include
    key = hashlib.sha256(
        b"\0".join(
            [
                text,
                *headers,
                " ".join(command + list(FLAGS) + list(LIBRARIES)).encode(),
                platform.platform().encode(),
                sys.implementation.cache_tag.encode(),
            ]
        )
    ).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: another process may be building the same library right now.
    handle, partial = tempfile.mkstemp(suffix=".so", prefix=f".{source.stem}-", dir=target.parent)
    os.close(handle)
    try:
        result = subprocess.run(
            [*command, *FLAGS, "-o", partial, str(source), *LIBRARIES],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise OSError(f"{' '.join(command)} exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The shared library built from ``<name>.c`` beside this module, or ``None`` (after one warning) where it cannot
    be built or loaded, or ``None`` silently when the kernels are turned off (``LIGHTNING_ORTHO_NATIVE=0``).

    Cached per process; ``load.cache_clear()`` makes the next call look again (tests use it)."""
    if not enabled():
        return None
    command = compiler()
    problem = None
    if command is None:
        problem = "no C compiler was found (set CC to one)"
    else:
        try:
            return ctypes.CDLL(str(_build(Path(__file__).with_name(f"{name}.c"), command)))
        except (OSError, subprocess.SubprocessError) as error:
            problem = f"building or loading it failed: {error}"
    warnings.warn(
        f"lightning_ortho: the C kernels '{name}' are not available ({problem}); using the PyTorch implementation, "
        "which gives the same results and is slower at small sizes. Set LIGHTNING_ORTHO_NATIVE=0 to silence this.",
        NativeKernelsUnavailableWarning,
        stacklevel=3,
    )
    return None
