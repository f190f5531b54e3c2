"""GradientNoiseMonitor's windows are the last ``window_steps`` steps of each interval, never continued across
intervals (a step skipped for inf/NaN gradients drops its window: with gradient accumulation, and across a resume
too), and the end-of-fit message of a fit with no complete window advises what would help."""

from __future__ import annotations

import math
import warnings

import pytest
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.gradient_variance import GradientNoiseMonitor
from tests.callbacks.test_gradient_variance import UserMLP, brute_force, close, trainer, user_data

KEYS = ("batch_variance", "mean_grad_sq", "signal", "snr", "noise_scale")


class SkipsAStep(UserMLP):
    """One optimizer step's gradient holds a NaN when the callbacks read it; the module then zeroes it before the
    optimizer runs, as a mixed-precision scaler skips such a step and training goes on."""

    def __init__(self, bad_step: int) -> None:
        super().__init__()
        self.bad_step = bad_step

    def on_after_backward(self):
        if self.global_step == self.bad_step:
            self.head.bias.grad[0] = math.nan

    def on_before_optimizer_step(self, optimizer):  # after the callbacks' hook of the same name
        for p in self.parameters():
            if p.grad is not None:
                p.grad.nan_to_num_(0.0)


class Gradients(pl.Callback):
    """The gradient the optimizer steps with, per optimizer step (float64 copies)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append({n: p.grad.double().clone() for n, p in pl_module.named_parameters() if p.grad is not None})


def unmeasured(caught) -> list[str]:
    return [str(w.message) for w in caught if "measured nothing in this fit" in str(w.message)]


def assert_windows(monitor, gradients, windows, batch_size, rel=1e-9):
    """Each logged record equals the brute-force statistics of its window of steps (one list of indices each)."""
    assert len(monitor.history) == len(windows)
    names = list(gradients.steps[0])
    for record, window in zip(monitor.history, windows, strict=True):
        expected = brute_force([gradients.steps[i] for i in window], names, batch_size)
        for key in KEYS:
            if not math.isfinite(expected[key]):  # undefined (noise_scale where the signal is not positive): not logged
                assert f"gradient_noise/{key}" not in record["values"], (window, key)
                continue
            assert close(record["values"][f"gradient_noise/{key}"], expected[key], rel), (window, key)


def test_a_skipped_step_drops_its_window_instead_of_finishing_it_an_interval_later(tmp_path):
    # window_steps=3, every_n_steps=10, 24 steps, NaN at step 8: the windows are steps 7-9 (dropped) and 17-19
    # (logged after step 20); steps 7 and 9 are never mixed with step 17.
    pl.seed_everything(0)
    gradients, monitor = Gradients(), GradientNoiseMonitor(every_n_steps=10, window_steps=3, plot=False)
    run = trainer(tmp_path, max_epochs=1, precision="64-true", callbacks=[gradients, monitor])
    with pytest.warns(UserWarning, match="inf or NaN"):
        run.fit(SkipsAStep(bad_step=8), DataLoader(user_data(8 * 24), batch_size=8))
    assert len(gradients.steps) == 24 and [record["step"] for record in monitor.history] == [20]
    assert_windows(monitor, gradients, [[17, 18, 19]], batch_size=8)


def test_with_gradient_accumulation_a_skipped_step_drops_its_window(tmp_path):
    # Two batches of 8 per optimizer step (batch size 16), 8 steps, window_steps=2, every_n_steps=4, NaN at step 2:
    # the windows are steps 2-3 (dropped) and 6-7, logged after step 8.
    pl.seed_everything(0)
    gradients, monitor = Gradients(), GradientNoiseMonitor(every_n_steps=4, window_steps=2, plot=False)
    run = trainer(
        tmp_path, max_epochs=1, precision="64-true", accumulate_grad_batches=2, callbacks=[gradients, monitor]
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*inf or NaN")
        run.fit(SkipsAStep(bad_step=2), DataLoader(user_data(8 * 16), batch_size=8))
    assert len(gradients.steps) == 8 and [record["step"] for record in monitor.history] == [8]
    assert_windows(monitor, gradients, [[6, 7]], batch_size=16)


def test_a_resume_with_an_incomplete_window_pending_measures_what_an_uninterrupted_fit_measures(tmp_path):
    # 3 steps an epoch, window_steps=3, every_n_steps=5: windows 2-4, 7-9; NaN at step 3. The checkpoint after epoch 1
    # holds the window's step 2; the resumed fit drops that window at its NaN and must not finish it with step 7. In float32: a 64-true resume rounds the
    # restored weights through the float32 model it builds.
    def fit(root, epochs, callbacks=(), ckpt_path=None):
        pl.seed_everything(0)
        gradients, monitor = Gradients(), GradientNoiseMonitor(every_n_steps=5, window_steps=3, plot=False)
        run = trainer(
            root,
            max_epochs=epochs,
            enable_checkpointing=bool(callbacks),
            callbacks=[gradients, monitor, *callbacks],
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*inf or NaN|.*ckpt_path|.*measured nothing")
            run.fit(SkipsAStep(bad_step=3), DataLoader(user_data(24), batch_size=8), ckpt_path=ckpt_path)
        return gradients, monitor

    gradients, straight = fit(tmp_path / "straight", 4)
    assert [record["step"] for record in straight.history] == [10]  # steps 7-9 (the fit ends at step 12)
    assert_windows(straight, gradients, [[7, 8, 9]], batch_size=8, rel=1e-5)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    _, first = fit(tmp_path / "first", 1, callbacks=[checkpoint])
    assert first.history == [] and first._steps == 1  # step 2, saved with the checkpoint
    _, resumed = fit(tmp_path / "resumed", 4, ckpt_path=checkpoint.last_model_path)
    assert resumed.history == straight.history


# ---------------------------------------------------------------------------------- the end-of-fit message
def test_under_fast_dev_run_the_message_does_not_advise_a_window_below_the_minimum(tmp_path):
    monitor = GradientNoiseMonitor(every_n_steps=10, window_steps=2, plot=False)  # the smallest window
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, fast_dev_run=True, callbacks=[monitor]).fit(
            UserMLP(), DataLoader(user_data(64), batch_size=8)
        )
    (message,) = unmeasured(caught)
    assert "window_steps" not in message.split(":")[-1]  # it is at its minimum already
    assert "in this fit's 1 steps (steps 0..0;" in message and "the next one ends at step 9" in message
    assert message.endswith("train to at least 10 optimizer steps.")  # nothing about window_steps or every_n_steps


def test_a_resumed_fit_that_falls_between_two_windows_is_advised_a_shorter_interval(tmp_path):
    # window_steps=2, every_n_steps=10: windows are steps 8-9, 18-19, ... The resumed fit runs steps 4-7: no window.
    def fit(root, epochs, callbacks=(), ckpt_path=None):
        monitor = GradientNoiseMonitor(every_n_steps=10, window_steps=2, plot=False)
        run = trainer(root, max_epochs=epochs, enable_checkpointing=bool(callbacks), callbacks=[monitor, *callbacks])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run.fit(UserMLP(), DataLoader(user_data(32), batch_size=8), ckpt_path=ckpt_path)  # 4 steps an epoch
        return monitor, unmeasured(caught)

    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    first, messages = fit(tmp_path / "first", 1, callbacks=[checkpoint])
    assert first.history == [] and len(messages) == 1
    resumed, (message,) = fit(tmp_path / "resumed", 2, ckpt_path=checkpoint.last_model_path)
    assert resumed.history == []
    assert "window_steps" not in message.split(":")[-1] and "shorter every_n_steps" in message
    assert "in this fit's 4 steps (steps 4..7;" in message and "the next one ends at step 9" in message
    assert message.endswith(
        "train to at least 10 optimizer steps, or use a shorter every_n_steps (every_n_steps=2 reads every step)."
    )


class GatedBranch(UserMLP):
    """A branch whose output is multiplied by 0 (a gate switched off): its gradient is exactly zero at every step,
    in windows where the rest of the model has real gradient noise."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(6, 16)

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.head(self.encoder(x) + 0.0 * self.gate(x)), y)


def test_a_group_without_gradient_is_not_measured_and_nothing_undefined_is_logged(tmp_path):
    pl.seed_everything(0)
    monitor = GradientNoiseMonitor(every_n_steps=3, window_steps=2, plot=False, verbose=False)
    run = trainer(tmp_path, max_steps=6, callbacks=[monitor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.fit(GatedBranch(), DataLoader(user_data(8 * 6), batch_size=8))
    assert [record["step"] for record in monitor.history] == [3, 6]
    for record in monitor.history:
        values = record["values"]
        assert not any(key.startswith("gradient_noise/gate/") for key in values), values  # before: snr nan, inf
        assert {"gradient_noise/head/snr", "gradient_noise/encoder/snr"} <= set(values)  # the others are measured
        assert all(math.isfinite(value) for value in values.values()), values
    assert not any(key.startswith("gradient_noise/gate/") for key in run.callback_metrics)
    messages = [str(w.message) for w in caught if "never measured" in str(w.message)]
    assert len(messages) == 1 and "'gate': its parameters had a zero gradient" in messages[0]
