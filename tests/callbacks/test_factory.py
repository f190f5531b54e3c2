"""The ``callbacks_factory`` entry point (both Lightning packages' groups): monitors switched on from the environment with no code
change (in a subprocess, as a user would), off when the variable is unset, clear errors for bad settings, and a
model with nothing to monitor trains on with one warning."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks import factory
from lightning_ortho.callbacks.factory import (
    MONITORS,
    monitors_from_environment,
    requested_monitors,
    settings_from_environment,
)
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor

VARIABLES = (
    "LIGHTNING_ORTHO_MONITORS",
    "LIGHTNING_ORTHO_EVERY_N_STEPS",
    "LIGHTNING_ORTHO_PROBE_SIZE",
    "LIGHTNING_ORTHO_PLOT",
)

#: A user's training script that knows nothing of lightning-ortho (run as a subprocess).
SCRIPT = textwrap.dedent(
    """
    import csv, json, sys
    from lightning_ortho._lightning import pl
    import torch
    from torch import nn
    from torch.nn.utils.parametrizations import orthogonal

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), orthogonal(nn.Linear(8, 8)), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.body(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    logger = pl.loggers.CSVLogger(sys.argv[1], name="run")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=logger, log_every_n_steps=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1])
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=8))
    with open(logger.experiment.metrics_file_path) as handle:
        columns = next(csv.reader(handle))
    print("RESULT " + json.dumps({"callbacks": [type(c).__name__ for c in trainer.callbacks], "columns": columns}))
    """
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


class Net(pl.LightningModule):
    def __init__(self, orthogonal_layer: bool = True) -> None:
        super().__init__()
        hidden = orthogonal(nn.Linear(8, 8)) if orthogonal_layer else nn.Linear(8, 8)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), hidden, nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)


def monitors_of(trainer: pl.Trainer) -> list:
    return [c for c in trainer.callbacks if isinstance(c, OrthogonalityMonitor)]


# ---------------------------------------------------------------------------------------------- entry point
@pytest.mark.parametrize(
    "group, function",
    [
        ("pytorch_lightning.callbacks_factory", factory.monitors_for_pytorch_lightning),
        ("lightning.pytorch.callbacks_factory", factory.monitors_for_lightning),
    ],
)
def test_the_entry_point_is_registered(group, function):
    points = importlib.metadata.entry_points(group=group)
    ours = [point for point in points if point.value.startswith("lightning_ortho.")]
    assert len(ours) == 1, "reinstall the package (pip install -e .) so that its entry point is registered"
    assert ours[0].load() is function


def test_a_user_script_logs_the_monitors_only_when_the_environment_asks(tmp_path):
    """The same script, run twice as a subprocess: with ``LIGHTNING_ORTHO_MONITORS=orthogonality`` its CSV log has the
    monitor's keys; without the variable it has none and the Trainer has no extra callback."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    base = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    runs = {}
    for label, extra in (
        ("on", {"LIGHTNING_ORTHO_MONITORS": "orthogonality", "LIGHTNING_ORTHO_EVERY_N_STEPS": "2"}),
        ("off", {}),
    ):
        (tmp_path / label).mkdir()
        runs[label] = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / label)],
            cwd=tmp_path,  # the installed package and its entry point, not the checkout on sys.path
            env={**base, **extra, "PYTHONWARNINGS": "ignore"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for label, process in runs.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        line = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert line, out[-2000:] + err[-2000:]
        results[label] = json.loads(line[-1][len("RESULT ") :])
    on, off = results["on"], results["off"]
    assert "OrthogonalityMonitor" in on["callbacks"]
    assert {
        "orthogonality/body.2/weight/orthogonality_fro",
        "orthogonality/body.2/weight/orthogonality_spectral",
    } <= set(on["columns"])
    assert "OrthogonalityMonitor" not in off["callbacks"] and "loss" in off["columns"]
    assert not [column for column in off["columns"] if column.startswith("orthogonality/")]
    assert not (tmp_path / "on" / "run" / "version_0" / "OrthogonalityMonitor.png").exists()  # plot defaults to off


def test_a_trainer_picks_up_the_environment_in_process(monkeypatch, tiny_trainer):
    assert monitors_of(tiny_trainer()) == []  # unset: nothing added
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    monkeypatch.setenv("LIGHTNING_ORTHO_EVERY_N_STEPS", "2")
    trainer = tiny_trainer(max_epochs=1)
    (monitor,) = monitors_of(trainer)
    assert type(monitor) is OrthogonalityMonitor and monitor.source == "environment" and monitor.every_n_steps == 2
    trainer.fit(Net(), loader())
    assert [record["step"] for record in monitor.history] == [2, 4]
    assert "orthogonality/body.2/weight/orthogonality_fro" in trainer.callback_metrics


# ------------------------------------------------------------------------------------------ configuration
def test_names_and_settings_are_parsed():
    assert requested_monitors({}) == [] and requested_monitors({"LIGHTNING_ORTHO_MONITORS": " , "}) == []
    assert requested_monitors({"LIGHTNING_ORTHO_MONITORS": "Orthogonality, gradient-noise orthogonality"}) == [
        "orthogonality",
        "gradient_noise",
    ]
    assert requested_monitors({"LIGHTNING_ORTHO_MONITORS": "all"}) == list(MONITORS)
    environ = {"LIGHTNING_ORTHO_EVERY_N_STEPS": "10", "LIGHTNING_ORTHO_PROBE_SIZE": " 4 ", "LIGHTNING_ORTHO_PLOT": "No"}
    assert settings_from_environment(environ) == {"every_n_steps": 10, "probe_size": 4, "plot": False}
    assert settings_from_environment({}) == {}


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "LIGHTNING_ORTHO_MONITORS",
            "orthogonality,jacobain",
            "unknown monitor 'jacobain'. Valid names: orthogonality, jacobian, invertibility, gradient_noise",
        ),
        ("LIGHTNING_ORTHO_EVERY_N_STEPS", "ten", "LIGHTNING_ORTHO_EVERY_N_STEPS='ten': must be a positive integer"),
        ("LIGHTNING_ORTHO_EVERY_N_STEPS", "0", "must be a positive integer"),
        ("LIGHTNING_ORTHO_PROBE_SIZE", "2.5", "LIGHTNING_ORTHO_PROBE_SIZE='2.5'"),
        ("LIGHTNING_ORTHO_PLOT", "maybe", "LIGHTNING_ORTHO_PLOT='maybe': must be 1 or 0"),
    ],
)
def test_bad_settings_fail_when_the_trainer_is_built(monkeypatch, tiny_trainer, variable, value, message):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny_trainer()


def test_a_setting_no_requested_monitor_takes_is_a_warning(monkeypatch):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    monkeypatch.setenv("LIGHTNING_ORTHO_PROBE_SIZE", "4")  # OrthogonalityMonitor needs no probe
    with pytest.warns(UserWarning, match="probe_size set in the environment, but none of the monitors orthogonality"):
        (monitor,) = monitors_from_environment()
    assert isinstance(monitor, OrthogonalityMonitor)


def test_an_unimportable_monitor_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(MONITORS, "orthogonality", "lightning_ortho.callbacks.not_there:Nothing")
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    with pytest.raises(ImportError, match="asks for 'orthogonality', but lightning_ortho.callbacks.not_there:Nothing"):
        monitors_from_environment()


@pytest.mark.parametrize("name", list(MONITORS))
def test_every_registered_monitor_can_be_built_from_the_environment(monkeypatch, name):
    module_name, _, class_name = MONITORS[name].partition(":")
    module = pytest.importorskip(module_name, reason=f"{module_name} is not in this checkout yet")
    if not hasattr(module, class_name):
        pytest.skip(f"{module_name} has no {class_name} yet")
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", name)
    monkeypatch.setenv("LIGHTNING_ORTHO_EVERY_N_STEPS", "7")
    (monitor,) = monitors_from_environment()
    assert type(monitor) is factory.monitor_class(name) and monitor.every_n_steps == 7
    assert monitor.source == "environment" and monitor.state_key.endswith("{'source': 'environment'}")


# --------------------------------------------------------------------------------- behaviour in training
def test_nothing_to_monitor_is_one_warning_and_training_goes_on(monkeypatch, tiny_trainer):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    trainer = tiny_trainer(max_epochs=1)
    (monitor,) = monitors_of(trainer)
    with pytest.warns(
        UserWarning, match="turned on OrthogonalityMonitor .* cannot run on Net: .*no module this monitor can measure"
    ):
        trainer.fit(Net(orthogonal_layer=False), loader())
    assert monitor.idle and monitor.history == [] and trainer.global_step == 4
    assert not [key for key in trainer.callback_metrics if key.startswith("orthogonality/")]


def test_a_users_own_monitor_wins_over_the_environment(monkeypatch, tiny_trainer):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    mine = OrthogonalityMonitor(every_n_steps=3)
    trainer = tiny_trainer(max_epochs=1, callbacks=[mine])  # no "more than one stateful callback" error
    (_, from_environment) = monitors_of(trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), loader())
    assert not [w for w in caught if "lightning-ortho" in str(w.message)]  # standing aside is not a warning
    assert from_environment.idle and from_environment.history == []
    assert [record["step"] for record in mine.history] == [3, 4]


def test_standing_aside_names_the_users_monitor_by_its_own_class(monkeypatch, tiny_trainer):
    from lightning_ortho.callbacks.gradient_variance import GradientNoiseMonitor, GradientVarianceMonitor
    from lightning_ortho.callbacks.monitors import source as _monitor_source

    said = []
    monkeypatch.setattr(_monitor_source, "rank_zero_info", said.append)
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "gradient_noise")
    with pytest.warns(FutureWarning, match="GradientVarianceMonitor is deprecated"):
        mine = GradientVarianceMonitor(every_n_steps=2, window_steps=2)  # a subclass: named by its own class
    trainer = tiny_trainer(max_epochs=1, callbacks=[mine])
    (from_environment,) = [c for c in trainer.callbacks if c is not mine and isinstance(c, GradientNoiseMonitor)]
    trainer.fit(Net(), loader())
    assert from_environment.idle
    assert said == [
        "lightning-ortho: the Trainer already has a GradientVarianceMonitor; the GradientNoiseMonitor from "
        "LIGHTNING_ORTHO_MONITORS stands aside."
    ]


def test_monitors_from_the_environment_pickle_and_checkpoint(monkeypatch, tiny_trainer, tmp_path):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    monkeypatch.setenv("LIGHTNING_ORTHO_EVERY_N_STEPS", "2")
    trainer = tiny_trainer(max_epochs=1)
    (monitor,) = monitors_of(trainer)
    copy = pickle.loads(pickle.dumps(monitor))  # ddp_spawn pickles the Trainer with its callbacks before fit
    assert type(copy) is type(monitor) and isinstance(copy, OrthogonalityMonitor) and copy.every_n_steps == 2
    assert copy.state_key == monitor.state_key == "OrthogonalityMonitor{'source': 'environment'}"
    trainer.fit(Net(), loader())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]
    assert state[monitor.state_key]["history"] == monitor.history and len(monitor.history) == 2


# ------------------------------------------------------------------- settings a monitor's constructor refuses
def test_an_interval_below_a_monitors_minimum_is_raised_to_it_with_a_warning(monkeypatch, tiny_trainer):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "all")
    monkeypatch.setenv("LIGHTNING_ORTHO_EVERY_N_STEPS", "1")  # GradientNoiseMonitor needs windows of 2 steps
    with pytest.warns(UserWarning) as caught:
        trainer = tiny_trainer(max_epochs=1)
    (message,) = [str(w.message) for w in caught if "LIGHTNING_ORTHO_EVERY_N_STEPS" in str(w.message)]
    assert "LIGHTNING_ORTHO_EVERY_N_STEPS=1, but GradientNoiseMonitor ('gradient_noise')" in message
    assert "needs every_n_steps >= 2; it uses every_n_steps=2." in message
    steps = {type(c).__name__: c.every_n_steps for c in trainer.callbacks if getattr(c, "source", "") == "environment"}
    assert steps == {
        "OrthogonalityMonitor": 1,
        "JacobianDeterminantMonitor": 1,
        "InvertibilityMonitor": 1,
        "GradientNoiseMonitor": 2,
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*it cannot run on Net")  # no flow in Net: those two stand aside
        trainer.fit(Net(), loader())  # and it trains: 4 steps, a window of 2 every 2 steps
    (noise,) = [c for c in trainer.callbacks if type(c).__name__ == "GradientNoiseMonitor"]
    assert [record["step"] for record in noise.history] == [2, 4] and noise.window_steps == 2


class PickyMonitor(OrthogonalityMonitor):
    """A monitor whose constructor refuses settings the factory's parsing accepts."""

    def __init__(self, every_n_steps: int = 50, plot: bool = True) -> None:
        if every_n_steps > 100:
            raise ValueError(f"PickyMonitor: every_n_steps must be at most 100, got {every_n_steps}.")
        super().__init__(every_n_steps=every_n_steps, plot=plot)


def test_a_setting_a_monitors_constructor_refuses_falls_back_to_its_default_with_a_warning(monkeypatch, tiny_trainer):
    monkeypatch.setitem(MONITORS, "orthogonality", f"{__name__}:PickyMonitor")
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "orthogonality")
    monkeypatch.setenv("LIGHTNING_ORTHO_EVERY_N_STEPS", "500")
    monkeypatch.setenv("LIGHTNING_ORTHO_PLOT", "0")
    with pytest.warns(UserWarning, match="PickyMonitor \\('orthogonality'\\) refuses") as caught:
        trainer = tiny_trainer(max_epochs=1)
    message = str(caught[0].message)
    assert "LIGHTNING_ORTHO_EVERY_N_STEPS=500, LIGHTNING_ORTHO_PLOT=False" in message
    assert "every_n_steps must be at most 100, got 500" in message
    assert "it uses its defaults instead: every_n_steps=50, plot=True" in message
    (monitor,) = [c for c in trainer.callbacks if isinstance(c, PickyMonitor)]
    assert monitor.every_n_steps == 50 and monitor.plot is True


# ------------------------------------------------------------------------------------------ short fits
def test_a_fit_too_short_for_a_monitor_from_the_environment_is_said_at_info_level(monkeypatch, tiny_trainer):
    # GradientNoiseMonitor at its defaults needs 20 steps; this fit has 4. Turned on for every run, it must not
    # warn on each short one; the message is still there, at info level.
    import lightning_ortho.callbacks.monitors.report as monitor_module

    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "gradient_noise")
    trainer = tiny_trainer(max_epochs=1)
    # Read at the call: which logger Lightning's rank_zero_info writes to depends on which of pytorch_lightning and
    # lightning_fabric this process imported last, and earlier tests may have changed its level.
    infos: list[str] = []
    monkeypatch.setattr(monitor_module, "rank_zero_info", lambda message, *args, **kwargs: infos.append(message))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), loader())
    assert trainer.global_step == 4
    assert not [w for w in caught if "in this fit" in str(w.message)]
    (info,) = [message for message in infos if "measured nothing in this fit" in message]
    assert (
        info.startswith("GradientNoiseMonitor measured nothing in this fit (4 steps)") and "train to at least" in info
    )


class NaNGradients(Net):
    """Every step's gradient holds a NaN when the callbacks read it (then zeroed, so that training goes on)."""

    def on_after_backward(self):
        self.body[0].bias.grad[0] = float("nan")

    def on_before_optimizer_step(self, optimizer):
        for p in self.parameters():
            p.grad.nan_to_num_(0.0)


def test_a_monitor_from_the_environment_still_warns_when_a_long_enough_fit_measured_nothing(monkeypatch, tiny_trainer):
    monkeypatch.setenv("LIGHTNING_ORTHO_MONITORS", "gradient_noise")
    monkeypatch.setenv("LIGHTNING_ORTHO_EVERY_N_STEPS", "2")  # a window of 2 steps every 2: all 4 steps are read
    with pytest.warns(UserWarning, match="GradientNoiseMonitor measured nothing in this fit") as caught:
        tiny_trainer(max_epochs=1).fit(NaNGradients(), loader())
    (message,) = [str(w.message) for w in caught if "in this fit" in str(w.message)]
    assert "4 of them had inf or NaN gradients and were left out" in message
