"""The public API against the last release, as griffe sees it (python .ci/check_api.py, make test-api).

griffe's breaking changes between the release (``BASELINE``, named by its commit so that a clone without tags has
it; the tag is ``v0.1.0``) and the working tree, kept to the public surface: what the packages' ``__all__`` exported
in the release, with the members of those classes and the parameters of those functions (dunder members other than
``__init__`` and ``__call__`` left out). Every such break must be listed in ``.ci/api_changes.txt`` (the changelog says
what replaced it), and every line there must still be a break: the check fails on a new break the list does not
name, and on a line that no longer matches one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "e00c53ec6043066afb9a1d77587e4a9894d2c205"  # v0.1.0
ACKNOWLEDGED = Path(__file__).with_name("api_changes.txt")
PACKAGES = ("", "nn", "flows", "flows.conv1x1", "online", "transforms", "callbacks", "models", "datamodules")
KEPT_DUNDERS = ("__init__", "__call__")


def exported_paths(package: griffe.Module) -> set[str]:
    """The defining paths of what the packages of ``package`` (the ``lightning_ortho`` module) export."""
    paths = set()
    for name in PACKAGES:
        module = package[name] if name else package
        exports = module.exports
        if exports is None and "_SUBMODULE" in module.members:  # callbacks: a lazy __all__ built from this table
            table = ast.literal_eval(str(module["_SUBMODULE"].value))
            paths |= {f"{module.path}.{where}.{export}" for export, where in table.items()}
            continue
        for export in exports or ():
            member = module[export]
            paths.add(member.target_path if member.is_alias else member.path)
    return paths


def public(path: str, surface: set[str]) -> bool:
    tail = path.rsplit(".", 1)[-1]
    if tail.startswith("__") and tail.endswith("__") and tail not in KEPT_DUNDERS:
        return False
    return any(path == root or path.startswith(root + ".") for root in surface)


def breaks() -> list[str]:
    """``"<path> | <kind>"`` of every public break since the release, sorted."""
    old = griffe.load_git("lightning_ortho", ref=BASELINE, repo=ROOT)
    new = griffe.load("lightning_ortho", search_paths=[str(ROOT)])
    surface = exported_paths(old)
    found = set()
    for breakage in griffe.find_breaking_changes(old, new):
        if public(breakage.obj.path, surface):
            found.add(f"{breakage.obj.path} | {breakage.kind.value}")
    return sorted(found)


def acknowledged() -> set[str]:
    lines = (line.strip() for line in ACKNOWLEDGED.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def has_baseline() -> bool:
    """Whether the release's commit is in this checkout's history (a shallow clone lacks it)."""
    command = ["git", "cat-file", "-e", f"{BASELINE}^{{commit}}"]
    return subprocess.run(command, cwd=ROOT, capture_output=True).returncode == 0


def main() -> int:
    if not has_baseline():
        # A shallow clone cannot be compared; say so loudly rather than fail a build that changed nothing.
        print(
            f"API check NOT RUN: commit {BASELINE[:7]} (v0.1.0) is not in this clone's history; run it in a full clone."
        )
        return 0
    found, listed = set(breaks()), acknowledged()
    new, stale = sorted(found - listed), sorted(listed - found)
    for line in new:
        print(f"break not in {ACKNOWLEDGED.name} (deprecate it, or list it with its changelog entry): {line}")
    for line in stale:
        print(f"{ACKNOWLEDGED.name} lists what is no longer a break: {line}")
    print(f"{len(found)} public breaks since v0.1.0 ({BASELINE[:7]}), {len(found & listed)} listed")
    return 1 if new or stale else 0


if __name__ == "__main__":
    sys.exit(main())
