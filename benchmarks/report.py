"""Render the README's benchmark tables from benchmarks/results/*.json.

    python -m benchmarks.report            # rewrite the marked sections of README.md
    python -m benchmarks.report --print    # print the markdown instead
    python -m benchmarks.report --check    # exit 1 if README.md is not what the results render to

A section is delimited by ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` where NAME is the benchmark.
Files ending in ``-quick.json`` (smoke runs) are ignored. Every benchmark with results needs its markers in the
README, and every pair of markers needs results: otherwise :class:`ReportError` says which, and nothing is written.

The table of benchmark NAME is ``render(data)`` of the script that writes it: benchmarks/NAME.py, or for a variant
the script whose name NAME extends (``reproduce_rnn_mnist5k``: benchmarks/reproduce_rnn.py run with
``--data mnist5k``). A new benchmark brings its renderer with it; this file lists none.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks._render import ReportError, claims_table

__all__ = ["ReportError", "claims_table", "renderer", "sections", "render_readme", "update_readme", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"


def renderer(benchmark: str) -> Callable[[dict], str]:
    """``render`` of the script that writes ``benchmark``'s results (the longest script name that ``benchmark``
    equals or extends by ``_...``).

    Raises:
        ReportError: no such script, or it has no ``render``.
    """
    parts = benchmark.split("_")
    for end in range(len(parts), 0, -1):
        script = "_".join(parts[:end])
        if script.startswith("_") or not (ROOT / "benchmarks" / f"{script}.py").is_file():
            continue
        render = getattr(importlib.import_module(f"benchmarks.{script}"), "render", None)
        if render is None:
            raise ReportError(
                f"benchmark {benchmark!r} has no renderer: add render(data) -> str to benchmarks/{script}.py"
            )
        return render
    raise ReportError(
        f"benchmark {benchmark!r} has no renderer: no script benchmarks/{benchmark}.py (or one whose name it extends) "
        "with a render(data) -> str"
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


def render_readme(text: str, bodies: dict[str, str]) -> str:
    """``text`` with the body of every marked section replaced by ``bodies[name]``.

    Raises:
        ReportError: a benchmark of ``bodies`` has no markers in ``text``, a marker has no body (no results), or
            the markers of a name are not one ``start`` followed by one ``end``.
    """
    problems = []
    names = sorted(set(re.findall(r"<!-- ([\w.-]+):(?:start|end) -->", text)) | set(bodies))
    for name in names:
        starts, ends = text.count(_marker(name, "start")), text.count(_marker(name, "end"))
        if (starts, ends) == (0, 0):
            problems.append(
                f"{name} has results but the README has no section for it: add the lines "
                f"{_marker(name, 'start')} and {_marker(name, 'end')} where its tables belong"
            )
        elif (starts, ends) != (1, 1) or text.index(_marker(name, "start")) > text.index(_marker(name, "end")):
            problems.append(f"{name}: expected one {_marker(name, 'start')} before one {_marker(name, 'end')}")
        elif name not in bodies:
            problems.append(
                f"the README has a section {_marker(name, 'start')} but there are no {name}-*.json results "
                "(quick runs do not count): commit the results or remove the section"
            )
    if problems:
        raise ReportError("README sections do not match the results:\n  " + "\n  ".join(problems))
    for name, body in bodies.items():
        pattern = re.compile(rf"({re.escape(_marker(name, 'start'))}\n).*?({re.escape(_marker(name, 'end'))})", re.S)
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def update_readme(readme: Path = README, results: Path = RESULTS) -> bool:
    """Rewrite the marked sections of ``readme`` from ``results``; whether the file changed. Writes nothing on error."""
    text = readme.read_text()
    new = render_readme(text, sections(results))
    if new != text:
        readme.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--print", action="store_true", help="print the markdown instead of writing README.md")
    group.add_argument("--check", action="store_true", help="exit 1 if README.md differs from the rendered results")
    args = parser.parse_args(argv)
    try:
        if args.print:
            for name, body in sections().items():
                print(f"## {name}\n\n{body}\n")
        elif args.check:
            text = README.read_text()
            if render_readme(text, sections()) != text:
                print("README.md is out of date: run python -m benchmarks.report", file=sys.stderr)
                return 1
        else:
            update_readme()
    except ReportError as error:
        print(f"benchmarks.report: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
