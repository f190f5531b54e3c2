"""The core install: with every optional dependency blocked (``None`` in ``sys.modules``, so imports of it fail as if
it were not installed), every module of the package imports, the main job (the FCNN on the embedded digits through
the CLI) runs, and each use of a missing extra fails with an error that names the extra to install."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from lightning_ortho._extras import EXTRAS, MissingExtraError, require

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import importlib, json, pkgutil, sys, tempfile
from pathlib import Path

import importlib.metadata as metadata

BLOCKED = {"torchvision": "torchvision", "networkx": "networkx", "PIL": "pillow", "matplotlib": "matplotlib"}
for name in BLOCKED:
    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError, as if it were not installed
# Libraries that ask the package metadata first (torchmetrics, Lightning) must not find them either.
_version, _distribution = metadata.version, metadata.distribution


def _hidden(original):
    def lookup(name):
        if name.lower() in BLOCKED.values():
            raise metadata.PackageNotFoundError(name)
        return original(name)

    return lookup


metadata.version, metadata.distribution = _hidden(_version), _hidden(_distribution)

import torch
import lightning_ortho

imported = []
for module in pkgutil.walk_packages(lightning_ortho.__path__, "lightning_ortho."):
    importlib.import_module(module.name)
    imported.append(module.name)

from lightning_ortho.callbacks import GlowImageGrids
from lightning_ortho.datamodules import CIFAR10DataModule, ImagePatchesDataModule, MNISTDataModule
from lightning_ortho.transforms import learn_m_transform
from lightning_ortho.transforms.compression import compress_linear

folder = Path(tempfile.mkdtemp())
(folder / "photo.png").write_bytes(b"not read: Pillow is missing before the file is opened")
uses = {
    "MNISTDataModule": lambda: MNISTDataModule(root=str(folder)).setup("fit"),
    "CIFAR10DataModule": lambda: CIFAR10DataModule(root=str(folder)).setup("fit"),
    "GlowImageGrids": lambda: GlowImageGrids(),
    "learn_m_transform": lambda: learn_m_transform(torch.randn(32, 8, dtype=torch.float64), q=2, s=2),
    "compress_linear(family='m')": lambda: compress_linear(torch.nn.Linear(8, 4), "m", q=2, s=2, progress=False),
    "ImagePatchesDataModule (sample photographs)": lambda: ImagePatchesDataModule().setup("fit"),
    "ImagePatchesDataModule (image files)": lambda: ImagePatchesDataModule(root=str(folder)).setup("fit"),
}
errors = {}
for name, use in uses.items():
    try:
        use()
        errors[name] = None
    except Exception as error:
        errors[name] = [type(error).__name__, str(error)]

from lightning_ortho.cli import run_cli

cli = run_cli([
    "fit", "--config", "recipes/fcnn_digits.yaml", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
    f"--trainer.default_root_dir={folder}",
])
fit = {"steps": cli.trainer.global_step, "val_acc": float(cli.trainer.callback_metrics["val_acc"])}

import contextlib, io
from lightning_ortho.cli import main

stderr = io.StringIO()
try:
    with contextlib.redirect_stderr(stderr):
        main(["fit", "--config", "recipes/fcnn_mnist.yaml", f"--data.init_args.root={folder}", "--trainer.fast_dev_run=1"])
    code = 0
except SystemExit as stop:
    code = stop.code
command = {"code": code, "stderr": stderr.getvalue()}
print("RESULT" + json.dumps({"imported": imported, "errors": errors, "fit": fit, "command": command}))
"""

EXPECTED = {
    "MNISTDataModule": "vision",
    "CIFAR10DataModule": "vision",
    "GlowImageGrids": "vision",
    "learn_m_transform": "transforms",
    "compress_linear(family='m')": "transforms",
    "ImagePatchesDataModule (sample photographs)": "transforms",
    "ImagePatchesDataModule (image files)": "transforms",
}


@pytest.fixture(scope="module")
def without_extras():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT"))


def test_every_module_imports_and_the_main_job_runs_without_the_extras(without_extras):
    imported = set(without_extras["imported"])
    every = {
        "lightning_ortho." + ".".join(p.relative_to(ROOT / "lightning_ortho").with_suffix("").parts)
        for p in (ROOT / "lightning_ortho").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert every <= imported, sorted(every - imported)
    assert without_extras["fit"]["steps"] == 2 and 0 <= without_extras["fit"]["val_acc"] <= 1


@pytest.mark.parametrize("use", sorted(EXPECTED))
def test_each_use_of_a_missing_extra_names_the_extra(without_extras, use):
    kind, message = without_extras["errors"][use]
    assert kind == "MissingExtraError", message
    assert f'pip install "lightning-ortho[{EXPECTED[use]}]"' in message, message


def test_the_command_ends_a_missing_extra_with_its_message_not_a_traceback(without_extras):
    command = without_extras["command"]
    assert command["code"] == 2, command
    assert "Optional dependency missing." in command["stderr"] and "Traceback" not in command["stderr"]
    assert 'pip install "lightning-ortho[vision]"' in command["stderr"]


def test_the_extras_in_pyproject_install_what_the_errors_name():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    core = " ".join(project["dependencies"]).lower()
    for distribution, extra in EXTRAS.values():
        assert any(d.lower().startswith(distribution.lower()) for d in extras[extra]), (distribution, extra)
        assert distribution.lower() not in core  # optional, not core
    assert extras["all"] == ["lightning-ortho[vision,transforms,plots]"]
    assert "lightning-ortho[vision,transforms,plots]" in extras["test"]  # the suite needs every extra
    assert any(d.startswith("lightning>=") for d in extras["test"]) and "docs" in extras
    # `import lightning as L` users: the extra installs the unified package, at the test extra's pin
    assert extras["lightning"] == [d for d in extras["test"] if d.startswith("lightning>=")]
    assert not [d for d in project["dependencies"] if d.startswith("torch") and "<" in d]  # no upper pin on torch


def test_require_names_the_extra_and_lets_other_import_errors_through(monkeypatch):
    monkeypatch.setitem(sys.modules, "networkx", None)
    with pytest.raises(
        MissingExtraError, match=r'finds matchings with networkx.*pip install "lightning-ortho\[transforms\]"'
    ):
        require("networkx", "it finds matchings")
    with pytest.raises(ModuleNotFoundError) as caught:
        require("matplotlib.no_such_module_here", "it plots")
    assert not isinstance(caught.value, MissingExtraError)  # matplotlib is there: not a missing extra
