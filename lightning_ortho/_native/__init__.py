"""Small C kernels, compiled with the machine's C compiler on first use and loaded with :mod:`ctypes`.

Some of the library's hot paths at small sizes are a GEMM plus a handful of row-wise passes; in eager PyTorch each
pass is a kernel launch, which at ``d = 64`` costs more than the arithmetic. The row passes are
written once in C (the ``.c`` files beside this module) and compiled in well under a second with ``-O3`` (portable
code: no ``-march``, no fast-math, no contraction of a multiply and an add, so results are IEEE). On x86-64 Linux
each kernel is built twice, for AVX2 and for the baseline, and the CPU's clone is chosen at load (``vector_clones.h``).
The GEMMs stay with PyTorch's BLAS.

**Where a kernel runs.** A kernel touches memory through ``data_ptr()``, which no tracer or transform sees, so each
getter of the bindings (``row_kernels``, ``uoro_tanh_kernels``, ``uoro_gradient_kernel``,
``linear_readout_kernel``) takes every tensor the kernel will read and answers ``None`` unless :func:`real_cpu`
holds for all of them: plain CPU tensors with real memory, outside ``torch.compile``, ``torch.export``,
``make_fx``, ``torch.func`` transforms, ``torch.jit.trace``, ``fx.symbolic_trace`` and dispatch modes such as
``FakeTensorMode`` (:mod:`~lightning_ortho._native.guard`); the getters whose callers compute the kernel's inputs
with PyTorch products also decline under CPU autocast. The callers then run their PyTorch ops, which compute the
same expression and which a tracer records.

**The cache.** The shared library is cached per source, compiler and platform under
``$LIGHTNING_ORTHO_CACHE_DIR`` (default ``$XDG_CACHE_HOME/lightning_ortho``, else ``~/.cache/lightning_ortho``; a
relative path is taken from the working directory at the time of the call and made absolute). Beside each
``<name>-<key>.so`` a record ``<name>-<key>.so.json`` holds its size and SHA-256. Both are written atomically (a
private temporary file renamed over the target), so concurrent processes (DDP, test workers) may build at once.
A library is used only when its bytes match its record; a missing or garbled record, or a library truncated or
changed since (a full disk, a killed copy, another tool), makes :func:`load` rebuild it.

**Loading.** ``dlopen`` maps the file: if another process truncated a mapped library, the next access to a lost
page would kill this one with ``SIGBUS``, and no check done before the mapping could prevent it. So the validated
bytes, already in memory, are written to a private ``mkstemp`` file (a name no other process knows), its hash is
checked again, it is loaded by its absolute path and unlinked at once (the mapping keeps an unlinked file alive).
The private copy goes into the cache folder, else the temporary folder.

**The extension.** ``fastcall.c`` is a CPython extension module (:func:`load_extension`: built and cached the same
way, with Python's headers, and imported from a private copy): the common case of the one-stream calls, the Python
checks and the kernel call of :class:`~lightning_ortho._native.tanh_cell.TanhCellForward` and
:class:`~lightning_ortho._native.factored_traces.FactoredTanhTrace` in C (:mod:`lightning_ortho._native.fastcall`).
Without ``Python.h`` it is not built, silently: the Python path does the same.

Where no C compiler is found, or the build or the load fails, :func:`load` warns once
(:class:`NativeKernelsUnavailableWarning`) and returns ``None``; callers then use their PyTorch implementation,
which computes the same expression.

**The one switch.** ``LIGHTNING_ORTHO_NATIVE=0`` (also ``false``, ``no``, ``off``) turns every kernel off without a
warning, and :func:`native_kernels` does the same from Python (``native_kernels(False)``, for the whole process, or
``with native_kernels(False): ...`` for a block), overriding the variable while it is set. Every kernel getter
asks :func:`load`, which asks :func:`enabled`: there is no other switch.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import types
import warnings
from pathlib import Path

from lightning_ortho._native.guard import real_cpu

__all__ = [
    "NativeKernelsUnavailableWarning",
    "cache_dir",
    "compiler",
    "enabled",
    "load",
    "load_extension",
    "native_kernels",
    "real_cpu",
]

#: Compiler flags: optimised, portable (no ``-march=native``: the cache may be shared between machines; the AVX2
#: clones of ``vector_clones.h`` are chosen per CPU at load), IEEE semantics (no ``-ffast-math``, and
#: ``-ffp-contract=off``: clang would otherwise fuse ``a * b + c`` into an FMA where the CPU has one);
#: ``-fopenmp-simd`` only honours the ``omp simd`` pragmas (no OpenMP runtime).
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fopenmp-simd", "-ffp-contract=off")
#: Linked after the source: the C math library (tanh, sqrt).
LIBRARIES = ("-lm",)
#: Appended to a cached library's name for the record of its size and SHA-256.
STAMP_SUFFIX = ".json"


class NativeKernelsUnavailableWarning(UserWarning):
    """The C kernels could not be built or loaded; the PyTorch implementation (slower at small sizes) is used."""


#: The setting of :func:`native_kernels` (``None``: the environment variable decides).
_switch: bool | None = None
_OFF = frozenset({"0", "false", "no", "off"})


def enabled() -> bool:
    """Whether the C kernels may run: the setting of :func:`native_kernels` where one is in force, else false
    when ``LIGHTNING_ORTHO_NATIVE`` is ``0``, ``false``, ``no`` or ``off`` (read once per process, and again after
    ``load.cache_clear()``)."""
    if _switch is not None:
        return _switch
    return _environment_enabled()


@functools.cache
def _environment_enabled() -> bool:
    """``LIGHTNING_ORTHO_NATIVE`` read once (a lookup in ``os.environ`` costs microseconds at every kernel call);
    ``load.cache_clear()`` reads it again."""
    return os.environ.get("LIGHTNING_ORTHO_NATIVE", "1").strip().lower() not in _OFF


class native_kernels:  # noqa: N801 - a function to the user, like torch.set_grad_enabled
    """Turn the C kernels on or off for the whole process: ``native_kernels(False)``; or for a block, given back
    on exit (nested blocks restore in order)::

        with native_kernels(False):
            ...  # PyTorch ops only: the same results to rounding

    It overrides ``LIGHTNING_ORTHO_NATIVE`` while in force; ``native_kernels(None)`` gives the decision back to the
    variable. Process-wide (not per thread). The one switch of every kernel (:func:`enabled`).

    Raises:
        TypeError: ``enabled`` is not a bool or ``None``.
    """

    def __init__(self, enabled: bool | None) -> None:
        global _switch
        if enabled is not None and not isinstance(enabled, bool):
            raise TypeError(f"native_kernels: enabled must be True, False or None, got {enabled!r}.")
        self._previous, _switch = _switch, enabled

    def __enter__(self) -> native_kernels:
        return self

    def __exit__(self, *exc: object) -> None:
        global _switch
        _switch = self._previous


def cache_dir() -> Path:
    """Where built libraries are kept, as an absolute path: ``$LIGHTNING_ORTHO_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/lightning_ortho``, else ``~/.cache/lightning_ortho`` (``~`` expanded; a relative path is
    taken from the current working directory)."""
    if configured := os.environ.get("LIGHTNING_ORTHO_CACHE_DIR"):
        folder = Path(configured)
    else:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning_ortho"
    return folder.expanduser().absolute()


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


def _key(source: Path, command: list[str], extra: tuple[str, ...] = ()) -> str:
    """What the library depends on, hashed: the source, the headers it may include, the command (with ``extra``
    flags) and the platform."""
    headers = [path.read_bytes() for path in sorted(source.parent.glob("*.h"))]  # what the sources may include
    return hashlib.sha256(
        b"\0".join(
            [
                source.read_bytes(),
                *headers,
                " ".join(command + list(FLAGS) + list(extra) + list(LIBRARIES)).encode(),
                platform.platform().encode(),
                sys.implementation.cache_tag.encode(),
            ]
        )
    ).hexdigest()[:16]


def _stamp(data: bytes) -> dict:
    """The record kept beside a library: its size and SHA-256."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _replace_atomically(data: bytes, target: Path, mode: int) -> None:
    """Write ``data`` to a private file beside ``target`` and rename it over ``target``: readers see the old file or
    the new one, never a part."""
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.chmod(partial, mode)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _cached(target: Path) -> bytes | None:
    """The bytes of the cached library ``target`` when they match its record (``<target>.json``), else ``None``
    (no library, no record, a garbled record, or a library truncated or changed since it was built)."""
    try:
        record = json.loads(target.with_name(target.name + STAMP_SUFFIX).read_text())
        data = target.read_bytes()
    except (OSError, ValueError):
        return None
    return data if isinstance(record, dict) and record == _stamp(data) else None


def _build(source: Path, command: list[str], extra: tuple[str, ...] = ()) -> bytes:
    """The library built from ``source`` (``extra``: flags after :data:`FLAGS`): from the cache when the bytes there
    match their record, else compiled anew and cached (library and record, each replaced atomically). Returns its
    bytes, which the caller loads from a private copy (:func:`_load_private_copy`); raises ``OSError`` or
    ``subprocess.SubprocessError`` on failure."""
    target = cache_dir() / f"{source.stem}-{_key(source, command, extra)}.so"
    data = _cached(target)
    if data is not None:
        return data
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled beside the target: another process may be building (or rebuilding) the same library right now.
    handle, partial = tempfile.mkstemp(suffix=".so", prefix=f".{source.stem}-", dir=target.parent)
    os.close(handle)
    try:
        result = subprocess.run(
            [*command, *FLAGS, *extra, "-o", partial, str(source), *LIBRARIES],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise OSError(f"{' '.join(command)} exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
        data = Path(partial).read_bytes()
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    # The library first, then its record: a reader in between sees a mismatch and rebuilds, never a wrong load.
    _replace_atomically(data, target, 0o755)
    _replace_atomically(json.dumps(_stamp(data)).encode(), target.with_name(target.name + STAMP_SUFFIX), 0o644)
    return data


def _load_private_copy(data: bytes, name: str, opener=ctypes.CDLL):
    """``dlopen`` a private copy of the library ``data`` (``opener(path)``: ``ctypes.CDLL``, or the import of an
    extension module): written to a fresh ``mkstemp`` file (in the cache folder, else the temporary folder), checked
    against ``data``'s hash once written, loaded by its absolute path and unlinked at once (the mapping keeps it
    alive). No other process knows its name, so none can truncate it under the mapping."""
    expected, problems = _stamp(data), []
    for folder in (cache_dir(), Path(tempfile.gettempdir()).absolute()):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, path = tempfile.mkstemp(suffix=".so", prefix=f".{name}-load-", dir=folder)
        except OSError as error:
            problems.append(str(error))
            continue
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            if _stamp(Path(path).read_bytes()) != expected:
                raise OSError(f"the private copy {path} does not hold the bytes written to it")
            return opener(path)
        except (OSError, ImportError) as error:
            problems.append(str(error))
        finally:
            with contextlib.suppress(OSError):  # unlinked while mapped: Linux and macOS keep the mapping
                os.unlink(path)
    raise OSError("; ".join(problems))


def load(name: str) -> ctypes.CDLL | None:
    """The shared library built from ``<name>.c`` beside this module, or ``None`` (after one warning) where it cannot
    be built or loaded, or ``None`` silently when the kernels are turned off (:func:`enabled`: ``native_kernels`` or
    ``LIGHTNING_ORTHO_NATIVE=0``). The cached library is used only when its bytes match its record (else it is
    rebuilt), and what is mapped is a private copy of those bytes (see the module docstring).

    Cached per process; ``load.cache_clear()`` makes the next call look again (tests use it)."""
    if _switch is False or (_switch is None and not _environment_enabled()):  # enabled(), one call fewer
        return None
    return _library(name)


@functools.cache
def _library(name: str) -> ctypes.CDLL | None:
    """:func:`load` once the kernels are on: built or taken from the cache, loaded; ``None`` after one warning."""
    command = compiler()
    problem = None
    if command is None:
        problem = "no C compiler was found (set CC to one)"
    else:
        try:
            return _load_private_copy(_build(Path(__file__).with_name(f"{name}.c"), command), name)
        except (OSError, subprocess.SubprocessError) as error:
            problem = f"building or loading it failed: {error}"
    warnings.warn(
        f"lightning_ortho: the C kernels '{name}' are not available ({problem}); using the PyTorch implementation, "
        "which gives the same results and is slower at small sizes. Set LIGHTNING_ORTHO_NATIVE=0 to silence this.",
        NativeKernelsUnavailableWarning,
        stacklevel=4,
    )
    return None


def load_extension(name: str) -> types.ModuleType | None:
    """The CPython extension module built from ``<name>.c`` beside this module (its ``PyInit_<name>``), cached and
    loaded as :func:`load` does its libraries; ``None`` when the kernels are off (:func:`enabled`), and ``None``
    without a warning where it cannot be built or imported (no C compiler, no ``Python.h``, a failed build): what it
    speeds up then runs its Python code, which does the same. Cached per process (``load.cache_clear()`` too)."""
    if _switch is False or (_switch is None and not _environment_enabled()):
        return None
    return _extension(name)


@functools.cache
def _extension(name: str) -> types.ModuleType | None:
    command, include = compiler(), sysconfig.get_paths().get("include")
    if command is None or not include or not Path(include, "Python.h").is_file():
        return None
    # An extension's CPython symbols come from the interpreter that imports it (macOS must be told so).
    extra = (f"-I{include}", *(("-undefined", "dynamic_lookup") if sys.platform == "darwin" else ()))

    def import_module(path: str) -> types.ModuleType:
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

    try:
        return _load_private_copy(_build(Path(__file__).with_name(f"{name}.c"), command, extra), name, import_module)
    except (OSError, subprocess.SubprocessError, ImportError):
        return None


def _clear_caches() -> None:
    """Forget the loaded libraries and extensions and the reading of ``LIGHTNING_ORTHO_NATIVE`` (tests change
    them)."""
    _library.cache_clear()
    _extension.cache_clear()
    _environment_enabled.cache_clear()


load.cache_clear = _clear_caches  # type: ignore[attr-defined]
