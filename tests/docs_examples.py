"""The Python examples of ``README.md`` and ``docs/**/*.md`` as tests (collected by the root ``conftest.py``).

Sybil (the ``sybil`` package of the test extra) parses each page; every fenced block whose info string is ``python`` is one
test item, ``README.md::line:N,column:1`` (``N``: the line of the opening fence). The blocks of one page run in
order in one namespace, as a reader pastes them, and each page starts from a fresh one; each block of the README
(``STANDALONE``) starts from a fresh one of its own. They run in one process of
their own (``tests/docs_worker.py``), not in the test session, so that

* a block sees what a reader's program sees: none of the test suite's imports, fixtures or warning filters, and
  the Lightning package it imports itself: lightning-ortho builds its LightningModules on the package a program
  imports first, and the test session has already chosen ``lightning``, while the examples use
  ``pytorch_lightning``, the core install's. The worker runs with ``LIGHTNING_ORTHO_LIGHTNING=pytorch_lightning``
  (the choice a program that imports ``pytorch_lightning`` first gets; an example written for ``lightning`` fails
  here, as it does on the core install, which has no ``lightning``) and without any other ``LIGHTNING_ORTHO_*`` variable; on one thread unless
  ``OMP_NUM_THREADS`` says otherwise;
* the page's working directory is a fresh temporary directory: ``lightning_logs/`` and whatever else an example
  writes lands there, never in the repository.

A block fails when it raises, and when it uses something deprecated (a ``FutureWarning`` or
``DeprecationWarning`` raised from the block's own code is an error).

Two markers, HTML comments that the site does not show, on the line before the fence:

* ``<!-- slow -->``: the block is a ``slow`` test, left out of the default run (``-m 'not slow'``) and run by
  ``-m slow``. Only the last blocks of a page may be slow (a later block could need what a slow one defines).
* ``<!-- skip: next "why" -->`` (Sybil's skip): the block is shown but not run; its test reports as skipped.

Selecting a single block (``-m slow``, or a node id) first runs the earlier blocks of its page that have not run.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sybil import Document, Example, Sybil
from sybil.example import SybilFailure
from sybil.integration.pytest import SybilFile, SybilItem
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("docs_worker.py")
#: seconds one block may run before its worker is stopped and the block fails
BLOCK_TIMEOUT = float(os.environ.get("LIGHTNING_ORTHO_DOCS_BLOCK_TIMEOUT", "600"))

SLOW_MARKER = re.compile(r"^[ \t]*<!--\s*slow\s*-->[ \t]*\n(?:[ \t]*\n)*\Z", re.M)
#: every fenced block a reader would take for Python, whatever its info string; the collector must find each one
PYTHON_FENCE = re.compile(r"^[ \t>]*(`{3,}|~{3,})[ \t]*(?:\{\s*\.?)?(py|python|python3|pycon)\b.*$", re.M)


def is_page(path: Path, root: Path = ROOT) -> bool:
    """Whether ``path`` is a page whose Python blocks are tests: ``README.md`` and ``docs/**/*.md`` of ``root``."""
    path, root = Path(path).resolve(), Path(root).resolve()
    return path == root / "README.md" or (path.suffix == ".md" and (root / "docs") in path.parents)


def pages(root: Path = ROOT) -> list[Path]:
    """Every page with examples to run, README first."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def python_fence_lines(text: str) -> list[int]:
    """The line numbers (1-based) of the opening fences of the Python blocks of a markdown text, found without
    Sybil: the count the collection is checked against."""
    lines = []
    open_fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip(" \t>")
        if open_fence is None:
            fence = re.match(r"(`{3,}|~{3,})", stripped)
            if fence:
                open_fence = fence.group(1)
                if PYTHON_FENCE.match(line):
                    lines.append(number)
        elif stripped.rstrip() == open_fence[0] * len(stripped.rstrip()) and len(stripped.rstrip()) >= len(open_fence):
            open_fence = None
    return lines


class DocsWorker:
    """The client of one ``tests/docs_worker.py`` process: ``page(path, cwd)`` starts a page, ``run(...)`` runs a
    block in it. A worker that died or timed out is replaced at the next page."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.process: subprocess.Popen | None = None
        self.log: Path | None = None
        self.page_path: str | None = None

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_ORTHO_")}
        env["LIGHTNING_ORTHO_LIGHTNING"] = "pytorch_lightning"
        for keep in ("LIGHTNING_ORTHO_CACHE_DIR", "LIGHTNING_ORTHO_NATIVE"):  # machine settings, not the examples'
            if keep in os.environ:
                env[keep] = os.environ[keep]
        # the examples' tensors are tiny: a thread pool only costs (about half the CPU time, more on a busy machine)
        env.setdefault("OMP_NUM_THREADS", "1")
        handle, log = tempfile.mkstemp(prefix="worker-", suffix=".log", dir=self.log_dir)
        os.close(handle)
        self.log = Path(log)
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(self.log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.log_dir,
            env=env,
            text=True,
        )

    def _ask(self, request: dict, timeout: float) -> dict:
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        answer = self.process.stdout.readline() if ready else ""
        if answer:
            return json.loads(answer)
        self.close()
        what = f"ran for more than {timeout:.0f} s" if not ready else "died"
        tail = self.log.read_text(errors="replace")[-4000:] if self.log else ""
        raise RuntimeError(f"the worker running the documentation's examples {what}; its last output:\n{tail}")

    def page(self, path: str | Path, cwd: str | Path) -> None:
        if self.process is None or self.process.poll() is not None:
            self._start()
        self._ask({"op": "page", "path": str(path), "cwd": str(cwd)}, timeout=60)
        self.page_path = str(path)

    def run(self, path: str | Path, line: int, source: str) -> tuple[str | None, str]:
        """Run ``source`` (its first line is line ``line + 1`` of ``path``) in the current page: (the traceback
        or None, what it printed)."""
        if self.process is None or self.page_path != str(path):
            raise RuntimeError(f"{path}: run() before page()")
        answer = self._ask({"op": "run", "path": str(path), "line": line, "source": source}, BLOCK_TIMEOUT)
        return answer["error"], answer["output"]

    def close(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()
        self.process = None
        self.page_path = None


#: the name under which the pytest fixture puts the worker into a page's (test-side) namespace
WORKER_NAME = "_docs_worker"
#: pages (at the root) whose blocks each run on their own, from a fresh namespace: a reader copies one README block
#: into a new script, so none may lean on another
STANDALONE = {"README.md"}


def evaluate_in_worker(example: Example) -> None:
    """Sybil evaluator of a Python block: run it in the page's worker namespace; print what it printed."""
    __tracebackhide__ = True
    worker: DocsWorker = example.namespace[WORKER_NAME]
    error, output = worker.run(example.path, example.line + example.parsed.line_offset, str(example.parsed))
    if output:
        sys.stdout.write(output)
    if error is not None:
        raise SybilFailure(example, error)  # reported as its traceback alone, with the page's line numbers


SYBIL = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=evaluate_in_worker), SkipParser()],
    patterns=["*.md"],
    path="/",  # which files are pages is is_page's decision (pytest_collect_file)
    fixtures=[WORKER_NAME, "_docs_block"],
)


def parse(path: Path) -> Document:
    return SYBIL.parse(Path(path))


def code_blocks(document: Document) -> list[Example]:
    """The Python blocks among the examples of a parsed page (the rest are skip directives)."""
    return [example for example in document.examples() if example.region.evaluator is evaluate_in_worker]


def is_slow(example: Example) -> bool:
    """Whether the block is marked ``<!-- slow -->`` on the line before its fence (blank lines may separate)."""
    before = example.document.text[: example.region.start]
    return bool(SLOW_MARKER.search(before))


def run_earlier_blocks(example: Example, done: set[int]) -> None:
    """Evaluate, in order, the examples of ``example``'s page before it that have not run (their region starts
    are not in ``done``): a block selected alone gets the namespace that the blocks before it build."""
    from unittest import SkipTest

    for earlier in example.document.examples():
        if earlier.region.start >= example.region.start:
            break
        if earlier.region.start in done:
            continue
        done.add(earlier.region.start)
        try:
            earlier.evaluate()
        except SkipTest:
            pass
    done.add(example.region.start)


# --- the pytest side: the root conftest.py imports these hooks and fixtures ---------------------------------------


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> SybilFile | None:
    if is_page(file_path, parent.config.rootpath):
        return SybilFile.from_parent(parent, path=file_path, sybils=[SYBIL])
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    if isinstance(item, SybilItem) and is_slow(item.example):
        item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def _docs_worker_process(tmp_path_factory):
    worker = DocsWorker(tmp_path_factory.mktemp("docs-worker"))
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def _docs_worker(request, _docs_worker_process, tmp_path_factory):
    """The worker, at the start of a page (module scope: a Sybil file): a new namespace, a new temporary working
    directory."""
    path = Path(request.node.path)
    _docs_worker_process.page(path, tmp_path_factory.mktemp(path.stem))
    return _docs_worker_process


@pytest.fixture
def _docs_block(request, _docs_worker, tmp_path_factory):
    """Before a block: on a page of standalone blocks (``STANDALONE``), a fresh namespace and working directory;
    elsewhere, run the blocks of its page before it that have not run (deselected, or not selected)."""
    example = request.node.example
    example.namespace[WORKER_NAME] = _docs_worker
    path = Path(example.path)
    if path.name in STANDALONE and path.parent == Path(request.config.rootpath):
        _docs_worker.page(path, tmp_path_factory.mktemp(path.stem))
        return
    run_earlier_blocks(example, example.document.__dict__.setdefault("_blocks_done", set()))
