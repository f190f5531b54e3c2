"""The collection of the documentation's Python examples (tests/docs_examples.py, wired in by the root
conftest.py): the default test command collects every Python block of README.md and docs/, and the blocks run as
the collector promises (one namespace per page, in order, and one per README block; a temporary working directory;
slow and skipped blocks).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

from tests.docs_examples import (
    ROOT,
    code_blocks,
    is_slow,
    pages,
    parse,
    python_fence_lines,
)

SKIP_DIRECTIVE = re.compile(r"^[ \t]*<!--+\s*skip\b", re.M)


def _collected(root: Path, *args: str) -> set[tuple[str, int]]:
    """(page, line) of every documentation block that ``python -m pytest --collect-only`` lists in ``root``."""
    result = _pytest(root, "--collect-only", "-q", *args)
    assert result.returncode in (0, 5), result.stdout + result.stderr
    found = set()
    for line in result.stdout.splitlines():
        match = re.fullmatch(r"(\S+\.md)::line:(\d+),column:\d+", line.strip())
        if match:
            found.add((match.group(1), int(match.group(2))))
    return found


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


def _expected(root: Path, slow: bool | None) -> set[tuple[str, int]]:
    """(page, line) of the Python fences and skip directives of every page, found without Sybil; ``slow``: only
    the slow blocks (True), only the others (False) or all (None)."""
    expected = set()
    for page in pages(root):
        if not page.is_file():
            continue
        name = page.relative_to(root).as_posix()
        text = page.read_text()
        slow_lines = {example.line for example in code_blocks(parse(page)) if is_slow(example)}
        for line in python_fence_lines(text):
            if slow is None or (line in slow_lines) == slow:
                expected.add((name, line))
        if slow is not True:
            expected |= {(name, text.count("\n", 0, m.start()) + 1) for m in SKIP_DIRECTIVE.finditer(text)}
    return expected


def test_the_default_test_command_collects_readme_and_docs():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert {"tests", "README.md", "docs"} <= set(options["testpaths"]), options["testpaths"]


def test_every_python_fence_of_every_page_is_a_block():
    """The collector's blocks are exactly the fences a reader takes for Python (```python, ```py, ...): a fence
    the collector does not recognise (```py, ```python title=...) or a block hidden from the reader
    (invisible-code-block) fails here."""
    mismatched = {}
    for page in pages():
        fences = python_fence_lines(page.read_text())
        blocks = [example.line for example in code_blocks(parse(page))]
        if fences != blocks:
            mismatched[page.relative_to(ROOT).as_posix()] = {"fences": fences, "collected": blocks}
    assert not mismatched, f"write Python examples as ```python fences: {mismatched}"
    assert python_fence_lines((ROOT / "docs" / "getting-started.md").read_text()), "the quick start has no example"


def test_pytest_collects_every_block_of_the_repository():
    """What pytest collects from README.md and docs/ (the testpaths besides tests/, checked above) with the
    default options is one item per Python fence and skip directive, the slow blocks left out."""
    assert {page for page, _ in _expected(ROOT, slow=None)} >= {"README.md", "docs/getting-started.md"}
    assert _collected(ROOT, "README.md", "docs") == _expected(ROOT, slow=False)


def test_no_block_follows_a_slow_block_on_a_page():
    """A slow block is left out of the default run, so a block after it could miss what it defines."""
    for page in pages():
        slow = [is_slow(example) for example in code_blocks(parse(page))]
        assert slow == sorted(slow), f"{page.relative_to(ROOT)}: only the last blocks of a page may be <!-- slow -->"


PROJECT = {
    "README.md": """
        # Standalone blocks

        ```python
        x = 1
        ```

        ```python
        assert "x" not in globals()  # each README block starts from a fresh namespace
        ```
        """,
    "docs/page.md": """
        # A page

        ```python
        import os
        import sys

        x = 41
        with open("written.txt", "w") as f:
            f.write("x")
        ```

        ```bash
        exit 1
        ```

        ```python
        x += 1
        assert x == 42
        assert os.path.exists("written.txt") and os.getcwd() != {root!r}
        assert "pytest" not in sys.modules and __name__ == "__main__"
        ```

        <!-- slow -->
        ```python
        assert x == 42
        print("the slow block ran")
        ```
        """,
    "docs/fresh.md": """
        ```python
        assert "x" not in globals()
        import os
        assert not os.path.exists("written.txt")
        ```
        """,
    "docs/failing.md": """
        Text.

        ```python
        y = 1
        y = 1 / 0
        ```

        ```python
        import warnings

        warnings.warn("old name", FutureWarning)
        ```

        <!-- skip: next "shown only" -->
        ```python
        raise SystemExit(1)
        ```
        """,
}


def _make_project(root: Path) -> None:
    for name, text in PROJECT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip().format(root=str(root)))
    (root / "pytest.ini").write_text(
        "[pytest]\ntestpaths = README.md docs\naddopts = -m 'not slow' -p no:cacheprovider\nmarkers = slow: long\n"
    )
    (root / "conftest.py").write_text((ROOT / "conftest.py").read_text())


def _outcomes(result: subprocess.CompletedProcess) -> dict[str, str]:
    return {
        node: outcome
        for node, outcome in re.findall(r"^(\S+\.md::\S+) (PASSED|FAILED|SKIPPED|ERROR)", result.stdout, re.M)
    }


def test_blocks_run_in_order_per_page_in_a_temporary_directory(tmp_path):
    project = tmp_path / "project"
    _make_project(project)
    result = _pytest(project, "-v")
    outcomes = _outcomes(result)
    assert outcomes == {
        "README.md::line:3,column:1": "PASSED",
        "README.md::line:7,column:1": "PASSED",
        "docs/page.md::line:3,column:1": "PASSED",
        "docs/page.md::line:16,column:1": "PASSED",
        "docs/fresh.md::line:1,column:1": "PASSED",
        "docs/failing.md::line:3,column:1": "FAILED",
        "docs/failing.md::line:8,column:1": "FAILED",
        "docs/failing.md::line:14,column:1": "PASSED",  # the skip directive
        "docs/failing.md::line:15,column:1": "SKIPPED",
    }, result.stdout
    # a failure shows the page's own line and source
    assert 'failing.md", line 5' in result.stdout and "y = 1 / 0" in result.stdout, result.stdout
    assert "ZeroDivisionError" in result.stdout and "FutureWarning: old name" in result.stdout, result.stdout
    assert "1 deselected" in result.stdout, result.stdout
    # nothing was written into the project
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "conftest.py", "docs", "pytest.ini"]


def test_a_slow_block_runs_with_m_slow_after_the_blocks_before_it(tmp_path):
    project = tmp_path / "project"
    _make_project(project)
    result = _pytest(project, "-v", "-rP", "-m", "slow", "docs/page.md")
    assert _outcomes(result) == {"docs/page.md::line:24,column:1": "PASSED"}, result.stdout
    assert "the slow block ran" in result.stdout
