"""What the code, tests, benchmarks, recipes and docs cite is in the repository: every ``NAME.md`` they name is one
of its files, and none points to notes kept outside it (restored-equation notes cited by their section number, a
sibling folder of the checkout), which whoever carries the project on could not follow. Papers are cited by
authors, year, section and equation; the math is in docs/. The patterns are assembled from parts, so that this file
does not itself read as such a citation."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("lightning_ortho", "tests", "benchmarks", "recipes", "docs")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".c", ".h", ".toml", ".cfg", ".txt"}
MARKDOWN_NAME = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]+\.md)\b")
_NOTES, _SIBLING = "spec", "shared"
OUTSIDE = re.compile(
    rf"\b{_NOTES}(?:ification)?\s*(?:§|section|sec\.|\d)|(?:\.\./)+{_SIBLING}\b"
    rf"|\b{_SIBLING}/(?:{_NOTES}|papers|design)",
    re.I,
)


def scanned_files(folders=SCANNED) -> list[Path]:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "Makefile"]
    for folder in folders:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    return [p for p in files if "__pycache__" not in p.parts]


def markdown_files() -> set[str]:
    found = set()
    for path in ROOT.rglob("*.md"):
        if ".venv" in path.parts or "site" in path.relative_to(ROOT).parts[:1]:
            continue
        relative = path.relative_to(ROOT)
        found |= {relative.as_posix(), path.name}
        if relative.parts[0] == "docs":  # docs pages link each other relative to docs/
            found.add(relative.relative_to("docs").as_posix())
    return found


def test_every_markdown_file_named_is_in_the_repository():
    """(tests/ aside: its tests write pages of their own into temporary projects)"""
    known = markdown_files()
    missing = []
    for path in scanned_files([folder for folder in SCANNED if folder != "tests"]):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for name in MARKDOWN_NAME.findall(line):
                if name.lstrip("./") not in known and Path(name).name not in known:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not missing, "names of files the repository does not hold:\n" + "\n".join(missing)


def test_nothing_cites_notes_outside_the_repository():
    found = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "citations of documents outside the repository:\n" + "\n".join(found)


def test_the_patterns_find_what_they_guard_against():
    cited = [f"see {_NOTES} section 6.5", f"({_NOTES} 6.5)", f"../{_SIBLING}/x", f"{_SIBLING}/{_NOTES}/notes"]
    assert all(OUTSIDE.search(text) for text in cited)
    assert not OUTSIDE.search(f"{_NOTES} = family_{_NOTES}(family)") and not OUTSIDE.search("spectral_margin")
    notes = "u" + "oro.md"
    assert MARKDOWN_NAME.findall(f"as {notes} says; see docs/design.md") == [notes, "docs/design.md"]
