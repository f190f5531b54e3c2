"""A monitor in a YAML config (what LightningCLI reads through jsonargparse): ``modules`` names classes by import
path and submodules by name, and jsonargparse hands the monitor the classes themselves (from the annotation
``Sequence[type[nn.Module] | str]``); a class path in Python code is refused with the way to pass the class."""

import pytest
from jsonargparse import ArgumentParser
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.flows import Invertible1x1Conv

CONFIG = """
callback:
  class_path: lightning_ortho.callbacks.jacobian_monitor.JacobianDeterminantMonitor
  init_args:
    modules: [lightning_ortho.flows.Invertible1x1Conv, torch.nn.Linear, glow.flows.0]
    every_n_steps: 5
"""


def test_a_yaml_config_gives_the_monitor_classes_and_names():
    parser = ArgumentParser()
    parser.add_argument("--callback", type=pl.Callback)
    callback = parser.instantiate(parser.parse_string(CONFIG)).callback
    assert isinstance(callback, JacobianDeterminantMonitor) and callback.every_n_steps == 5
    assert callback.modules == [Invertible1x1Conv, nn.Linear, "glow.flows.0"]


def test_a_class_path_string_in_code_is_refused_with_the_way_to_pass_the_class():
    monitor = JacobianDeterminantMonitor(modules=["torch.nn.Linear"])
    with pytest.raises(ValueError, match=r"pass the class itself \(modules=\[Linear\]\), not its import path"):
        monitor.select(nn.Sequential(nn.Linear(2, 2)))
