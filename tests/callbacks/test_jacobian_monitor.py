"""JacobianDeterminantMonitor on a project that does not use this library's models: what it logs equals a
brute-force autograd ``slogdet`` (float64) on the same probe."""

import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.flows import Invertible1x1Conv
from lightning_ortho.flows.conv1x1.base import invertible_1x1_conv
from lightning_ortho.nn import AuxiliaryReflection
from tests.flows.references import autograd_log_det, pixel_jacobian_signs

D = 4


class Coupling(nn.Module):
    """A RealNVP affine coupling written as a user would: ``forward(x) -> (y, log_abs_det)``, ``inverse(y)``."""

    def __init__(self, d: int, flip: bool) -> None:
        super().__init__()
        self.flip, self.half = flip, d // 2
        self.net = nn.Sequential(nn.Linear(self.half, 16), nn.Tanh(), nn.Linear(16, 2 * (d - self.half)))

    def _split(self, x):
        a, b = x[:, : self.half], x[:, self.half :]
        return (b, a) if self.flip else (a, b)

    def _join(self, a, b):
        return torch.cat([b, a] if self.flip else [a, b], dim=1)

    def forward(self, x):
        a, b = self._split(x)
        log_scale, shift = self.net(a).chunk(2, dim=1)
        log_scale = torch.tanh(log_scale)
        return self._join(a, b * torch.exp(log_scale) + shift), log_scale.sum(1)

    def inverse(self, y):
        a, b = self._split(y)
        log_scale, shift = self.net(a).chunk(2, dim=1)
        return self._join(a, (b - shift) * torch.exp(-torch.tanh(log_scale)))


class RealNVP(nn.Module):
    def __init__(self, d: int, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Coupling(d, i % 2 == 1) for i in range(layers))

    def forward(self, x):
        total = x.new_zeros(x.shape[0])
        for layer in self.layers:
            x, log_abs_det = layer(x)
            total = total + log_abs_det
        return x, total

    def inverse(self, y):
        for layer in reversed(self.layers):
            y = layer.inverse(y)
        return y


class UserModel(pl.LightningModule):
    """A user's project: a flow, a plain MLP ``R^d -> R^d`` and two of our reflections, trained on random data."""

    def __init__(self, rows: int = 32, batch_size: int = 8, lr: float = 1e-2, seed: int = 0) -> None:
        super().__init__()
        self.rows, self.batch_size, self.lr, self.seed = rows, batch_size, lr, seed
        self.flow = RealNVP(D)
        self.mlp = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, D))
        self.reflection = AuxiliaryReflection(D, invertible=True)
        self.free = AuxiliaryReflection(D)  # unconstrained W: det J changes sign between rows
        with torch.no_grad():
            self.reflection.factor.add_(torch.randn(D, D))
            self.free.weight.copy_(3 * torch.randn(D, D))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        z, log_abs_det = self.flow(self.reflection(x))
        nll = 0.5 * z.pow(2).sum(1) - log_abs_det
        return nll.mean() + (self.mlp(x) - x).pow(2).mean() + self.free(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        data = torch.randn(self.rows, D, generator=torch.Generator().manual_seed(self.seed))
        return DataLoader(TensorDataset(data), batch_size=self.batch_size, shuffle=False)


def first_inputs(model: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """The test's own record of each module's first training input (the probe, found independently)."""
    seen: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    for name in names:

        def keep(module, args, output, name=name):
            if module.training:
                seen.setdefault(name, args[0].detach().clone())

        modules[name].register_forward_hook(keep)
    return seen


def brute_force(module: nn.Module, probe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sign, log|det J|)`` per row from the autograd Jacobian of the module in float64 (its first output)."""
    module = module.double().eval()
    out = []
    for row in probe.double():
        jacobian = torch.autograd.functional.jacobian(
            lambda t: (lambda y: y[0] if isinstance(y, tuple) else y)(module(t.unsqueeze(0))).reshape(-1), row
        )
        out.append(torch.linalg.slogdet(jacobian.reshape(row.numel(), row.numel())))
    return torch.stack([s for s, _ in out]), torch.stack([v for _, v in out])


NAMES = ["flow", "mlp", "reflection", "free"]


def test_logged_statistics_equal_autograd_slogdet_on_the_probe(tiny_trainer):
    pl.seed_everything(0)
    model = UserModel()
    seen = first_inputs(model, NAMES)
    monitor = JacobianDeterminantMonitor(modules=NAMES, every_n_steps=1, probe_size=5, plot=False)
    trainer = tiny_trainer(precision="64-true", max_epochs=1, limit_train_batches=2, callbacks=[monitor])
    trainer.fit(model)
    logged = monitor.history[-1]["values"]  # what was logged, as Python floats (the logger keeps float32)
    assert [record["step"] for record in monitor.history] == [1, 2]
    assert monitor.methods == {"flow": "flow", "mlp": "autograd", "reflection": "closed_form", "free": "closed_form"}
    assert monitor.sign_sources == {"flow": "unknown", "mlp": "slogdet", "reflection": "fixed", "free": "jacobian"}
    mixed = False
    for name in NAMES:
        probe = seen[name][:5]
        assert torch.equal(monitor.probes[name], probe)
        sign, log_det = brute_force(getattr(model, name), probe)
        key = f"jacobian/{name}/"
        assert logged[key + "log_abs_det_mean"] == pytest.approx(float(log_det.mean()), rel=1e-9, abs=1e-12)
        assert logged[key + "log_abs_det_min"] == pytest.approx(float(log_det.min()), rel=1e-9, abs=1e-12)
        assert logged[key + "log_abs_det_max"] == pytest.approx(float(log_det.max()), rel=1e-9, abs=1e-12)
        assert key + "log_abs_det_method" not in logged  # a constant: in the notes, not the metrics
        if name == "flow":
            assert key + "negative_fraction" not in logged  # a flow's forward gives log|det| only: sign unknown
        elif name == "reflection":  # Theorem 2 fixes the sign (declared): a constant, not logged
            assert key + "negative_fraction" not in logged and len(set(sign.tolist())) == 1
        else:
            negative = logged[key + "negative_fraction"]
            assert negative == float((sign <= 0).double().mean())
            mixed |= 0 < negative < 1
    assert monitor.notes()["jacobian/flow"] == "log|det J| by flow, sign of det J from " + (
        "nowhere (unknown: negative_fraction is not logged)"
    )
    for key, value in logged.items():  # and the trainer got them (float32)
        assert not math.isnan(value), key
        assert float(trainer.callback_metrics[key]) == pytest.approx(value, rel=1e-6), key
    assert mixed  # some module's determinant changes sign on its probe, so the sign really is checked
    assert abs(logged["jacobian/mlp/log_abs_det_mean"]) > 1e-3  # not a trivially zero log-determinant


def test_closed_form_of_an_invertible_auxiliary_reflection_equals_autograd():
    pl.seed_everything(1)
    layer = AuxiliaryReflection(6, invertible=True).double()
    with torch.no_grad():
        layer.factor.copy_(torch.randn(6, 6, dtype=torch.float64))
    probe = torch.randn(8, 6, dtype=torch.float64)
    monitor = JacobianDeterminantMonitor(probe_size=8)
    closed = monitor.measure("layer", layer, probe)
    sign, log_det = brute_force(layer, probe)
    assert monitor.methods["layer"] == "closed_form"
    assert closed["log_abs_det_mean"].value == pytest.approx(float(log_det.mean()), rel=1e-10)
    assert closed["log_abs_det_min"].value == pytest.approx(float(log_det.min()), rel=1e-10)
    assert "negative_fraction" not in closed and len(set(sign.tolist())) == 1  # fixed by Theorem 2: not logged
    assert closed["log_abs_det_mean"].weight == 8 and closed["log_abs_det_min"].reduce == "min"


@pytest.mark.filterwarnings("ignore:.*dataloader is not resumable")
def test_checkpoint_resume_restores_history_and_probes(tmp_path, tiny_trainer):
    pl.seed_everything(0)
    monitor = JacobianDeterminantMonitor(modules=["mlp", "flow"], every_n_steps=1, probe_size=3, plot=True)
    trainer = tiny_trainer(precision="64-true", max_steps=2, callbacks=[monitor])
    trainer.fit(UserModel())
    assert (tmp_path / "JacobianDeterminantMonitor.png").exists()
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    resumed = JacobianDeterminantMonitor(modules=["mlp", "flow"], every_n_steps=1, probe_size=3, plot=False)
    model = UserModel(seed=1)  # other data: a probe captured again would differ
    trainer = tiny_trainer(precision="64-true", max_steps=4, callbacks=[resumed])
    trainer.fit(model, ckpt_path=tmp_path / "two.ckpt")
    assert [record["step"] for record in resumed.history] == [1, 2, 3, 4]
    assert repr(resumed.history[:2]) == repr(monitor.history)  # repr: nan (an unknown sign) equals nan
    assert set(resumed.probes) == {"mlp", "flow"}
    for name in resumed.probes:
        assert torch.equal(resumed.probes[name], monitor.probes[name])
    _, log_det = brute_force(model.mlp, monitor.probes["mlp"])  # the last value is on the restored probe
    assert resumed.history[-1]["values"]["jacobian/mlp/log_abs_det_mean"] == pytest.approx(float(log_det.mean()))


class Wide(UserModel):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(300, 300)
        self.wide = nn.Sequential(nn.Linear(300, 300), nn.Tanh())
        self.rect = nn.Linear(D, 3)

    def training_step(self, batch, batch_idx):
        x = batch[0].repeat(1, 75)
        return super().training_step(batch, batch_idx) + self.wide(self.big(x)).mean() + self.rect(batch[0]).mean()


@pytest.mark.parametrize(
    "modules, message",
    [
        (["nope"], "Wide has no submodule 'nope'"),
        (["big"], r"d = 300 > max_autograd_dim = 256"),
        (["wide"], r"cannot monitor 'wide': .*d = 300 > max_autograd_dim = 256"),
        (["rect"], "maps 4 to 3 entries per sample"),
        ([nn.GRU], "Wide has no GRU submodule"),
    ],
)
def test_bad_configuration_is_a_clear_error_before_training(modules, message, tiny_trainer):
    model = Wide()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=message):
        tiny_trainer(max_steps=1, callbacks=[JacobianDeterminantMonitor(modules=modules, plot=False)]).fit(model)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no step was taken


def test_a_model_without_log_determinants_is_refused_and_named_modules_can_raise_the_limit(tiny_trainer):
    class MLPOnly(UserModel):
        def __init__(self):
            super().__init__()
            del self.flow, self.reflection, self.free

        def training_step(self, batch, batch_idx):
            return (self.mlp(batch[0]) - batch[0]).pow(2).mean()

    with pytest.raises(ValueError, match="MLPOnly has no module this monitor can measure"):
        tiny_trainer(max_steps=1, callbacks=[JacobianDeterminantMonitor()]).fit(MLPOnly())
    monitor = JacobianDeterminantMonitor(modules=["mlp"], max_autograd_dim=4, plot=False)
    tiny_trainer(max_steps=1, callbacks=[monitor]).fit(MLPOnly())
    assert monitor.methods == {"mlp": "autograd"}


def test_automatic_choice_is_the_outermost_flows_and_closed_forms_and_skips_the_rest(tiny_trainer):
    class Split(nn.Module):  # has an inverse, but its forward is not (y, log_abs_det)
        def forward(self, x):
            return x[:, :2], x[:, 2:], x.sum(1)

        def inverse(self, a, b):
            return torch.cat([a, b], 1)

    class WithSplit(UserModel):
        def __init__(self):
            super().__init__()
            self.split = Split()

        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) + self.split(batch[0])[2].mean()

    monitor = JacobianDeterminantMonitor(every_n_steps=1, plot=False)
    tiny_trainer(max_steps=1, callbacks=[monitor]).fit(WithSplit())
    assert set(monitor.methods) == {"flow", "reflection", "free"}  # not the couplings inside the flow, not the MLP
    assert set(monitor.skipped) == {"split"}
    assert {key.split("/")[1] for key in monitor.history[-1]["values"]} == {"flow", "reflection", "free"}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_autograd_dim=0), "max_autograd_dim must be a positive int"),
        (dict(every_n_steps=0), "every_n_steps must be a positive int"),
        (dict(modules="flow"), "modules must be None"),
    ],
)
def test_arguments_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JacobianDeterminantMonitor(**kwargs)


class Convolutions(pl.LightningModule):
    """One 1x1 convolution of each kind whose statistics differ in what construction fixes, applied in a row."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleDict({kind: invertible_1x1_conv(4, kind) for kind in KINDS})

    def training_step(self, batch, batch_idx):
        x, total = batch[0], 0.0
        for conv in self.convs.values():
            x, log_det = conv(x)
            total = total + log_det
        return (0.5 * x.pow(2).flatten(1).sum(1) - total).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


KINDS = ("plain", "lu", "householder")


def test_statistics_constant_by_construction_are_not_logged_but_noted(tiny_trainer):
    pl.seed_everything(0)
    monitor = JacobianDeterminantMonitor(modules=[Invertible1x1Conv], every_n_steps=2, probe_size=4, plot=False)
    data = DataLoader(TensorDataset(torch.randn(32, 4, 3, 3, generator=torch.Generator().manual_seed(0))), 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_trainer(precision="64-true", max_epochs=2, callbacks=[monitor]).fit(Convolutions(), data)
    assert not [w for w in caught if "measured" in str(w.message)]  # the Householder layer is not "unmeasured"
    statistics = {kind: set() for kind in KINDS}
    for record in monitor.history:
        for key in record["values"]:
            statistics[key.split("/")[1].removeprefix("convs.")].add(key.split("/")[-1])
    log_det = {"log_abs_det_mean", "log_abs_det_min", "log_abs_det_max"}
    signs = {"negative_fraction", "pixel_negative_fraction"}
    # a dense W can cross det W = 0 while training: its sign is measured
    assert statistics == {"plain": log_det | signs, "lu": log_det, "householder": set()}
    notes = monitor.notes()
    for kind in ("lu", "householder"):
        assert "sign of det J from nowhere: fixed by construction" in notes[f"jacobian/convs.{kind}"], kind
    assert notes["jacobian/convs.householder"].startswith("log|det J| = 0 by construction")
    # what the declarations claim, checked independently: one sign for every pixel of random inputs, and
    # log|det J| = 0 for the Householder convolution, whatever the parameters (here: after training)
    model = Convolutions().double()
    x = torch.randn(3, 4, 2, 2, dtype=torch.float64)
    for kind in ("lu", "householder"):
        assert len(set(pixel_jacobian_signs(model.convs[kind], x).flatten().tolist())) == 1, kind
    assert float(autograd_log_det(model.convs["householder"], x).abs().max()) < 1e-10
