"""GradientNoiseMonitor follows the model's parameters when layers are replaced during a fit (as TransformCompression
does): the groups are rebuilt from the new parameters, the window in progress is dropped, and one info line says
so. Parameters that an optimizer holds beyond the model's trainable ones change nothing."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

import lightning_ortho.callbacks.gradient_noise as gradient_noise_module
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.gradient_variance import GradientNoiseMonitor
from tests.callbacks.test_gradient_noise_windows import KEYS, Gradients
from tests.callbacks.test_gradient_variance import UserMLP, brute_force, close, logged, trainer, user_data


class Codes(nn.Module):
    """A stand-in for a compressed layer: other parameters (``codes``, ``bias``) computing a linear map."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.codes = nn.Parameter(0.5 * linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return F.linear(x, self.codes, self.bias)


class ReplacesHead(pl.Callback):
    """Before the forward of optimizer step ``at_step``, replace ``head`` by :class:`Codes` and re-create the
    optimizers (so the new parameters train), as TransformCompression does between epochs."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at_step and not isinstance(pl_module.head, Codes):
            pl_module.head = Codes(pl_module.head)
            trainer.strategy.setup_optimizers(trainer)


def _fit(tmp_path, monkeypatch, monitor, model, at_step=None, steps=12):
    infos: list[str] = []
    monkeypatch.setattr(
        gradient_noise_module, "rank_zero_info", lambda message, *a, **k: infos.append(message), raising=False
    )
    pl.seed_everything(0)
    gradients = Gradients()
    callbacks = ([] if at_step is None else [ReplacesHead(at_step)]) + [gradients, monitor]
    run = trainer(tmp_path, max_epochs=1, precision="64-true", callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*measured nothing")
        run.fit(model, DataLoader(user_data(8 * steps), batch_size=8))
    assert len(gradients.steps) == steps
    return gradients, [message for message in infos if "trainable parameters changed" in message]


def _assert_window(record, gradients, window, groups):
    """The record's statistics of each group equal the brute-force ones of its parameters over the window."""
    names = list(gradients.steps[window[0]])
    for group in groups:
        members = [n for n in names if not group or n.startswith(group + ".")]
        expected = brute_force([gradients.steps[i] for i in window], members, batch_size=8)
        prefix = f"gradient_noise/{group}/" if group else "gradient_noise/"
        for key in KEYS:
            assert close(logged(record, prefix + key), expected[key], 1e-9), (window, group, key)


def test_a_layer_replaced_between_windows_is_measured_in_the_windows_after(tmp_path, monkeypatch):
    # Windows of 2 steps every 2: the head becomes Codes at step 4, the first step of a window. The groups '' and
    # 'head' then hold head.codes and head.bias; nothing is dropped (no window was in progress).
    monitor = GradientNoiseMonitor(every_n_steps=2, window_steps=2, plot=False)
    gradients, said = _fit(tmp_path, monkeypatch, monitor, UserMLP(), at_step=4)
    assert "head.codes" in gradients.steps[4] and "head.weight" not in gradients.steps[4]
    assert [record["step"] for record in monitor.history] == [2, 4, 6, 8, 10, 12]
    for w, record in enumerate(monitor.history):
        _assert_window(record, gradients, [2 * w, 2 * w + 1], groups=("", "encoder", "head"))
    assert monitor._groups["head"] == ["head.codes", "head.bias"]
    (message,) = said
    assert "changed at step 4 (new: head.codes, head.bias; gone: head.weight, head.bias)" in message
    assert "window in progress" not in message


def test_a_layer_replaced_inside_a_window_drops_that_window_and_says_so_once(tmp_path, monkeypatch):
    # Windows of 3 steps every 3: the head is replaced at step 4, inside the window of steps 3-5, which would mix
    # the gradients of two different heads: it is dropped. Measured: steps 0-2, 6-8, 9-11.
    monitor = GradientNoiseMonitor(every_n_steps=3, window_steps=3, plot=False)
    gradients, said = _fit(tmp_path, monkeypatch, monitor, UserMLP(), at_step=4)
    assert [record["step"] for record in monitor.history] == [3, 9, 12]
    for record, window in zip(monitor.history, ([0, 1, 2], [6, 7, 8], [9, 10, 11]), strict=True):
        _assert_window(record, gradients, window, groups=("", "encoder", "head"))
    (message,) = said
    assert "changed at step 4" in message and "the window in progress (1 step, of the old parameters)" in message
    assert "'the whole model': 4 tensors, 'encoder': 2 tensors, 'head': 2 tensors" in message


class ExtraParameter(UserMLP):
    """An optimizer that also steps a parameter the model does not register (a learnable loss weight kept
    outside the module): not the model's, so no parameter change."""

    def __init__(self):
        super().__init__()
        self.extra = [nn.Parameter(torch.ones((), dtype=torch.float64))]

    def configure_optimizers(self):
        return torch.optim.SGD([*(p for p in self.parameters() if p.requires_grad), *self.extra], lr=self.lr)


def test_an_optimizers_own_parameters_are_no_change_and_are_checked_once(tmp_path, monkeypatch):
    from lightning_ortho.callbacks._watched_parameters import WatchedParameters

    checks = []
    changed = WatchedParameters.changed
    monkeypatch.setattr(WatchedParameters, "changed", lambda self, model: checks.append(1) or changed(self, model))
    monitor = GradientNoiseMonitor(every_n_steps=2, window_steps=2, plot=False)
    gradients, said = _fit(tmp_path, monkeypatch, monitor, ExtraParameter())
    assert said == [] and [record["step"] for record in monitor.history] == [2, 4, 6, 8, 10, 12]
    for w, record in enumerate(monitor.history):
        _assert_window(record, gradients, [2 * w, 2 * w + 1], groups=("", "encoder", "head"))
    # on_train_start, the one epoch start, and the first step that met the extra parameter: not every step
    assert len(checks) == 3


@pytest.mark.parametrize("at_step", [0, 5])
def test_the_monitor_keeps_no_replaced_parameter_alive_after_the_fit(at_step, tmp_path, monkeypatch):
    model, monitor = UserMLP(), GradientNoiseMonitor(every_n_steps=2, window_steps=2, plot=False)
    replaced = weakref.ref(model.head.weight)
    _fit(tmp_path, monkeypatch, monitor, model, at_step=at_step)
    gc.collect()
    assert isinstance(model.head, Codes) and replaced() is None
