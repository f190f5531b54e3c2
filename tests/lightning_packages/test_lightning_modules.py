"""lightning-ortho's LightningModules, data modules and CLI under the ``lightning`` package (``import lightning as
L``), and the rule that picks the package. Trainer runs go to fresh processes: the package is chosen once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ortho._lightning import PACKAGE_VARIABLE, choose_package

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, tmp_path: Path, **environment: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_ORTHO_")}
    env.update(environment, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def test_the_package_the_program_imported_first_is_used():
    assert choose_package({}, {"lightning.pytorch": object()}) == "lightning"
    assert choose_package({}, {"pytorch_lightning": object()}) == "pytorch_lightning"
    assert choose_package({}, {"pytorch_lightning": object(), "lightning.pytorch": object()}) == "lightning"
    # Neither imported yet: lightning where it is installed (lightning-ortho itself depends on pytorch_lightning only).
    assert choose_package({}, {}, installed=["lightning", "pytorch_lightning"]) == "lightning"
    assert choose_package({}, {}, installed=["pytorch_lightning"]) == "pytorch_lightning"
    with pytest.raises(ImportError, match="pip install pytorch-lightning"):
        choose_package({}, {}, installed=[])


def test_the_environment_variable_wins():
    imported = {"pytorch_lightning": object()}
    assert choose_package({PACKAGE_VARIABLE: "lightning"}, imported) == "lightning"
    assert choose_package({PACKAGE_VARIABLE: "pytorch-lightning"}, {"lightning.pytorch": 1}) == "pytorch_lightning"
    with pytest.raises(ValueError, match="use 'lightning' or 'pytorch_lightning'"):
        choose_package({PACKAGE_VARIABLE: "torch"}, imported)
    with pytest.raises(ImportError, match="lightning is not installed"):
        choose_package({PACKAGE_VARIABLE: "lightning"}, imported, installed=["pytorch_lightning"])


@pytest.mark.parametrize("value", ["bogus", "lightning"])
def test_the_command_refuses_a_package_it_cannot_use_in_one_line(value: str, tmp_path: Path):
    # "lightning" while lightning is hidden: a package that is not installed
    hide = "import sys; sys.modules['lightning'] = None\n" if value == "lightning" else ""
    code = f"{hide}from lightning_ortho.command import main\nmain(['fit', '--config', 'nowhere.yaml'])"
    result = run(code, tmp_path, **{PACKAGE_VARIABLE: value})
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Lightning package not available."), result.stderr
    assert PACKAGE_VARIABLE in lines[0]


def test_the_console_script_is_the_command_module():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lightning-ortho": "lightning_ortho.command:main"}


CALLBACKS_FIRST = """
from lightning_ortho.callbacks import OrthogonalityMonitor  # before the program's own Lightning import
import lightning as L
from lightning_ortho.models import OrthogonalClassifier

assert isinstance(OrthogonalClassifier(depth=1), L.LightningModule)
assert isinstance(OrthogonalityMonitor(), L.Callback)
print("ok")
"""


def test_importing_a_callback_before_lightning_still_gives_lightning_modules(tmp_path: Path):
    result = run(CALLBACKS_FIRST, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


MODULES_UNDER_LIGHTNING = """
import lightning as L
import torch
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks import OrthogonalityMonitor
from lightning_ortho.datamodules import AddingTaskDataModule, DigitsDataModule
from lightning_ortho.models import OnlineRNNModule, OrthogonalClassifier
from lightning_ortho.online import TanhRNNCell

assert pl is L.pytorch
data = DigitsDataModule(batch_size=32)
model = OrthogonalClassifier(in_features=64, num_classes=10, depth=1, orthogonal="aux")
assert isinstance(model, L.LightningModule) and isinstance(data, L.LightningDataModule)
trainer = L.Trainer(fast_dev_run=2, accelerator="cpu", callbacks=[OrthogonalityMonitor(every_n_steps=1)])
trainer.fit(model, data)
online = OnlineRNNModule(cell=TanhRNNCell(1, 8), output_size=2, loss="cross_entropy", estimator="uoro")
L.Trainer(fast_dev_run=2, accelerator="cpu").fit(online, AddingTaskDataModule(streams=4, chunk_length=8, chunks_per_epoch=4, val_streams=2, val_chunks=2))
print("trained", trainer.global_step)
"""


def test_models_and_data_modules_train_under_lightning(tmp_path: Path):
    result = run(MODULES_UNDER_LIGHTNING, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 2" in result.stdout


@pytest.mark.parametrize("recipe", ["fcnn_digits", "online_adding"])
def test_the_command_runs_a_recipe_under_lightning(recipe: str, tmp_path: Path):
    code = (
        "import lightning as L\n"
        "from lightning_ortho.cli import run_cli\n"
        f"cli = run_cli(['fit', '--config', {str(ROOT / 'recipes' / recipe)!r} + '.yaml', '--trainer.fast_dev_run=2',"
        " '--trainer.enable_progress_bar=false'])\n"
        "assert isinstance(cli.trainer, L.Trainer) and isinstance(cli.model, L.LightningModule)\n"
        "assert cli.trainer.global_step >= 2\n"
        "print('ok')"
    )
    result = run(code, tmp_path, **{PACKAGE_VARIABLE: "lightning"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


WRITER_UNDER_THE_OTHER_PACKAGE = """
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_ortho._lightning import PACKAGE
from lightning_ortho.callbacks import PredictionWriter

assert PACKAGE == "pytorch_lightning"  # the variable forces it; the project's Trainer is lightning's


class Scores(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 4)

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])


x, y = torch.randn(10, 3), torch.arange(10) % 4
writer = PredictionWriter(dirpath=".")
L.Trainer(accelerator="cpu", logger=False, callbacks=[writer]).predict(
    Scores(), DataLoader(TensorDataset(x, y), batch_size=4)
)
record = torch.load("predictions.pt")
assert record["predictions"].shape == (10, 4) and torch.equal(record["targets"], y), record.keys()
print("ok")
"""


def test_the_prediction_writer_serves_the_other_packages_trainer(tmp_path: Path):
    result = run(WRITER_UNDER_THE_OTHER_PACKAGE, tmp_path, **{PACKAGE_VARIABLE: "pytorch_lightning"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


MODULES_FIRST = """
import warnings
from lightning_ortho.models import OrthogonalClassifier  # sorted before `from pytorch_lightning import ...`
from pytorch_lightning import Trainer
from lightning_ortho._lightning import PACKAGE

assert PACKAGE == "lightning"  # installed beside pytorch_lightning, so chosen when neither had been imported
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    Trainer(accelerator="cpu", logger=False)
messages = [str(w.message) for w in caught if "lightning-ortho: this Trainer" in str(w.message)]
print(messages[0] if messages else "NO WARNING")
"""


def test_a_trainer_of_the_other_package_says_how_to_choose_it(tmp_path: Path):
    result = run(MODULES_FIRST, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1]
    assert "this Trainer is pytorch_lightning's" in line and "derive from lightning" in line, line
    assert f"{PACKAGE_VARIABLE}=pytorch_lightning" in line, line
