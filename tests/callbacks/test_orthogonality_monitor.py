"""OrthogonalityMonitor on a user's own LightningModule: what it logs equals a brute-force computation from the
matrices themselves (an SVD of Q, reflections multiplied out one by one, the singular values), drifted maps report
their drift, every_n_steps holds, history survives a checkpoint, and bad configurations are clear errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.orthogonality_monitor import OrthogonalityMonitor
from lightning_ortho.nn import AuxiliaryReflection, SVDLinear, orthogonal_map
from lightning_ortho.nn import orthogonal as ortho_weight

ROOT = Path(__file__).resolve().parents[2]


class UserMLP(pl.LightningModule):
    """What a user writes: a plain MLP whose hidden layers use torch's orthogonal parametrization (one square, one
    tall rectangular), with two of our maps and an SVDLinear head."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.inp = nn.Linear(8, 16)
        self.hidden = orthogonal(nn.Linear(16, 16))
        self.expand = orthogonal(nn.Linear(16, 24))  # weight (24, 16): Q^T Q is the smaller Gram
        self.squeeze = nn.Linear(24, 16)
        self.rotate = orthogonal_map(16, "cayley")  # our ParametrizedOrthogonal (wraps torch's parametrization)
        self.reflect = orthogonal_map(16, "householder")
        self.head = SVDLinear(16, 4, orthogonal="householder")
        with torch.no_grad():
            self.head.singular_values.copy_(torch.tensor([-2.0, 0.5, 1.0, 3.0]))  # |s| is what counts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(torch.tanh(self.inp(x))))
        h = self.squeeze(torch.tanh(self.expand(h)))
        return self.head(self.reflect(self.rotate(h)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class PlainMLP(UserMLP):
    def __init__(self) -> None:
        pl.LightningModule.__init__(self)
        self.lr = 0.05
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


class AuxMLP(PlainMLP):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 4), AuxiliaryReflection(4))


class Recorder(pl.loggers.Logger):
    """A logger that keeps every ``log_metrics`` call (what any logger would receive)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append(dict(metrics))


def monitor_calls(recorder: Recorder) -> list[dict[str, float]]:
    """The monitor's keys of every ``log_metrics`` call that has any."""
    calls = [{k: v for k, v in call.items() if k.startswith("orthogonality/")} for call in recorder.calls]
    return [call for call in calls if call]


def loader(batches: int = 4, batch_size: int = 8) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(batches * batch_size, 8, generator=generator), torch.randn(batches * batch_size, 4)
    )
    return DataLoader(data, batch_size=batch_size)


def fit(tiny_trainer, model, monitor, batches: int = 4, callbacks=(), **kwargs) -> pl.Trainer:
    trainer = tiny_trainer(max_epochs=1, callbacks=[monitor, *callbacks], **kwargs)
    trainer.fit(model, loader(batches))
    return trainer


# ------------------------------------------------------------------------------------------ brute force
def brute_errors(q: torch.Tensor) -> tuple[float, float]:
    """``||Q^T Q - I||_F`` (smaller Gram) and ``max_i |sigma_i^2 - 1|`` from an SVD, in float64."""
    q = q.detach().double()
    gram = q.T @ q if q.shape[0] >= q.shape[1] else q @ q.T
    frobenius = math.sqrt(float(((gram - torch.eye(gram.shape[0], dtype=torch.float64)) ** 2).sum()))
    spectral = float((torch.linalg.svdvals(q) ** 2 - 1).abs().max())
    return frobenius, spectral


def reflections_multiplied_out(vectors: torch.Tensor) -> torch.Tensor:
    """``H(v_1) ... H(v_k)`` as dense matrices multiplied one by one (``H(0) = I``)."""
    vectors = vectors.detach().double()
    q = torch.eye(vectors.shape[1], dtype=torch.float64)
    for v in vectors:
        if float(v @ v) > 0:
            q = q @ (torch.eye(len(v), dtype=torch.float64) - 2 * torch.outer(v, v) / (v @ v))
    return q


def assert_errors(values: dict[str, float], prefix: str, q: torch.Tensor, atol: float = 1e-12) -> None:
    frobenius, spectral = brute_errors(q)
    assert values[f"{prefix}/orthogonality_fro"] == pytest.approx(frobenius, rel=1e-6, abs=atol)
    assert values[f"{prefix}/orthogonality_spectral"] == pytest.approx(spectral, rel=1e-6, abs=atol)


# ---------------------------------------------------------------------------------------------- tests
def test_logged_values_equal_brute_force_for_torch_ours_and_svd(tiny_trainer):
    model, recorder = UserMLP(), Recorder()
    monitor = OrthogonalityMonitor(every_n_steps=2)
    trainer = fit(tiny_trainer, model, monitor, logger=recorder, log_every_n_steps=1)
    values = monitor.history[-1]["values"]
    assert monitor.history[-1]["step"] == trainer.global_step == 4  # the last measurement is of the final weights
    expected_modules = {"hidden", "expand", "rotate", "reflect", "head", "head.left", "head.right"}
    assert {key.split("/")[1] for key in values} == expected_modules  # not rotate.linear (the same Q), not aux, not inp
    assert_errors(values, "orthogonality/hidden/weight", model.hidden.weight)
    assert_errors(values, "orthogonality/expand/weight", model.expand.weight)  # (24, 16): Q^T Q
    assert_errors(values, "orthogonality/rotate", model.rotate.linear.weight)
    # Householder products: the product multiplied out reflection by reflection, not the WY form the layer uses.
    # The monitor measures the float32 matrix the layer applies, so they agree to float32 rounding of Q.
    for name in ("reflect", "head.left", "head.right"):
        vectors = model.get_submodule(name).vectors
        assert_errors(values, f"orthogonality/{name}", reflections_multiplied_out(vectors), atol=2e-5)
        assert values[f"orthogonality/{name}/orthogonality_fro"] < 2e-5
    s = model.head.singular_values.detach().double().abs()
    assert float(model.head.singular_values.detach()[0]) < 0  # still negative: the monitor takes |s|
    assert values["orthogonality/head/singular_value_min"] == pytest.approx(float(s.min()), rel=1e-12)
    assert values["orthogonality/head/singular_value_max"] == pytest.approx(float(s.max()), rel=1e-12)
    assert values["orthogonality/head/singular_value_ratio"] == pytest.approx(float(s.max() / s.min()), rel=1e-12)
    assert values["orthogonality/head/singular_value_ratio"] > 4  # about 3 / 0.5
    # The values went through pl_module.log to the logger: the last logged call holds the last measurement.
    logged = monitor_calls(recorder)
    assert len(monitor.history) == 2 and logged
    for key, value in values.items():
        assert logged[-1][key] == pytest.approx(value, rel=1e-6)


def test_drifted_parametrization_and_named_plain_weights_report_their_defect(tiny_trainer):
    model = UserMLP(lr=0.0)  # frozen weights: the known defect stays exactly as constructed
    with torch.no_grad():
        # torch's orthogonal Q = base @ exp(A); a base scaled by 1.1 makes Q^T Q = 1.21 I exactly.
        model.hidden.parametrizations.weight[0].base.mul_(1.1)
    monitor = OrthogonalityMonitor(modules=["hidden", "inp", "squeeze"], every_n_steps=1)
    fit(tiny_trainer, model, monitor, batches=2)
    values = monitor.history[-1]["values"]
    assert set(values) == {
        f"orthogonality/{m}/weight/orthogonality_{n}" for m in ("hidden", "inp", "squeeze") for n in ("fro", "spectral")
    }
    assert values["orthogonality/hidden/weight/orthogonality_fro"] == pytest.approx(
        0.21 * 4, rel=1e-5
    )  # ||0.21 I_16||_F
    assert values["orthogonality/hidden/weight/orthogonality_spectral"] == pytest.approx(0.21, rel=1e-5)
    assert_errors(values, "orthogonality/hidden/weight", model.hidden.weight)
    assert_errors(values, "orthogonality/inp/weight", model.inp.weight)  # plain (16, 8) weight: Q^T Q, far from I
    assert_errors(values, "orthogonality/squeeze/weight", model.squeeze.weight)  # plain (16, 24) weight: Q Q^T
    assert values["orthogonality/inp/weight/orthogonality_fro"] > 0.5


class UserCNN(pl.LightningModule):
    """A user's small CNN whose convolution and head are made orthogonal with lightning_ortho.nn.orthogonal."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = ortho_weight(nn.Conv2d(2, 4, 2), init="haar")  # (4, 2, 2, 2): read as (4, 8)
        self.head = ortho_weight(nn.Linear(4, 4), map="cayley")
        self.gru = ortho_weight(nn.GRU(4, 3), "weight_hh_l0")  # 3 gates of (3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.view(-1, 2, 2, 2)).flatten(1)
        return self.head(h) + self.gru(h.unsqueeze(0))[0][0].sum(-1, keepdim=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_our_orthogonal_weights_are_measured_as_the_matrices_they_keep_orthogonal(tiny_trainer):
    model = UserCNN()
    monitor = OrthogonalityMonitor(every_n_steps=1)
    fit(tiny_trainer, model, monitor, batches=2)
    values = monitor.history[-1]["values"]
    assert {key.split("/")[1] for key in values} == {"conv", "head", "gru"}
    assert_errors(values, "orthogonality/conv/weight", model.conv.weight.reshape(4, 8), atol=1e-6)
    assert_errors(values, "orthogonality/head/weight", model.head.weight, atol=1e-6)
    worst = max((brute_errors(block) for block in model.gru.weight_hh_l0.view(3, 3, 3)), key=lambda e: e[0])
    assert values["orthogonality/gru/weight_hh_l0/orthogonality_fro"] == pytest.approx(worst[0], rel=1e-6, abs=1e-6)
    assert all(value < 1e-5 for value in values.values())


def test_modules_by_class_select_every_match(tiny_trainer):
    monitor = OrthogonalityMonitor(modules=[SVDLinear, nn.Linear], every_n_steps=100)
    model = UserMLP()
    fit(tiny_trainer, model, monitor, batches=2)
    names = {key.split("/")[1] for key in monitor.history[-1]["values"]}
    assert names == {"head", "inp", "hidden", "expand", "squeeze", "rotate.linear"}


def test_geotorch_constraints_are_found_and_measured(tiny_trainer, monkeypatch):
    if not any((ROOT / "benchmarks" / ".peers").glob("geotorch-0.4.0.dist-info")):
        pytest.skip(
            "geotorch 0.4.0 is not in benchmarks/.peers (a benchmark peer, never a dependency); install it with "
            "`pip install --no-deps --target benchmarks/.peers geotorch==0.4.0` to run this test."
        )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from _peers import import_peer

    geotorch, reason = import_peer("geotorch", "geotorch==0.4.0")
    if geotorch is None:
        pytest.skip(f"geotorch could not be imported: {reason}")
    model = PlainMLP()
    model.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    geotorch.orthogonal(model.net[2], "weight")  # square: Stiefel (SO case)
    geotorch.orthogonal(model.net[4], "weight")  # wide (4, 16): Stiefel with orthonormal rows
    geotorch.grassmannian(model.net[0], "weight")  # tall (16, 8)
    with torch.no_grad():
        model.net[2].parametrizations.weight[0].base.mul_(1.1)  # geotorch's Q = base @ triv(A): drift it
    monitor = OrthogonalityMonitor(every_n_steps=1)
    fit(tiny_trainer, model, monitor, batches=2)
    values = monitor.history[-1]["values"]
    assert {key.split("/")[1] for key in values} == {"net.0", "net.2", "net.4"}
    for name in ("net.0", "net.2", "net.4"):
        assert_errors(values, f"orthogonality/{name}/weight", model.get_submodule(name).weight)
    assert values["orthogonality/net.2/weight/orthogonality_spectral"] > 0.1
    assert values["orthogonality/net.4/weight/orthogonality_spectral"] < 1e-5


def test_errors_are_clear(tiny_trainer):
    for bad in ({"every_n_steps": 0}, {"modules": "hidden"}, {"modules": []}):
        with pytest.raises(ValueError, match="every_n_steps|modules"):
            OrthogonalityMonitor(**bad)
    with pytest.raises(ValueError, match="no module this monitor can measure"):
        fit(tiny_trainer, PlainMLP(), OrthogonalityMonitor())
    with pytest.raises(ValueError, match="AuxiliaryReflection layer.*net.1.*orthogonal on each input by construction"):
        fit(tiny_trainer, AuxMLP(), OrthogonalityMonitor())
    with pytest.raises(ValueError, match="cannot monitor 'net.1'.*no single matrix Q"):
        fit(tiny_trainer, AuxMLP(), OrthogonalityMonitor(modules=["net.1"]))
    with pytest.raises(ValueError, match="cannot monitor 'net.1'.*has no weight matrix"):
        fit(tiny_trainer, PlainMLP(), OrthogonalityMonitor(modules=["net.1"]))  # nn.Tanh
    with pytest.raises(ValueError, match="no submodule 'nope'"):
        fit(tiny_trainer, UserMLP(), OrthogonalityMonitor(modules=["nope"]))
