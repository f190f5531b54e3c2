"""README.md is the front door: at most 300 lines, a recipe table that lists every recipe with its command, links
that resolve inside the repository, and no results tables (those live on the docs' results pages)."""

from __future__ import annotations

import re
from pathlib import Path

from lightning_ortho.shipped_recipes import recipe_names

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_is_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"


def test_recipe_table_lists_every_recipe_with_its_command():
    text = README.read_text()
    rows = re.findall(r"^\| `([\w.-]+)` \|.*\| `(lightning-ortho fit --config [\w.-]+)` \|$", text, re.M)
    names = [name for name, _ in rows]
    assert sorted(names) == recipe_names(), "README recipe table: one row per shipped recipe"
    assert len(names) == len(set(names)), "a recipe is listed twice"
    for name, command in rows:
        assert command == f"lightning-ortho fit --config {name}", name


def test_readme_links_resolve_in_the_repository():
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links to no page of the repository"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_has_no_results_sections():
    # benchmarks.report writes docs/results/*.md; a section left in the README would silently go stale
    markers = re.findall(r"^<!-- [\w.-]+:(?:start|end) -->$", README.read_text(), re.M)
    assert not markers, f"results sections belong on docs/results/*.md: {markers}"
