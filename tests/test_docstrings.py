"""The API reference reads right: every public object's docstring parses as Google style the way mkdocstrings reads
it (griffe, the parser behind the site's API pages).

For each name in the ``__all__`` of the public packages, its own public members included (what the reference
renders), the docstring is parsed as Google style and these are reported:

* an ``Args:`` entry whose name is not a parameter of the signature (``a, b: ...`` is read as one parameter called
  ``a, b``; mkdocs.yml's ``warn_unknown_params`` fails the build on the same thing);
* a parameter of the signature missing from an ``Args:`` section that exists;
* an entry of ``Args:``, ``Raises:`` or ``Returns:`` that did not parse (no ``name: description`` pair, an exception
  that is not a class name, confusing indentation), and a section title the parser skipped (no blank line above it);
* ``Return:``/``Raise:``/``Arg:``-like titles that render as admonitions instead of sections.

Run ``python tests/test_docstrings.py`` to print every finding.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import sys
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="griffe comes with the docs extra (mkdocstrings)")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nn", "flows", "online", "transforms", "models", "callbacks", "datamodules")
#: Signature parameters an ``Args:`` section need not list.
UNDOCUMENTED = {"self", "cls"}
#: Admonition titles that were meant as a section (singular forms, typos of the Google section names).
NEAR_SECTIONS = {"arg", "argument", "param", "parameter", "return", "raise", "exception", "yield", "note that"}
#: Findings in files whose code is being changed elsewhere, to fix there (remove the entry with the fix).
PENDING: set[str] = set()
#: An exception's name: a dotted path whose last part is a class name (capitalised: ``as`` is not one).
EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")
#: A second exception named inside a ``Raises:`` entry (``A: ... . B: ...``): one entry per exception.
SECOND_EXCEPTION = re.compile(r"[.;]\s+[A-Z]\w*(Error|Exception|Warning):\s")
#: A second parameter inside an ``Args:`` entry (``x: ... ; y: ...``): one entry per parameter.
SECOND_NAME = re.compile(r"(?:^|[.;]\s+)(\*{0,2}\w+):\s")
#: A section title that the parser did not read as one (``Raises (on the first batch):``, ``Args: as ...``).
LOOSE_TITLE = re.compile(
    r"^\s*(Args|Arguments|Parameters|Raises|Returns|Yields|Warns|Attributes|Examples?)(\s*\([^)]*\))?:(\s|$)"
)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.WARNING or "Possible section skipped" in message:
            self.messages.append(message)


def _public_objects() -> list[tuple[str, object]]:
    """(name shown, griffe object) for every package, every ``__all__`` name and each one's own public members."""
    package = griffe.load("lightning_ortho", search_paths=[str(ROOT)], resolve_aliases=False)
    found: list[tuple[str, object]] = []
    seen: set[str] = set()

    def visit(label: str, obj) -> None:
        if obj.is_alias:
            try:
                obj = obj.final_target
            except Exception:  # an alias griffe cannot follow: the reference shows it as a plain entry
                return
        if obj.path in seen:
            return
        seen.add(obj.path)
        found.append((label, obj))
        if obj.is_class:
            for name, member in obj.members.items():
                if member.is_alias or (name.startswith("_") and not name == "__call__"):
                    continue
                visit(f"{label}.{name}", member)

    for short in PACKAGES:
        module_name = f"lightning_ortho.{short}"
        module = importlib.import_module(module_name)
        found.append((module_name, package[short]))
        for name in module.__all__:
            home = getattr(getattr(module, name), "__module__", None)
            candidates = [f"{home}.{name}"] if isinstance(home, str) and home.startswith("lightning_ortho") else []
            for path in [*candidates, f"{module_name}.{name}"]:
                try:
                    visit(f"{module_name}.{name}", package[path.removeprefix("lightning_ortho.")])
                    break
                except KeyError:
                    continue
    return found


def _parameter_names(obj) -> list[str] | None:
    try:
        parameters = obj.parameters
    except (AttributeError, KeyError):
        return None
    return [p.name for p in parameters]


@functools.cache
def findings() -> tuple[str, ...]:
    """Every problem found, one line each: ``name: problem``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    collect = _Collect()
    logger = logging.getLogger("griffe")
    previous = logger.level
    logger.addHandler(collect)
    logger.setLevel(logging.DEBUG)
    problems: list[str] = []
    try:
        for label, obj in _public_objects():
            if obj.docstring is None:
                continue
            collect.messages.clear()
            sections = obj.docstring.parse("google", warn_unknown_params=True, warn_missing_types=False, warnings=True)
            problems.extend(f"{label}: {message.split(': ', 1)[-1]}" for message in collect.messages)
            names = _parameter_names(obj)
            for section in sections:
                kind = section.kind.value
                if kind == "text":
                    for line in section.value.splitlines():
                        if LOOSE_TITLE.match(line):
                            problems.append(f"{label}: section title read as prose: {line.strip()[:60]!r}")
                if kind == "parameters":
                    for parameter in section.value:
                        for match in SECOND_NAME.finditer(parameter.description):
                            if names and match.group(1).lstrip("*") in {n.lstrip("*") for n in names}:
                                problems.append(
                                    f"{label}: Args: {match.group(1)!r} is described inside {parameter.name!r}"
                                )
                if kind == "attributes" and obj.is_class:
                    members = set(obj.all_members)
                    for attribute in section.value:
                        if attribute.name not in members:
                            problems.append(f"{label}: Attributes: {attribute.name!r} is not an attribute")
                        for match in SECOND_NAME.finditer(attribute.description):
                            if match.group(1) in members and match.group(1) != attribute.name:
                                problems.append(
                                    f"{label}: Attributes: {match.group(1)!r} is described inside {attribute.name!r}"
                                )
                if kind == "parameters" and names is not None:
                    documented = {p.name.lstrip("*") for p in section.value}
                    missing = [
                        n
                        for n in names
                        if n not in UNDOCUMENTED and n.lstrip("*") not in documented and not n.startswith("*")
                    ]
                    if missing:
                        problems.append(f"{label}: Args: lacks {', '.join(missing)}")
                elif kind == "raises":
                    for raised in section.value:
                        if not EXCEPTION.match(str(raised.annotation).strip()):
                            problems.append(f"{label}: Raises: {str(raised.annotation)!r} is not an exception name")
                        if SECOND_EXCEPTION.search(raised.description):
                            problems.append(f"{label}: Raises: a second exception inside {str(raised.annotation)!r}")
                elif kind in ("returns", "yields"):
                    if len(section.value) > 1:
                        problems.append(
                            f"{label}: {kind.title()}: read as {len(section.value)} values (indent the continuation"
                            " lines of one value)"
                        )
                    for returned in section.value:
                        if returned.name:
                            problems.append(
                                f"{label}: {kind.title()}: read as a value named {returned.name!r} (a word and a"
                                " colon start the entry)"
                            )
                elif kind == "admonition":
                    title = (section.value.kind or "").replace("-", " ").lower()
                    if title.rstrip("s") in NEAR_SECTIONS or title in NEAR_SECTIONS:
                        problems.append(f"{label}: '{section.title}:' renders as an admonition, not a section")
    finally:
        logger.removeHandler(collect)
        logger.setLevel(previous)
    return tuple(problems)


def test_every_public_docstring_parses_as_google_style():
    problems = [problem for problem in findings() if problem not in PENDING]
    assert not problems, "docstrings that the API reference misreads:\n" + "\n".join(problems)


def test_pending_findings_are_still_there():
    """An entry of ``PENDING`` that no longer shows up was fixed: remove it, so the test guards that line too."""
    assert not PENDING - set(findings())


if __name__ == "__main__":
    lines = findings()
    print("\n".join(lines))
    print(f"{len(lines)} findings", file=sys.stderr)
