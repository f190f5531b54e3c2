"""Architecture rules of the project, checked on the source (AST, nothing is imported):

* the math packages (``nn``, ``flows``, ``online``, ``transforms``) never import Lightning/torchmetrics or the
  Lightning-side packages (``models``, ``callbacks``, ``datamodules``, ``cli``);
* imports flow downward, ``cli -> models/callbacks/datamodules -> nn/flows/online/transforms -> torch``;
* there are no import cycles, between subpackages or between modules.

Every import counts, also one inside a function: a lazy import is still a dependency. Each rule is a function of an
import graph, so the synthetic package at the bottom shows that each one finds what it should.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "lightning_ortho"
PACKAGE = "lightning_ortho"
LIGHTNING = frozenset({"pytorch_lightning", "lightning", "lightning_fabric", "torchmetrics"})
MATH_PACKAGES = ("nn", "flows", "online", "transforms", "_native")
LIGHTNING_SIDE = ("_lightning_choice", "_lightning", "models", "callbacks", "datamodules", "cli", "command")
#: Layer of every subpackage (or top-level module) of lightning_ortho: an import may go to the same or a lower layer.
#: The top-level ``__init__`` runs on ``import lightning_ortho.nn``, so it sits with the math packages.
LAYERS = {
    PACKAGE: 0,
    "_deprecation": 0,  # the FutureWarning of deprecated names: pure Python, below everything
    "_extras": 0,  # optional dependencies and the error naming their extra: pure Python, below everything
    "shipped_recipes": 0,  # finds the recipes shipped in the package: pure Python, below everything
    "_native": 0,  # C kernels compiled on first use (ctypes) and their bindings: torch only
    "nn": 0,
    "flows": 0,
    "online": 0,
    "transforms": 0,
    "_lightning_choice": 1,
    "_lightning": 1,
    "models": 1,
    "callbacks": 1,
    "datamodules": 1,
    "cli": 2,
    "command": 2,
}


@dataclass
class ImportGraph:
    """Modules of one package (dotted name -> file), the internal imports between them and the external roots."""

    package: str
    files: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=dict)  # module -> modules of the package it imports
    external: dict[str, set[str]] = field(default_factory=dict)  # module -> top-level names of other packages

    def unit(self, module: str) -> str:
        """The subpackage or top-level module a module belongs to (the package itself for its ``__init__``)."""
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else self.package

    def units(self) -> set[str]:
        return {self.unit(m) for m in self.files}

    def unit_edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {u: set() for u in self.units()}
        for source, targets in self.edges.items():
            out[self.unit(source)].update(self.unit(t) for t in targets)
        return out


def build_graph(package_dir: Path, package: str | None = None) -> ImportGraph:
    """The import graph of the package in ``package_dir``, with relative imports and ``from pkg import module``
    resolved to the module they load."""
    package = package or package_dir.name
    files = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = ImportGraph(package, files)

    def internal(name: str) -> str | None:  # the longest prefix of a dotted name that is a module of the package
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in files:
                return ".".join(parts[:end])
        return None

    for module, path in files.items():
        targets, external = set(), set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module
                # `from a import b` loads the module a.b where there is one, else (a name in) a.
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            for name in names:
                target = internal(name)
                if target is not None:
                    if target != module:
                        targets.add(target)
                else:
                    external.add(name.split(".")[0])
        graph.edges[module], graph.external[module] = targets, external
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan); self-loops are ignored."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if node not in index:
            visit(node)
    return sorted(found)


def upward_imports(graph: ImportGraph, layers: dict[str, int]) -> list[str]:
    """Imports from a unit to a unit of a higher layer (units missing from ``layers`` are reported elsewhere)."""
    out = []
    for source, targets in sorted(graph.edges.items()):
        for target in sorted(targets):
            a, b = graph.unit(source), graph.unit(target)
            if a in layers and b in layers and layers[b] > layers[a]:
                out.append(f"{source} (layer {layers[a]}) imports {target} (layer {layers[b]})")
    return out


def lightning_imports(graph: ImportGraph, units: list[str]) -> list[str]:
    """Imports of Lightning/torchmetrics or of a Lightning-side unit by a module of ``units``."""
    out = []
    for module in sorted(graph.files):
        if graph.unit(module) not in units:
            continue
        out += [f"{module} imports {root}" for root in sorted(graph.external[module] & LIGHTNING)]
        out += [f"{module} imports {t}" for t in sorted(graph.edges[module]) if graph.unit(t) in LIGHTNING_SIDE]
    return out


def unclassified(graph: ImportGraph, layers: dict[str, int]) -> set[str]:
    return graph.units() - set(layers)


GRAPH = build_graph(PACKAGE_DIR, PACKAGE)
EXISTING_MATH = [p for p in MATH_PACKAGES if p in GRAPH.units()]


def test_every_subpackage_is_placed_in_the_layer_table():
    assert EXISTING_MATH, "no math package found: the parametrized checks below would test nothing"
    assert {"nn", "models", "cli"} <= GRAPH.units(), f"the graph misses known subpackages: {sorted(GRAPH.units())}"
    missing = unclassified(GRAPH, LAYERS)
    assert not missing, f"place {sorted(missing)} in LAYERS of tests/test_layering.py"


@pytest.mark.parametrize("package", [PACKAGE, *EXISTING_MATH])
def test_math_packages_do_not_import_lightning(package):
    assert any(GRAPH.unit(m) == package for m in GRAPH.files)
    assert lightning_imports(GRAPH, [package]) == []


def test_imports_flow_downward():
    assert upward_imports(GRAPH, LAYERS) == []


def test_no_import_cycles_between_subpackages():
    assert cycles(GRAPH.unit_edges()) == []


def test_no_import_cycles_between_modules():
    assert sum(len(t) for t in GRAPH.edges.values()) > len(GRAPH.files), "the import graph is implausibly sparse"
    assert cycles(GRAPH.edges) == []


def test_lightning_is_imported_in_one_place():
    # lightning_ortho._lightning chooses between `lightning.pytorch` and `pytorch_lightning` (by importlib, so it has
    # no static import of either); every other module takes `pl` from it, so the choice holds everywhere.
    packages = {"pytorch_lightning", "lightning", "lightning_fabric"}
    offenders = sorted(m for m, roots in GRAPH.external.items() if roots & packages)
    assert offenders == [], f"{offenders} import Lightning by name; use `from lightning_ortho._lightning import pl`"
    assert any(f"{PACKAGE}._lightning" in targets for targets in GRAPH.edges.values())


def test_math_packages_import_without_lightning():
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in sorted(LIGHTNING))
    imports = "; ".join(f"import {PACKAGE}.{p}" for p in EXISTING_MATH)
    code = (
        f"import sys; {blocked}\n{imports}\n"
        "import torch, lightning_ortho.nn as n; print(n.AuxiliaryReflection(3)(torch.randn(2, 3)).shape)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- the checks find what they should


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "toy"


TOY = {
    "toy/__init__.py": "from toy.nn import a\n",
    "toy/nn/__init__.py": "from .a import A\n",
    "toy/nn/a.py": "import torch\nfrom . import b\nA = 1\n",
    "toy/nn/b.py": "from toy.nn.a import A\nfrom ..models import m\n",  # module cycle a <-> b; upward nn -> models
    "toy/nn/c.py": "def lazy():\n    from pytorch_lightning import Trainer\n",
    "toy/models/__init__.py": "",
    "toy/models/m.py": "import pytorch_lightning as pl\nfrom toy import nn\nimport toy.nn.c\n",
    "toy/extra/__init__.py": "from ..models.m import pl\n",
}
TOY_LAYERS = {"toy": 0, "nn": 0, "models": 1}


def test_graph_resolves_relative_and_from_package_imports(tmp_path):
    graph = build_graph(write_package(tmp_path, TOY))
    assert graph.edges == {
        "toy": {"toy.nn.a"},
        "toy.nn": {"toy.nn.a"},
        "toy.nn.a": {"toy.nn.b"},
        "toy.nn.b": {"toy.nn.a", "toy.models.m"},
        "toy.nn.c": set(),
        "toy.models": set(),
        "toy.models.m": {"toy.nn", "toy.nn.c"},
        "toy.extra": {"toy.models.m"},
    }
    assert graph.external["toy.nn.a"] == {"torch"} and graph.external["toy.nn.c"] == {"pytorch_lightning"}
    assert graph.units() == {"toy", "nn", "models", "extra"}


def test_checks_find_cycles_upward_and_lightning_imports(tmp_path):
    graph = build_graph(write_package(tmp_path, TOY))
    assert cycles(graph.edges) == [["toy.models.m", "toy.nn", "toy.nn.a", "toy.nn.b"]]
    assert cycles(graph.unit_edges()) == [["models", "nn"]]
    assert upward_imports(graph, TOY_LAYERS) == ["toy.nn.b (layer 0) imports toy.models.m (layer 1)"]
    assert lightning_imports(graph, ["nn"]) == ["toy.nn.b imports toy.models.m", "toy.nn.c imports pytorch_lightning"]
    assert unclassified(graph, TOY_LAYERS) == {"extra"}


def test_checks_pass_an_acyclic_downward_package(tmp_path):
    clean = {name: text for name, text in TOY.items() if name not in ("toy/nn/b.py", "toy/nn/c.py")}
    clean["toy/nn/a.py"] = "import torch\nA = 1\n"
    clean["toy/models/m.py"] = "import pytorch_lightning as pl\nfrom toy import nn\n"
    graph = build_graph(write_package(tmp_path, clean))
    assert cycles(graph.edges) == [] and cycles(graph.unit_edges()) == []
    assert upward_imports(graph, {**TOY_LAYERS, "extra": 1}) == [] and lightning_imports(graph, ["nn"]) == []
