"""MkDocs hook: the figures of the results pages, and the API reference.

The results pages (``docs/results/*.md``) are committed with their tables: ``python -m benchmarks.report`` writes
each benchmark's tables between the lines ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` of one page, from
``benchmarks/results/NAME-*.json`` (and ``--check``, run by the tests, says when a page is stale). This hook renders
nothing of them: it drops the two marker lines and shows the figures ``benchmarks/results/NAME-*.png`` under the
section, copied into the site under ``results/figures/``. A section of a benchmark without results, or a benchmark
with results that no page shows, fails the build.

The math (``$...$`` and ``$$...$$``, which ``pymdownx.arithmatex`` wraps as ``\\(...\\)`` and ``\\[...\\]``) is
rendered here, at build time, into MathML, which browsers draw themselves: the site needs no script and no network
to show an equation. A formula the converter cannot read fails the build, naming the page.

A line ``<!-- api:PACKAGE -->`` in a page is replaced by the package's docstring and one mkdocstrings block per name
of its ``__all__``, read when the site is built: the reference follows ``__all__`` whatever it holds, including
names that a package exports lazily (``lightning_ortho.callbacks``). Each name is documented at the module that
defines it.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from html import unescape
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SECTION = re.compile(r"^<!-- ([\w.-]+):start -->\n(.*?)^<!-- \1:end -->$", re.M | re.S)
FIGURES = "results/figures"
API = re.compile(r"^<!-- api:([\w.]+) -->$", re.M)

MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)

_shown: set[str] = set()
_results: set[str] = set()


def benchmarks_with_results() -> set[str]:
    """The benchmarks with result files (``benchmarks/results/*.json``, smoke runs ``-quick`` left out), by the
    ``benchmark`` each file names."""
    return {
        json.loads(path.read_text())["benchmark"] for path in RESULTS.glob("*.json") if not path.stem.endswith("-quick")
    }


def figures(name: str) -> list[Path]:
    """The PNG figures of benchmark ``name`` (``NAME-<machine>.png``, ``NAME-<machine>-<what>.png``)."""
    return sorted(p for p in RESULTS.glob(f"{name}-*.png") if not p.stem.endswith("-quick"))


def api_path(package: str, name: str) -> str:
    """Dotted path mkdocstrings should render for ``package.name``: the defining module's name when that module
    holds the object under this name (classes, functions, module-level aliases), else the package's own."""
    module = importlib.import_module(package)
    value = getattr(module, name)
    home = getattr(value, "__module__", None)
    if isinstance(home, str) and home.startswith("lightning_ortho") and home in sys.modules:
        if getattr(sys.modules[home], name, None) is value:
            return f"{home}.{name}"
    return f"{package}.{name}"


_griffe_package = None


def renderable(path: str) -> bool:
    """Whether mkdocstrings can find ``path`` by static analysis (griffe), aliases followed to their target."""
    global _griffe_package
    import griffe

    if _griffe_package is None:
        _griffe_package = griffe.load("lightning_ortho", search_paths=[str(ROOT)], resolve_aliases=False)
    try:
        found = _griffe_package[path.removeprefix("lightning_ortho.")]
        if found.is_alias:
            found.final_target  # noqa: B018 (raises when the alias cannot be resolved)
    except Exception:  # griffe raises KeyError or AliasResolutionError for what it cannot follow
        return False
    return True


def plain_entry(package: str, name: str) -> str:
    """A reference entry for a name static analysis cannot follow (a constant re-exported past a shadowing name)."""
    value = getattr(importlib.import_module(package), name)
    text = repr(value)
    if len(text) > 160:
        text = text[:160] + " ..."
    return f"## `{name}` {{ #{package}.{name} }}\n\n`{type(value).__name__}`: `{text}`"


def api_markdown(package: str) -> str:
    """The reference of ``package``: its docstring, then every name of its ``__all__`` in order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module = importlib.import_module(package)
    names = list(getattr(module, "__all__", []))
    if not names:
        raise PluginError(f"<!-- api:{package} -->: {package} has no __all__")
    blocks = [f"::: {package}\n    options:\n      members: false\n      show_root_heading: false"]
    for name in names:
        path = next((p for p in (api_path(package, name), f"{package}.{name}") if renderable(p)), None)
        if path is None:
            blocks.append(plain_entry(package, name))
        else:
            blocks.append(f"::: {path}\n    options:\n      show_root_full_path: false")
    return "\n\n".join(blocks)


def on_files(files, config):
    for path in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"{FIGURES}/{path.name}", abs_src_path=str(path)))
    return files


def on_pre_build(config):
    _shown.clear()
    _results.clear()
    _results.update(benchmarks_with_results())


def on_page_markdown(markdown, page, config, files):
    def replace(match: re.Match) -> str:
        name, body = match.group(1), match.group(2)
        if name not in _results:
            raise PluginError(
                f"{page.file.src_uri}: section <!-- {name}:start -->: no results benchmarks/results/{name}-*.json"
            )
        _shown.add(name)
        prefix = "../" * page.file.src_uri.count("/")
        images = [f"![{name}: {p.stem}]({prefix}{FIGURES}/{p.name})" for p in figures(name)]
        return "\n\n".join([body.rstrip("\n"), *images]) + "\n"

    markdown = API.sub(lambda match: api_markdown(match.group(1)), markdown)
    return SECTION.sub(replace, markdown)


def tex_to_mathml(tex: str, display: bool) -> str:
    """One formula as MathML (``display``: a block of its own)."""
    from latex2mathml.converter import convert

    return convert(tex, display="block" if display else "inline")


def on_page_content(html, page, config, files):
    def render(match: re.Match) -> str:
        display = match.group(1) == "div"
        tex = unescape(match.group(2)).strip()
        opening, closing = ("\\[", "\\]") if display else ("\\(", "\\)")
        if tex.startswith(opening) and tex.endswith(closing):
            tex = tex[len(opening) : -len(closing)]
        try:
            return tex_to_mathml(tex, display)
        except Exception as error:  # noqa: BLE001 - any converter failure names the formula
            raise PluginError(f"{page.file.src_path}: cannot render the formula {tex!r}: {error}") from error

    return MATH.sub(render, html)


def on_post_build(config):
    missing = sorted(_results - _shown)
    if missing:
        raise PluginError(
            "benchmarks with results that no docs page shows (add a section <!-- NAME:start --> ... "
            "<!-- NAME:end --> to a page under docs/results/ and run python -m benchmarks.report): "
            + ", ".join(missing)
        )
