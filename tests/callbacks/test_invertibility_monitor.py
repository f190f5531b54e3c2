"""InvertibilityMonitor on a project that does not use this library's models: what it logs equals the explicit
round trip ``f^{-1}(f(x))`` (float64) on the same probe; and both monitors under DDP."""

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.nn.newton import NewtonResult
from tests.callbacks.test_jacobian_monitor import UserModel, brute_force, first_inputs
from tests.conftest import free_port

NAMES = ["flow", "reflection", "free"]


def relative_errors(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x_hat - x, dim=1) / torch.linalg.vector_norm(x, dim=1)


def explicit_roundtrips(model: UserModel, probes: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """The test's own round trips on each module's probe: the flow's inverse, the Theorem-2 layer's inverse (raises
    unless it converged), and the unconstrained layer's Newton preimage; the margin from an eigensolver of W."""
    model.eval()
    with torch.no_grad():
        flow = model.flow.inverse(model.flow(probes["flow"])[0])
        reflection = model.reflection.inverse(model.reflection(probes["reflection"]))
        free = model.free.newton_inverse(model.free(probes["free"]))
        eigenvalues = torch.linalg.eigvalsh(model.reflection.auxiliary_weight())
    out = {}
    for name, x_hat in (("flow", flow), ("reflection", reflection), ("free", free.x)):
        errors = relative_errors(probes[name], x_hat)
        out[name] = {
            "roundtrip_error_max": float(errors.max()),
            "roundtrip_error_mean": float(errors.mean()),
            "roundtrip_abs_error_max": float((x_hat - probes[name]).abs().max()),
        }
    out["reflection"]["newton_iterations_max"] = float(
        model.reflection.newton_inverse(model.reflection(probes["reflection"])).iterations.max()
    )
    out["reflection"]["theorem2_margin"] = float(1.5 * eigenvalues[0] - eigenvalues[-1])
    out["free"]["newton_iterations_mean"] = float(free.iterations.double().mean())
    out["free"]["newton_failures"] = float((~free.converged).sum())
    return out


def test_logged_statistics_equal_the_explicit_round_trip_on_the_probe(tiny_trainer):
    pl.seed_everything(0)
    model = UserModel()
    seen = first_inputs(model, NAMES)
    monitor = InvertibilityMonitor(modules=NAMES, every_n_steps=1, probe_size=5, plot=False)
    trainer = tiny_trainer(precision="64-true", max_steps=2, callbacks=[monitor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
    logged = monitor.history[-1]["values"]
    assert [record["step"] for record in monitor.history] == [1, 2]
    assert {key.rsplit("/", 1)[1] for key in logged if "/flow/" in key} == {
        "roundtrip_error_max",
        "roundtrip_error_mean",
        "roundtrip_abs_error_max",
    }
    assert "invertibility/free/theorem2_margin" not in logged  # Theorem 2 says nothing about an unconstrained W
    probes = {name: seen[name][:5] for name in NAMES}
    for name in NAMES:
        assert torch.equal(monitor.probes[name], probes[name])
    for name, expected in explicit_roundtrips(model, probes).items():
        for statistic, value in expected.items():
            assert logged[f"invertibility/{name}/{statistic}"] == pytest.approx(value, rel=1e-9, abs=1e-15), (
                name,
                statistic,
            )
    assert (
        logged["invertibility/flow/roundtrip_error_max"] < 1e-12
        and logged["invertibility/reflection/roundtrip_error_max"] < 1e-9
    )
    assert (
        logged["invertibility/reflection/theorem2_margin"] > 0
        and logged["invertibility/reflection/newton_iterations_max"] > 0
    )
    for key, value in logged.items():
        assert float(trainer.callback_metrics[key]) == pytest.approx(value, rel=1e-6, abs=1e-30), key
    lost = [w for w in caught if "no longer invertible" in str(w.message)]
    assert [("'free'" in str(w.message)) for w in lost] == (
        [True] if logged["invertibility/free/roundtrip_error_max"] > 1e-4 else []
    )


class Drifting(nn.Module):
    """A user's invertible layer whose hand-written inverse is wrong by a relative 1e-3."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return x * self.scale

    def inverse(self, y):
        return y / self.scale * (1 + 1e-3)


class Raising(nn.Module):
    def forward(self, x):
        return x

    def inverse(self, y):
        raise RuntimeError("no inverse today")


class Solver(nn.Module):
    """Duck-typed Newton reporter: of two rows, the second never converges after 50 iterations."""

    def forward(self, x):
        return x

    def newton_inverse(self, y):
        converged = torch.arange(y.shape[0]) % 2 == 0
        iterations = torch.where(converged, 3, 50)
        return NewtonResult(y, iterations, (~converged).double(), converged, tolerance=1e-11)


class Broken(UserModel):
    def __init__(self):
        super().__init__()
        self.drifting, self.raising, self.solver = Drifting(), Raising(), Solver()

    def training_step(self, batch, batch_idx):
        x = batch[0]
        loss = super().training_step(batch, batch_idx)
        return loss + self.drifting(x).mean() + self.raising(x).mean() + self.solver(x).mean()


def test_lost_invertibility_is_warned_about_once_per_module_naming_it_and_the_step(tiny_trainer):
    monitor = InvertibilityMonitor(modules=["drifting", "raising", "solver"], every_n_steps=1, probe_size=4, plot=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_trainer(max_steps=3, callbacks=[monitor]).fit(Broken())
    messages = [str(w.message) for w in caught if "no longer invertible" in str(w.message)]
    assert len(messages) == 3 and len(monitor.history) == 3  # once per module, though lost at every step
    drifting, raising, solver = messages
    assert "'drifting' is no longer invertible on its probe at step 1 (roundtrip_error_max = 0.001" in drifting
    assert "roundtrip_error_max = inf" in raising and "RuntimeError: no inverse today" in raising
    assert "'solver'" in solver and "newton_failures = 2" in solver
    logged = monitor.history[-1]["values"]
    assert logged["invertibility/drifting/roundtrip_error_max"] == pytest.approx(1e-3, rel=1e-4)
    assert logged["invertibility/solver/newton_failures"] == 2  # rows 1 and 3 of the probe of 4
    assert logged["invertibility/solver/newton_iterations_mean"] == (3 + 50) / 2
    assert logged["invertibility/solver/newton_iterations_max"] == 50
    assert math.isinf(logged["invertibility/raising/roundtrip_abs_error_max"])


def test_checkpoint_resume_restores_history_and_probes(tmp_path, tiny_trainer):
    monitor = InvertibilityMonitor(modules=["flow"], every_n_steps=1, probe_size=3, plot=False)
    trainer = tiny_trainer(max_steps=2, callbacks=[monitor])
    trainer.fit(UserModel())
    trainer.save_checkpoint(tmp_path / "two.ckpt")
    resumed = InvertibilityMonitor(modules=["flow"], every_n_steps=1, probe_size=3, plot=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*dataloader is not resumable")
        tiny_trainer(max_steps=3, callbacks=[resumed]).fit(UserModel(seed=1), ckpt_path=tmp_path / "two.ckpt")
    assert resumed.history[:2] == monitor.history and [r["step"] for r in resumed.history] == [1, 2, 3]
    assert torch.equal(resumed.probes["flow"], monitor.probes["flow"])


class ThreeOutputs(nn.Module):
    def forward(self, x):
        return x[:, :2], x[:, 2:], x.sum(1)

    def inverse(self, a, b):
        return torch.cat([a, b], 1)


class WithSplit(UserModel):
    def __init__(self):
        super().__init__()
        self.split = ThreeOutputs()

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) + self.split(batch[0])[2].mean()


@pytest.mark.parametrize(
    "modules, message",
    [
        (["mlp"], "cannot monitor 'mlp': Sequential has no inverse"),
        ([nn.Linear], "cannot monitor 'flow.layers.0.net.0': Linear has no inverse"),
        (["split"], "cannot monitor 'split': its forward returns a tuple, neither a tensor nor"),
        (["missing"], "WithSplit has no submodule 'missing'"),
    ],
)
def test_bad_configuration_is_a_clear_error_before_training(modules, message, tiny_trainer):
    model = WithSplit()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=message):
        tiny_trainer(max_steps=1, callbacks=[InvertibilityMonitor(modules=modules, plot=False)]).fit(model)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.filterwarnings("ignore:.*no longer invertible")
def test_automatic_choice_and_a_model_without_inverses(tiny_trainer):
    monitor = InvertibilityMonitor(every_n_steps=1, plot=False)
    tiny_trainer(max_steps=1, callbacks=[monitor]).fit(WithSplit())
    # "free" is an unconstrained auxiliary reflection (invertible=False): watched only when named.
    assert set(monitor._watched) == {"flow", "reflection"} and set(monitor.skipped) == {"split"}

    class MLPOnly(UserModel):
        def __init__(self):
            super().__init__()
            del self.flow, self.reflection, self.free

        def training_step(self, batch, batch_idx):
            return self.mlp(batch[0]).pow(2).mean()

    with pytest.raises(ValueError, match="MLPOnly has no module this monitor can measure"):
        tiny_trainer(max_steps=1, callbacks=[InvertibilityMonitor()]).fit(MLPOnly())


@pytest.mark.parametrize("tolerance", [0, -1e-3, math.inf, math.nan, "1e-4", True])
def test_tolerance_is_validated(tolerance):
    with pytest.raises(ValueError, match="tolerance must be a positive finite number"):
        InvertibilityMonitor(tolerance=tolerance)


@pytest.mark.ddp
def test_ddp_logs_the_single_process_values_on_the_union_of_the_probes(tiny_trainer, monkeypatch):
    """Two processes, 4 rows each (the whole per-process batch is the probe), one step: every statistic equals
    the single-process computation on all 8 rows at the parameters after that step."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    pl.seed_everything(0)
    model = UserModel(rows=8, batch_size=4)
    x = model.train_dataloader().dataset.tensors[0].double()  # the union of the two processes' probes
    with torch.no_grad():  # the flow's probe is its first input: the reflection's output before the step
        probes = {"flow": copy.deepcopy(model).double().reflection(x), "mlp": x, "reflection": x, "free": x}
    monitors = [
        JacobianDeterminantMonitor(modules=["flow", "mlp", "reflection", "free"], every_n_steps=1, probe_size=4),
        InvertibilityMonitor(modules=NAMES, every_n_steps=1, probe_size=4),
    ]
    trainer = tiny_trainer(precision="64-true", max_steps=1, strategy="ddp_spawn", devices=2, callbacks=monitors)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*no longer invertible")
        trainer.fit(model)  # the weights after the step come back to this process
    metrics = trainer.callback_metrics
    expected = {}
    for name in ("flow", "mlp", "reflection", "free"):
        sign, log_det = brute_force(getattr(model, name), probes[name])
        expected[f"jacobian/{name}/log_abs_det_mean"] = float(log_det.mean())
        expected[f"jacobian/{name}/log_abs_det_min"] = float(log_det.min())
        expected[f"jacobian/{name}/log_abs_det_max"] = float(log_det.max())
        if name not in ("flow", "reflection"):  # unknown for a flow; fixed by Theorem 2 (not logged) for reflection
            expected[f"jacobian/{name}/negative_fraction"] = float((sign <= 0).double().mean())
    for name, values in explicit_roundtrips(model, probes).items():
        expected.update({f"invertibility/{name}/{statistic}": value for statistic, value in values.items()})
    for key, value in expected.items():
        # rel 1e-6: the DDP run and the single-process reference differ by up to ~4e-8 relative (measured; the
        # float64 reductions themselves round at 1e-16), from the two runs' arithmetic before the measurement
        assert float(metrics[key]) == pytest.approx(value, rel=1e-6, abs=1e-12), key
    assert "jacobian/flow/negative_fraction" not in metrics  # the sign of a flow layer is unknown: not logged
