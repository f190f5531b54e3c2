"""The Python examples of README.md and docs/ are tests: see tests/docs_examples.py (the collector, Sybil) and
tests/docs_worker.py (the process they run in). This file is at the root because pytest applies a conftest's
collection hook only to the files under its directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from sybil.integration.pytest import SybilItem

from tests.docs_examples import SYBIL, WORKER_NAME, DocsWorker, is_page, is_slow, run_earlier_blocks

_collect = SYBIL.pytest()


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if is_page(file_path):
        return _collect(file_path, parent)
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
    """The worker, at the start of a fresh page: a new namespace and a new temporary working directory (module
    scope: one page)."""
    path = Path(request.node.path)
    _docs_worker_process.page(path, tmp_path_factory.mktemp(path.stem))
    return _docs_worker_process


@pytest.fixture
def _docs_block(request, _docs_worker):
    """Runs the blocks of the page before this one that did not run (deselected or selected away)."""
    example = request.node.example
    example.namespace[WORKER_NAME] = _docs_worker
    done = example.document.__dict__.setdefault("_blocks_done", set())
    run_earlier_blocks(example, done)

