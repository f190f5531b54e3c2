"""docs/design.md maps every module of the package: each module's name appears in the row of its package (for a
module of a subpackage such as ``callbacks/monitors/``, in its parent's row), so a new module is placed there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_ortho"


def _rows() -> dict[str, str]:
    """package folder (``"nn/"``, ``"lightning_ortho/"``) -> the text of its row in the module table."""
    rows = re.findall(r"^\| `([\w/]+)` \| (.+) \|$", (ROOT / "docs" / "design.md").read_text(), re.M)
    return dict(rows)


def test_every_module_is_in_its_package_row():
    rows = _rows()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        parts = path.relative_to(PACKAGE).parts
        row = rows.get(f"{parts[0]}/" if len(parts) > 1 else "lightning_ortho/")
        if row is None or not re.search(rf"`{re.escape(path.stem)}`|\b{re.escape(path.stem)}\b", row):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"docs/design.md's module table does not list: {missing}"


def test_every_subpackage_has_a_row_or_is_named_in_its_parent():
    rows = _rows()
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert f"{folder.name}/" in rows, folder.name
        for sub in sorted(q for q in folder.iterdir() if q.is_dir() and (q / "__init__.py").exists()):
            assert f"`{sub.name}/`" in rows[f"{folder.name}/"], f"{folder.name}/{sub.name}/"
