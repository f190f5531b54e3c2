"""The documentation site reads the same without network: no page loads a script, a stylesheet or a font from
elsewhere, the math is MathML rendered when the site is built, and, in headless Chromium, the concept pages show no
raw TeX and the code blocks of "Getting started" fit their column without a horizontal scroll bar.

The browser tests need mkdocs (the ``docs`` extra), Playwright (``pip install playwright``: only its driver, the
browser is the system's) and Chromium at ``/usr/bin/chromium`` (Debian's ``chromium`` package). Without them they
are skipped, except under ``LIGHTNING_ORTHO_REQUIRE_BROWSER=1`` (``make test-docs-offline``, which CI runs), where a
missing piece fails them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CONCEPT_PAGES = ("auxiliary-reflections", "online-estimators", "fast-transforms")
#: What a reader would see of TeX that was not rendered: a command (``\frac``, ``\mathbf``) or a delimiter.
RAW_TEX = re.compile(r"\\[a-zA-Z]{2,}|\\\(|\\\)|\\\[|\\\]|\$\$")
#: A resource a page would fetch from the network: a script, a stylesheet, a preconnect or a font.
REMOTE = re.compile(
    r"<script[^>]+src=\"(?:https?:)?//|<link[^>]+href=\"(?:https?:)?//[^\"]*\"[^>]*>|@import\s+url\(\s*['\"]?https?:",
    re.I,
)
REQUIRED = os.environ.get("LIGHTNING_ORTHO_REQUIRE_BROWSER") == "1"


def _missing() -> str | None:
    if importlib.util.find_spec("mkdocs") is None:
        return 'mkdocs is not installed (".[docs]" extra)'
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright)"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (Debian's chromium package)"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        if REQUIRED:
            pytest.fail('mkdocs is not installed (".[docs]" extra)')
        pytest.skip('mkdocs is not installed (".[docs]" extra)')
    folder = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing is not None:
        if REQUIRED:
            pytest.fail(missing)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


def _open(browser, path: Path):
    """A 1280 x 900 page at ``path``, and the list of every URL it requested."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, requested


def test_no_page_fetches_anything_from_the_network(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    remote = {str(p.relative_to(site)): REMOTE.findall(p.read_text()) for p in pages}
    assert not {page: found for page, found in remote.items() if found}
    stylesheets = [p for p in site.rglob("*.css") if re.search(r"@import\s+url\(\s*['\"]?https?:", p.read_text())]
    assert not stylesheets


def test_the_math_is_mathml_rendered_when_the_site_is_built(site):
    for name in CONCEPT_PAGES:
        html = (site / "concepts" / name / "index.html").read_text()
        assert html.count("<math") > 20, name
        assert 'class="arithmatex"' not in html, name  # every formula converted
        text = re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S))
        assert not RAW_TEX.findall(text), (name, RAW_TEX.findall(text)[:5])


def test_concept_pages_show_math_not_tex_in_chromium(site, browser):
    for name in CONCEPT_PAGES:
        page, requested = _open(browser, site / "concepts" / name / "index.html")
        text = page.inner_text("article")
        assert not RAW_TEX.findall(text), (name, RAW_TEX.findall(text)[:5])
        heights = page.eval_on_selector_all("article math", "els => els.map(e => e.getBoundingClientRect().height)")
        assert len(heights) > 20 and min(heights) > 0, name  # laid out as math, not hidden or empty
        assert all(url.startswith(("file:", "data:")) for url in requested), [
            url for url in requested if not url.startswith(("file:", "data:"))
        ]
        page.close()


def test_getting_started_code_blocks_fit_without_horizontal_scroll(site, browser):
    page, _ = _open(browser, site / "getting-started" / "index.html")
    blocks = page.eval_on_selector_all(
        "article pre > code",
        "els => els.map(e => [e.scrollWidth, e.clientWidth, e.innerText.split('\\n')[0]])",
    )
    assert len(blocks) >= 5
    wide = [(first_line, width, room) for width, room, first_line in blocks if width > room]
    assert not wide, f"code blocks wider than their column (scroll width, column width): {wide}"
    page.close()
