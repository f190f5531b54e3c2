"""Architecture rules of design.md, checked on the source: the math packages never import Lightning."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_ortho"
MATH_PACKAGES = ["nn", "flows", "online", "transforms"]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", MATH_PACKAGES)
def test_math_packages_do_not_import_lightning(package):
    for path in (PACKAGE / package).rglob("*.py") if (PACKAGE / package).exists() else []:
        for module in imported_modules(path):
            root = module.split(".")[0]
            assert root not in {"pytorch_lightning", "lightning", "lightning_fabric", "torchmetrics"}, (
                f"{path} imports {module}"
            )
            assert not module.startswith(
                (
                    "lightning_ortho.models",
                    "lightning_ortho.callbacks",
                    "lightning_ortho.datamodules",
                    "lightning_ortho.cli",
                )
            ), f"{path} imports {module}"


def test_single_lightning_namespace():
    for path in PACKAGE.rglob("*.py"):
        for module in imported_modules(path):
            assert module.split(".")[0] != "lightning", f"{path} imports {module}; use pytorch_lightning"


def test_math_package_imports_without_lightning():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pytorch_lightning'] = None; sys.modules['lightning'] = None\n"
        "import lightning_ortho.nn as n; print(n.AuxiliaryReflection(3)(__import__('torch').randn(2, 3)).shape)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
