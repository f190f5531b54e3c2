"""Render the benchmark tables of the documentation's results pages (docs/results/*.md) from
benchmarks/results/*.json.

    python -m benchmarks.report            # rewrite the marked sections of docs/results/*.md
    python -m benchmarks.report --print    # print the markdown instead
    python -m benchmarks.report --check    # exit 1 if a results page is not what the results render to

A section is delimited by ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` where NAME is the benchmark; the pages
are committed with their sections filled in, so they read the same on GitHub and on the site (``docs/hooks.py``
only adds the figures). Files ending in ``-quick.json`` (smoke runs) are ignored. Every benchmark with results needs
its markers on exactly one results page, and every pair of markers needs results: otherwise :class:`ReportError`
says which, and nothing is written.

The table of benchmark NAME is ``render(data)`` of benchmarks/SCRIPT_render.py, where SCRIPT is the script that
writes it: benchmarks/NAME.py, or for a variant the script whose name NAME extends (``reproduce_rnn_mnist5k``:
benchmarks/reproduce_rnn.py run with ``--data mnist5k``). The report imports renderers only, never the scripts that
measure. A new benchmark brings its renderer with it; this file lists none.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from benchmarks._render import ReportError, claims_table

__all__ = [
    "ReportError",
    "claims_table",
    "renderer",
    "is_script",
    "TOOLS",
    "sections",
    "marked",
    "render_pages",
    "render_page",
    "read_pages",
    "stale_pages",
    "update_pages",
    "main",
]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = ROOT / "docs" / "results"
#: the modules of benchmarks/ that are commands but write no results: the results pages, and the MNIST data
TOOLS = ("report", "mnist5k")
_MARKED = re.compile(r"^<!-- ([\w.-]+):(?:start|end) -->$", re.M)


def renderer(benchmark: str) -> Callable[[dict], str]:
    """``render`` of benchmarks/SCRIPT_render.py, where SCRIPT is the script that writes ``benchmark``'s results (the
    longest script name that ``benchmark`` equals or extends by ``_...``).

    Raises:
        ReportError: no such script, or it has no renderer module with a ``render``.
    """
    parts = benchmark.split("_")
    for end in range(len(parts), 0, -1):
        script = "_".join(parts[:end])
        if not is_script(ROOT / "benchmarks" / f"{script}.py"):
            continue
        module = ROOT / "benchmarks" / f"{script}_render.py"
        render = (
            getattr(importlib.import_module(f"benchmarks.{module.stem}"), "render", None) if module.is_file() else None
        )
        if render is None:
            raise ReportError(
                f"benchmark {benchmark!r} has no renderer: add render(data) -> str to benchmarks/{module.name}"
            )
        return render
    raise ReportError(
        f"benchmark {benchmark!r} has no renderer: no script benchmarks/{benchmark}.py (or one whose name it extends) "
        "with a benchmarks/SCRIPT_render.py"
    )


def is_script(path: Path) -> bool:
    """Whether ``path`` is a benchmark script: a module of benchmarks/ that writes results, named neither
    ``_helper.py`` (helpers), ``NAME_render.py`` (renderers) nor after a tool (``report``, ``mnist5k``)."""
    return (
        path.suffix == ".py"
        and path.parent.name == "benchmarks"
        and path.is_file()
        and not path.stem.startswith("_")
        and not path.stem.endswith("_render")
        and path.stem not in TOOLS
    )


def sections(results: Path = RESULTS) -> dict[str, str]:
    """Benchmark name -> the markdown of its result files in ``results`` (sorted by file name, ``-quick`` skipped).

    Raises:
        ReportError: a result file of a benchmark with no renderer, or one its renderer cannot read.
    """
    out: dict[str, list[str]] = {}
    for path in sorted(results.glob("*.json")):
        if path.stem.endswith("-quick"):
            continue
        data = json.loads(path.read_text())
        try:
            render = renderer(data["benchmark"])
        except ReportError as error:
            raise ReportError(f"{path.name}: {error}") from error
        try:
            out.setdefault(data["benchmark"], []).append(render(data))
        except (KeyError, ReportError) as error:
            raise ReportError(f"{path.name}: cannot render: {error}") from error
    return {name: "\n\n".join(parts) for name, parts in out.items()}


def _marker(name: str, end: str) -> str:
    return f"<!-- {name}:{end} -->"


def marked(text: str) -> set[str]:
    """The benchmark names that have a ``start`` or an ``end`` marker in ``text`` (a marker is a line of its own: one
    quoted inside a sentence is prose)."""
    return set(_MARKED.findall(text))


def _lines(text: str, line: str) -> list[int]:
    """Offsets of the lines of ``text`` that are exactly ``line``."""
    return [m.start() for m in re.finditer(rf"^{re.escape(line)}$", text, re.M)]


def _page_problems(page: str, text: str, bodies: Mapping[str, str]) -> list[str]:
    problems = []
    for name in sorted(marked(text)):
        start, end = _marker(name, "start"), _marker(name, "end")
        starts, ends = _lines(text, start), _lines(text, end)
        if (len(starts), len(ends)) != (1, 1) or starts[0] > ends[0]:
            problems.append(f"{page}: {name}: expected one {start} before one {end}")
        elif name not in bodies:
            problems.append(
                f"{page} has a section {start} but there are no {name}-*.json results (quick runs do not count): "
                "commit the results or remove the section"
            )
    return problems


def render_pages(pages: Mapping[str, str], bodies: Mapping[str, str]) -> dict[str, str]:
    """Each page's text (page name -> markdown) with the body of every marked section replaced by ``bodies[name]``.

    Raises:
        ReportError: a benchmark of ``bodies`` has markers on no page or on more than one, a marker has no body
            (no results), or the markers of a name on a page are not one ``start`` followed by one ``end``.
    """
    problems = [problem for page, text in pages.items() for problem in _page_problems(page, text, bodies)]
    for name in sorted(bodies):
        on = [page for page, text in pages.items() if name in marked(text)]
        if not on:
            problems.append(
                f"{name} has results but no results page has a section for it: add the lines "
                f"{_marker(name, 'start')} and {_marker(name, 'end')} to the page of docs/results/ where its "
                "tables belong"
            )
        elif len(on) > 1:
            problems.append(f"{name} has a section on more than one page ({', '.join(on)}): keep one")
    if problems:
        raise ReportError("the results pages' sections do not match the results:\n  " + "\n  ".join(problems))
    out = {}
    for page, text in pages.items():
        for name in marked(text):
            start, end = re.escape(_marker(name, "start")), re.escape(_marker(name, "end"))
            pattern = re.compile(rf"^({start}\n).*?^({end})$", re.S | re.M)
            text = pattern.sub(lambda m, body=bodies[name]: m.group(1) + body + "\n" + m.group(2), text)
        out[page] = text
    return out


def render_page(text: str, bodies: Mapping[str, str]) -> str:
    """``render_pages`` of a single page: ``text`` must hold the section of every benchmark of ``bodies``."""
    return render_pages({"the page": text}, bodies)["the page"]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def read_pages(pages: Path = PAGES) -> dict[Path, str]:
    """The results pages: every ``*.md`` of the folder ``pages``, by path, in name order."""
    return {path: path.read_text() for path in sorted(pages.glob("*.md"))}


def _rendered(pages: Path, results: Path) -> tuple[dict[Path, str], dict[Path, str]]:
    texts = read_pages(pages)
    rendered = render_pages({_name(path): text for path, text in texts.items()}, sections(results))
    return texts, {path: rendered[_name(path)] for path in texts}


def stale_pages(pages: Path = PAGES, results: Path = RESULTS) -> list[Path]:
    """The pages of ``pages`` whose sections are not the rendering of ``results`` (empty: all up to date)."""
    texts, new = _rendered(pages, results)
    return [path for path in texts if new[path] != texts[path]]


def update_pages(pages: Path = PAGES, results: Path = RESULTS) -> list[Path]:
    """Rewrite the marked sections of the pages of ``pages`` from ``results``; the pages that changed. Writes
    nothing on error."""
    texts, new = _rendered(pages, results)
    changed = [path for path in texts if new[path] != texts[path]]
    for path in changed:
        path.write_text(new[path])
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--print", action="store_true", help="print the markdown instead of writing the pages")
    group.add_argument("--check", action="store_true", help="exit 1 if a results page differs from the results")
    args = parser.parse_args(argv)
    try:
        if args.print:
            for name, body in sections(RESULTS).items():
                print(f"## {name}\n\n{body}\n")
        elif args.check:
            stale = stale_pages(PAGES, RESULTS)
            if stale:
                names = ", ".join(_name(path) for path in stale)
                print(f"{names} out of date: run python -m benchmarks.report", file=sys.stderr)
                return 1
        else:
            for path in update_pages(PAGES, RESULTS):
                print(f"rewrote {_name(path)}")
    except ReportError as error:
        print(f"benchmarks.report: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
