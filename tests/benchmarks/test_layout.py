"""benchmarks/ keeps one layout: a script (``NAME.py``, run as ``python -m benchmarks.NAME``) measures and writes
results; its table is ``render`` of ``NAME_render.py``; what several scripts share is a helper (``_name.py``); the
tools (``report``, ``mnist5k``) write no results. No module imports a script, so each one runs, changes and fails on
its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.benchmarks.helpers import ROOT, load

report = load("report")
BENCHMARKS = ROOT / "benchmarks"
MODULES = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py")
SCRIPTS = [p.stem for p in MODULES if report.is_script(p)]


def imported_modules(path: Path) -> set[str]:
    """The ``benchmarks.*`` modules ``path`` imports (``from benchmarks import x`` and ``from benchmarks.x import y``
    alike, at any depth of the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks.")}
    return names


def test_the_scripts_are_the_benchmarks_with_results():
    assert {"bench_small", "bench_orthogonal", "gpu_suite", "reproduce_rnn", "online_family"} <= set(SCRIPTS)
    assert not {"report", "mnist5k", "bench_small_render", "_small_rows"} & set(SCRIPTS)
    written = {path.name.split("-")[0] for path in (BENCHMARKS / "results").glob("*.json")}
    assert all(any(name == s or name.startswith(f"{s}_") for s in SCRIPTS) for name in written), written


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_a_renderer(script):
    assert callable(load(f"{script}_render").render), f"benchmarks/{script}_render.py defines no render(data)"


def test_every_renderer_belongs_to_a_script():
    renderers = [p for p in MODULES if p.stem.endswith("_render") and not p.stem.startswith("_")]  # _render: shared
    orphans = [p.name for p in renderers if p.stem.removesuffix("_render") not in SCRIPTS]
    assert not orphans, f"renderers without their script: {orphans}"


def test_no_module_imports_a_script():
    found = {p.name: sorted(imported_modules(p) & set(SCRIPTS)) for p in MODULES}
    assert not {name: scripts for name, scripts in found.items() if scripts}, found


def test_the_import_check_sees_each_form_of_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from benchmarks import bench_small, _common\nimport benchmarks.bench_flows\n"
        "def f():\n    from benchmarks.gpu_suite import main\n"
    )
    assert imported_modules(module) == {"bench_small", "_common", "bench_flows", "gpu_suite"}
