"""A user's project that knows nothing of lightning-ortho's models: its own LightningModule, written with the
Lightning package named on the command line (``lightning``: ``import lightning as L``, or ``pytorch_lightning``),
using lightning-ortho's monitors three ways. Run by test_user_project.py in a fresh process:

    python user_project.py <lightning|pytorch_lightning> <code|yaml|environment> <output folder>

It trains a few steps with a CSVLogger and prints one JSON line: the monitor callbacks the Trainer had, the steps at
which the project's own ``self.log`` values and each monitor key were logged, and whether they are ``Callback``s of
the package in use.
"""

# ruff: noqa: E402  (the project imports its Lightning package first, as users do)
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

package, route, output = sys.argv[1], sys.argv[2], Path(sys.argv[3])
if package == "lightning":
    import lightning as L
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import CSVLogger
else:
    import pytorch_lightning as L
    from pytorch_lightning.cli import LightningCLI
    from pytorch_lightning.loggers import CSVLogger

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho.callbacks import Monitor
from lightning_ortho.nn import AuxiliaryReflection

MONITORS = ["OrthogonalityMonitor", "JacobianDeterminantMonitor", "InvertibilityMonitor", "GradientNoiseMonitor"]


class UserModel(L.LightningModule):
    """A small regressor: an orthogonal map (torch's parametrization), an invertible auxiliary reflection, a head."""

    def __init__(self, width: int = 6, lr: float = 0.05) -> None:
        super().__init__()
        self.rotation = nn.utils.parametrizations.orthogonal(nn.Linear(width, width))
        self.reflection = AuxiliaryReflection(width, invertible=True)
        self.head = nn.Linear(width, 1)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.reflection(self.rotation(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x).squeeze(-1), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(96, 6, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(-1)), batch_size=8)


def trainer_options() -> dict:
    return {
        "max_steps": 12,
        "log_every_n_steps": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "accelerator": "cpu",
        "devices": 1,
    }


def monitor_settings(name: str) -> dict:
    return {"every_n_steps": 3, "window_steps": 2} if name == "GradientNoiseMonitor" else {"every_n_steps": 3}


if route == "code":
    import lightning_ortho.callbacks as callbacks

    monitors = [getattr(callbacks, name)(**monitor_settings(name)) for name in MONITORS]
    trainer = L.Trainer(logger=CSVLogger(output, name="run"), callbacks=monitors, **trainer_options())
    trainer.fit(UserModel())
elif route == "yaml":
    import yaml

    config = {
        "trainer": {
            **trainer_options(),
            "logger": {"class_path": "CSVLogger", "init_args": {"save_dir": str(output), "name": "run"}},
            "callbacks": [
                {"class_path": f"lightning_ortho.callbacks.{name}", "init_args": monitor_settings(name)}
                for name in MONITORS
            ],
        }
    }
    (output / "config.yaml").write_text(yaml.safe_dump(config))
    cli = LightningCLI(UserModel, args=["fit", "--config", str(output / "config.yaml")], save_config_callback=None)
    trainer = cli.trainer
else:  # the environment switch: LIGHTNING_ORTHO_MONITORS is set by the caller
    trainer = L.Trainer(logger=CSVLogger(output, name="run"), **trainer_options())
    trainer.fit(UserModel())

steps: dict[str, list[int]] = {}
with open(Path(trainer.logger.log_dir) / "metrics.csv") as file:
    for row in csv.DictReader(file):
        for key, value in row.items():
            if key not in ("step", "epoch") and value != "":
                steps.setdefault(key, []).append(int(row["step"]))
monitors = [type(c).__name__ for c in trainer.callbacks if isinstance(c, Monitor)]
print(
    json.dumps(
        {
            "monitors": monitors,
            "callbacks_of_the_package": all(isinstance(c, L.Callback) for c in trainer.callbacks),
            "steps": steps,
        }
    )
)
