"""What every monitor shares about modes and empty fits: a measurement leaves each submodule in its own mode (a
BatchNorm the user froze stays frozen), a named module is measured whatever its mode, and a fit in which a monitor
measured nothing (or never measured one of its modules) ends with a warning that says why and what to change."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.gradient_variance import GradientNoiseMonitor
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor
from lightning_ortho.nn import AuxiliaryReflection
from tests.callbacks.test_gradient_variance import (
    Recorder,
    UserMLP,
    brute_force,
    close,
    recomputed_gradients,
    user_data,
)

D = 4


def loader(rows: int = 16, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(rows, D, generator=g), torch.randn(rows, 1, generator=g)), batch_size)


def fit(trainer, model, data, **kwargs):
    return trainer(num_sanity_val_steps=0, **kwargs).fit(model, data)


def unmeasured(caught) -> list[str]:
    return [str(w.message) for w in caught if "measured" in str(w.message) and "in this fit" in str(w.message)]


# ------------------------------------------------------------------------------------ each module keeps its mode
class FrozenNorm(pl.LightningModule):
    """Something every monitor can measure, and a BatchNorm the user freezes at the start of each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.ortho = orthogonal(nn.Linear(D, D))
        self.reflection = AuxiliaryReflection(D, invertible=True)
        self.norm = nn.BatchNorm1d(D)
        self.head = nn.Linear(D, 1)

    def on_train_epoch_start(self) -> None:
        self.norm.eval()  # frozen: its running statistics must not change

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.head(self.norm(self.reflection(self.ortho(x)))), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_eval_mode_restores_each_submodules_own_mode_also_after_an_exception():
    from lightning_ortho.nn.eval_mode import eval_mode  # here: the old code has no such helper

    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2).eval(), nn.Sequential(nn.Dropout(), nn.Linear(2, 2)))
    modes = [m.training for m in model.modules()]
    assert modes == [True, True, False, True, True, True]
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == modes
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        raise RuntimeError("inside")
    assert [m.training for m in model.modules()] == modes


class NoisyInTraining(nn.Module):
    """Input noise while training; its ``train(mode)`` override sets the noise level (a pattern users write)."""

    def __init__(self) -> None:
        super().__init__()
        self.noise = 0.1

    def train(self, mode: bool = True):
        super().train(mode)
        self.noise = 0.1 if mode else 0.0
        return self

    def forward(self, x):
        return x + self.noise * torch.randn_like(x)


class FreezesItsBackbone(nn.Module):
    """A ``train(mode)`` override that keeps a part frozen whatever the mode (a common fine-tuning pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), NoisyInTraining())
        self.adapter = NoisyInTraining()

    def train(self, mode: bool = True):
        super().train(mode)
        self.backbone.eval()
        return self


def state(model: nn.Module) -> list[tuple[bool, float | None]]:
    return [(m.training, getattr(m, "noise", None)) for m in model.modules()]


def test_eval_mode_gives_each_module_its_mode_back_through_its_own_train_override():
    from lightning_ortho.nn.eval_mode import eval_mode

    model = nn.Sequential(FreezesItsBackbone(), nn.BatchNorm1d(2), NoisyInTraining(), NoisyInTraining())
    model.train()
    model[1].eval()  # a frozen BatchNorm
    model[3].eval()  # a frozen noise layer: no noise
    before = state(model)
    assert [noise for _, noise in before if noise is not None] == [0.0, 0.1, 0.1, 0.0]
    assert [training for training, _ in before] == [True, True, False, False, False, False, True, False, True, False]
    with eval_mode(model):
        assert all((not training and noise in (None, 0.0)) for training, noise in state(model))
    assert state(model) == before  # flags and what each train(mode) override set with them
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        raise RuntimeError("inside")
    assert state(model) == before


class NoisyModel(pl.LightningModule):
    """Noise in front of an orthogonal layer, and a record of what each training step sees."""

    def __init__(self) -> None:
        super().__init__()
        self.noisy, self.ortho, self.head = NoisyInTraining(), orthogonal(nn.Linear(D, D)), nn.Linear(D, 1)
        self.seen: list[tuple[bool, float]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.noisy.training, self.noisy.noise))
        x, y = batch
        return F.mse_loss(self.head(self.ortho(self.noisy(x))), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_training_after_a_measurement_runs_with_what_train_mode_set(tiny_trainer):
    model, monitor = NoisyModel(), OrthogonalityMonitor(every_n_steps=1, plot=False)
    fit(tiny_trainer, model, loader(), max_epochs=1, callbacks=[monitor], limit_val_batches=0)
    assert len(monitor.history) == 4
    assert model.seen == [(True, 0.1)] * 4  # not noise 0.0 left over from the measurement's eval()


# ------------------------------------------------------------------------------ a named module in eval mode
class Affine(nn.Module):
    """``y = x A^T + b`` with its inverse, a user's invertible layer: ``log|det J| = log|det A|`` everywhere."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.eye(D) + 0.3 * torch.randn(D, D, generator=g))
        self.bias = nn.Parameter(torch.randn(D, generator=g))

    def forward(self, x):
        return x @ self.weight.T + self.bias

    def inverse(self, y):
        return torch.linalg.solve(self.weight, (y - self.bias).T).T


class FrozenFlow(pl.LightningModule):
    """A pretrained flow the user froze (eval mode, no gradients) in front of a head that trains; ``live`` is a second
    invertible layer that trains, ``unused`` one that is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = Affine(seed=2).requires_grad_(False)
        self.live = Affine(seed=3)
        self.unused = Affine(seed=4)
        self.head = nn.Linear(D, 1)

    def on_train_epoch_start(self) -> None:
        self.flow.eval()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.head(self.live(self.flow(x))), y)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.05)


@pytest.mark.parametrize("monitor_class", [JacobianDeterminantMonitor, InvertibilityMonitor])
def test_a_named_module_in_eval_mode_is_measured_on_its_first_training_input(monitor_class, tiny_trainer):
    model = FrozenFlow().double()
    monitor = monitor_class(modules=["flow"], every_n_steps=2, probe_size=3, plot=False)
    data = loader()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tiny_trainer, model, data, max_epochs=1, precision="64-true", callbacks=[monitor])
    assert not unmeasured(caught)
    assert [record["step"] for record in monitor.history] == [2, 4]
    assert torch.equal(monitor.probes["flow"], next(iter(data))[0][:3].double())  # the training batch, not later
    logged = monitor.history[-1]["values"]
    if monitor_class is JacobianDeterminantMonitor:
        log_det = float(torch.linalg.slogdet(model.flow.weight)[1])  # the same for every row
        for key in ("log_abs_det_mean", "log_abs_det_min", "log_abs_det_max"):
            assert logged[f"jacobian/flow/{key}"] == pytest.approx(log_det, rel=1e-12, abs=1e-12), key
    else:
        assert logged["invertibility/flow/roundtrip_error_max"] < 1e-12


def test_a_frozen_automatically_chosen_module_is_left_alone_and_the_end_of_fit_warning_says_how_to_measure_it(
    tiny_trainer,
):
    # Chosen automatically: flow (frozen), live (trains), unused (never called). Only live is measured.
    monitor = InvertibilityMonitor(every_n_steps=2, plot=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tiny_trainer, FrozenFlow(), loader(), max_epochs=1, callbacks=[monitor])
    assert set(monitor._watched) == {"flow", "live", "unused"}
    assert [record["step"] for record in monitor.history] == [2, 4]
    assert {key.split("/")[1] for key in monitor.history[-1]["values"]} == {"live"}
    (message,) = unmeasured(caught)
    assert "InvertibilityMonitor never measured 2 of its modules in this fit (4 steps)" in message
    assert "'flow': it ran only in eval mode in training" in message and "modules=['flow', ...]" in message
    assert "'unused': it was never called as a module" in message and "'live'" not in message


class Unsized(torch.utils.data.IterableDataset):
    """Four batches an epoch, and no ``__len__`` (a stream): the loop cannot count the batches in advance."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(4):
            yield torch.randn(4, D, generator=g), torch.randn(4, 1, generator=g)


@pytest.mark.parametrize("monitor_class", [OrthogonalityMonitor, InvertibilityMonitor])
def test_the_last_batch_of_a_fit_on_a_loader_without_length_is_measured(monitor_class, tiny_trainer):
    monitor = monitor_class(every_n_steps=50, plot=False)
    saved = []

    class AtEpochEnd(pl.Callback):  # runs after the monitor's batch-end hook, as an epoch-end checkpoint would
        def on_train_epoch_end(self, trainer, pl_module):
            saved.append([record["step"] for record in monitor.history])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(
            tiny_trainer,
            FrozenNorm(),
            DataLoader(Unsized(), batch_size=None),
            max_epochs=2,
            callbacks=[monitor, AtEpochEnd()],
            limit_val_batches=0,
        )
    assert not unmeasured(caught)
    assert [record["step"] for record in monitor.history] == [8]
    assert saved == [[], [8]]  # measured at the last batch itself, before the last epoch ends


# ---------------------------------------------------------------------------------------- gradient noise
def test_a_window_is_the_last_steps_of_each_interval(tmp_path, tiny_trainer):
    # window_steps=4 and every_n_steps=8: a 16-step run reads steps 5-8 and 13-16 (grads[4:8], grads[12:16]) and
    # measures after steps 8 and 16, as every monitor with every_n_steps=8 does.
    pl.seed_everything(0)
    model, recorder = UserMLP(), Recorder()
    monitor = GradientNoiseMonitor(every_n_steps=8, window_steps=4, plot=False)
    data = DataLoader(user_data(128), batch_size=8)
    fit(tiny_trainer, model, data, max_epochs=1, precision="64-true", callbacks=[recorder, monitor])
    grads = recomputed_gradients(model, recorder.steps)
    assert len(grads) == 16 and [record["step"] for record in monitor.history] == [8, 16]
    for record, window in zip(monitor.history, (grads[4:8], grads[12:16]), strict=True):
        expected = brute_force(window, list(grads[0]), batch_size=8)
        for key in ("batch_variance", "mean_grad_sq", "signal", "snr", "noise_scale"):
            assert close(record["values"][f"gradient_noise/{key}"], expected[key], 1e-9), key


def test_early_stopping_on_the_noise_has_a_value_after_the_first_epoch_of_a_short_run(tiny_trainer):
    pl.seed_everything(0)
    monitor = GradientNoiseMonitor(every_n_steps=8, window_steps=4, plot=False)
    stopping = pl.callbacks.EarlyStopping(monitor="gradient_noise/snr", mode="max", patience=5)
    trainer = tiny_trainer(max_epochs=2, callbacks=[monitor, stopping])
    trainer.fit(UserMLP(), DataLoader(user_data(64), batch_size=8))  # 8 steps an epoch
    assert trainer.global_step == 16 and math.isfinite(float(trainer.callback_metrics["gradient_noise/snr"]))


def test_no_window_completed_ends_with_a_warning(tiny_trainer):
    monitor = GradientNoiseMonitor(every_n_steps=10, window_steps=10, plot=False)
    with pytest.warns(UserWarning, match=r"GradientNoiseMonitor measured nothing in this fit \(8 steps\)") as caught:
        tiny_trainer(max_epochs=1, callbacks=[monitor]).fit(UserMLP(), DataLoader(user_data(64), batch_size=8))
    assert monitor.history == []
    (message,) = unmeasured(caught)
    assert "the whole model: no window of window_steps=10 optimizer steps was completed" in message
    assert "the next one ends at step 9): train to at least 10 optimizer steps" in message
    assert "use a smaller window_steps (at least 2)" in message and "every_n_steps" not in message.split("):")[-1]
