"""The Python examples of README.md and docs/ are tests: tests/docs_examples.py collects them (with Sybil) and
tests/docs_worker.py runs them. They are wired in here because pytest applies a conftest's collection hook only to
the files under its directory."""

from tests.docs_examples import (  # noqa: F401 - pytest finds hooks and fixtures by name in a conftest
    _docs_block,
    _docs_worker,
    _docs_worker_process,
    pytest_collect_file,
    pytest_itemcollected,
)
