"""The documentation site (mkdocs.yml, docs/): the navigation and the pages agree, every benchmark with results has
a results page, and ``mkdocs build --strict`` succeeds (when mkdocs is installed: ``pip install -e ".[docs]"``)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("nn", "flows", "online", "transforms", "models", "callbacks", "datamodules")


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may hold ``!!python/name:`` tags (Material's extensions); they are irrelevant to the nav."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_every_nav_page_exists_and_every_page_is_in_nav():
    pages = _nav_pages(_config()["nav"])
    assert len(pages) == len(set(pages)), "a page is listed twice in mkdocs.yml's nav"
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that docs/ lacks: {missing}"
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert not set(on_disk) - set(pages), (
        f"pages under docs/ missing from mkdocs.yml's nav: {sorted(set(on_disk) - set(pages))}"
    )


def test_every_package_has_a_reference_page():
    for package in PACKAGES:
        page = DOCS / "reference" / f"{package}.md"
        assert f"<!-- api:lightning_ortho.{package} -->" in page.read_text(), page


def test_every_benchmark_with_results_has_a_results_section():
    from benchmarks.report import marked, sections

    pages = {page: page.read_text() for page in DOCS.rglob("*.md")}
    shown = {name for text in pages.values() for name in marked(text)}
    assert not set(sections()) - shown, f"benchmarks no docs page shows: {sorted(set(sections()) - shown)}"
    assert not shown - set(sections()), f"results sections with no results: {sorted(shown - set(sections()))}"
    outside = sorted(str(page.relative_to(DOCS)) for page, text in pages.items() if marked(text))
    outside = [page for page in outside if not page.startswith("results/")]
    assert not outside, f"results sections outside docs/results/ (benchmarks.report does not update them): {outside}"
    old = [str(page.relative_to(DOCS)) for page, text in pages.items() if re.search(r"<!-- results:[\w.-]+ -->", text)]
    assert not old, f"<!-- results:NAME --> is no longer expanded; use <!-- NAME:start --> / <!-- NAME:end -->: {old}"


needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason='mkdocs is not installed (".[docs]" extra)'
)
#: A Sphinx role left as text on a built page (``:class:`` and the like, then the name as code or text).
LITERAL_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):(?:<code>|`|~?[A-Za-z_])")


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """``mkdocs build --strict`` once for the tests of this module: (return code, output, site directory)."""
    site = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result.returncode, result.stdout + result.stderr, site


@needs_mkdocs
def test_mkdocs_build_strict(built_site):
    returncode, output, site = built_site
    assert returncode == 0, output
    # every public name of every package is documented (a heading whose id ends with the name)
    for package in PACKAGES:
        module = importlib.import_module(f"lightning_ortho.{package}")
        html = (site / "reference" / package / "index.html").read_text()
        ids = set(re.findall(r'id="(lightning_ortho\.[\w.]+)"', html))
        undocumented = [name for name in module.__all__ if not any(i.endswith(f".{name}") for i in ids)]
        assert not undocumented, f"lightning_ortho.{package}: {undocumented}"
    # the figures of the results pages were copied
    assert list((site / "results" / "figures").glob("*.png"))


@needs_mkdocs
def test_api_pages_show_no_sphinx_role(built_site):
    """docs/griffe_sphinx.py rewrites the docstrings' roles: code, linked to the object where the site shows it."""
    returncode, output, site = built_site
    assert returncode == 0, output
    links = 0
    for package in PACKAGES:
        html = (site / "reference" / package / "index.html").read_text()
        literal = [html[max(0, m.start() - 60) : m.end() + 40] for m in LITERAL_ROLE.finditer(html)]
        assert not literal, f"reference/{package}: Sphinx roles left as text: {literal[:5]}"
        assert "<autoref" not in html, f"reference/{package}: a cross-reference autorefs did not process"
        links += len(re.findall(r'<a class="autorefs autorefs-internal"[^>]*><code>', html))
    assert links > 200, f"only {links} roles became links to the API reference"
    # a role naming the public path links to the entry rendered under the defining module's path
    online = (site / "reference" / "online" / "index.html").read_text()
    assert re.search(
        r'<a class="autorefs autorefs-internal"[^>]*href="#lightning_ortho\.online\.estimator\.'
        r'OnlineGradientEstimator"[^>]*><code>OnlineGradientEstimator</code></a>',
        online,
    )
