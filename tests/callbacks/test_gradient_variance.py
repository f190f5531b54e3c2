"""GradientNoiseMonitor (gradient noise of any model) and OnlineEstimatorVarianceMonitor (bias and variance of an online
gradient estimator), against brute-force recomputations."""

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.gradient_variance import (
    EstimatorVariance,
    GradientNoiseMonitor,
    OnlineEstimatorVarianceMonitor,
)
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import RTRL, TanhRNNCell
from lightning_ortho.online.losses import masked_loss_sum
from tests.conftest import free_port, make_tiny_trainer
from tests.models.test_online_rnn_module import TinyStreams, carried

# ------------------------------------------------------------------------------------------------ a user's project


class UserMLP(pl.LightningModule):
    """A plain classifier as someone else's project writes it (no code of this library)."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.frozen = nn.Linear(2, 2).requires_grad_(False)  # no trainable parameters: not a group
        self.lr = lr

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.head(self.encoder(x)), y)

    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def user_data(n=96):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3] @ torch.randn(3, 3, generator=g)).argmax(1)
    y = torch.where(torch.rand(n, generator=g) < 0.3, torch.randint(0, 3, (n,), generator=g), y)  # label noise
    return TensorDataset(x, y)


def trainer(root, **kwargs):
    return make_tiny_trainer(root, **{"deterministic": True, "num_sanity_val_steps": 0, **kwargs})


class Recorder(pl.Callback):
    """The parameters and the batch of every optimizer step, to recompute the gradients independently."""

    def __init__(self):
        self.steps, self._batch = [], None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch = [t.detach().clone() for t in batch]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        params = {n: p.detach().clone() for n, p in pl_module.named_parameters()}
        self.steps.append((params, self._batch))


def recomputed_gradients(model, steps):
    """Per step, ``{parameter name: gradient}`` from a copy of the model at that step's parameters."""
    copy_ = copy.deepcopy(model)
    out = []
    for params, batch in steps:
        with torch.no_grad():
            for n, p in copy_.named_parameters():
                p.copy_(params[n])
        trainable = {n: p for n, p in copy_.named_parameters() if p.requires_grad}
        grads = torch.autograd.grad(copy_.loss(batch), list(trainable.values()))
        out.append({n: g.double() for n, g in zip(trainable, grads, strict=True)})
    return out


def brute_force(window, names, batch_size):
    """The statistics of one window of per-step gradients, from all of them at once."""
    g = torch.stack([torch.cat([step[n].reshape(-1) for n in names]) for step in window])  # (K, P)
    k = g.shape[0]
    mean = g.mean(0)
    variance = float((g - mean).square().sum()) / (k - 1)
    signal = float(mean.square().sum()) - variance / k
    return {
        "batch_variance": variance,
        "mean_grad_sq": float(mean.square().sum()),
        "signal": signal,
        "snr": signal / variance,
        "noise_scale": batch_size * variance / signal if signal > 0 else math.inf,
        "trace": batch_size * variance,
    }


def close(a, b, rel):
    return a == b or math.isclose(a, b, rel_tol=rel, abs_tol=1e-14)


def logged(record, key):
    """A recorded value; an undefined one (noise_scale where the signal is not positive) is not logged: inf here,
    as the brute force has it."""
    return record["values"].get(key, math.inf)


def test_noise_statistics_equal_a_brute_force_recomputation_per_group(tmp_path):
    pl.seed_everything(0)
    model = UserMLP()
    recorder = Recorder()
    plain = GradientNoiseMonitor(every_n_steps=4, window_steps=4, plot=False)
    smoothed = GradientNoiseMonitor(
        modules=["head", "encoder.0"], every_n_steps=4, smoothing=0.5, window_steps=4, plot=False
    )
    sparse = GradientNoiseMonitor(every_n_steps=6, window_steps=3, plot=False)  # steps 4-6 and 10-12 only
    loader = DataLoader(user_data(), batch_size=8)  # 12 steps: 3 windows
    fit = trainer(tmp_path, max_epochs=1, precision="64-true", callbacks=[recorder, plain, smoothed, sparse])
    fit.fit(model, loader)

    grads = recomputed_gradients(model, recorder.steps)
    assert len(grads) == 12 and [r["step"] for r in plain.history] == [4, 8, 12]
    names = {
        "": list(grads[0]),
        "encoder": [n for n in grads[0] if n.startswith("encoder.")],
        "head": ["head.weight", "head.bias"],
        "encoder.0": ["encoder.0.weight", "encoder.0.bias"],
    }
    assert sorted(plain._watched) == ["", "encoder", "head"]  # `frozen` has nothing to measure
    ema = {}
    for w, (record, record_smoothed) in enumerate(zip(plain.history, smoothed.history, strict=True)):
        window = grads[4 * w : 4 * (w + 1)]
        for group in ("", "encoder", "head"):
            expected = brute_force(window, names[group], batch_size=8)
            prefix = f"gradient_noise/{group}/" if group else "gradient_noise/"
            for key in ("batch_variance", "mean_grad_sq", "signal", "snr", "noise_scale"):
                assert close(logged(record, prefix + key), expected[key], 1e-9), (w, group, key)
        for group in ("head", "encoder.0"):  # with smoothing: moving averages of tr(Sigma) and |G|^2
            expected = brute_force(window, names[group], batch_size=8)
            old = ema.get(group, (expected["trace"], expected["signal"]))
            ema[group] = (0.5 * old[0] + 0.5 * expected["trace"], 0.5 * old[1] + 0.5 * expected["signal"])
            scale = ema[group][0] / ema[group][1] if ema[group][1] > 0 else math.inf
            assert close(logged(record_smoothed, f"gradient_noise/{group}/noise_scale"), scale, 1e-9)
            assert close(record_smoothed["values"][f"gradient_noise/{group}/snr"], expected["snr"], 1e-9)
    # With every_n_steps=6 and windows of 3, only the last 3 steps of every 6 are read (the duty cycle that keeps
    # the default overhead small): the windows are optimizer steps 4-6 and 10-12 (grads[3:6], grads[9:12]).
    assert [r["step"] for r in sparse.history] == [6, 12]
    for record, window in zip(sparse.history, (grads[3:6], grads[9:12]), strict=True):
        expected = brute_force(window, names[""], batch_size=8)
        for key in ("batch_variance", "mean_grad_sq", "signal", "snr", "noise_scale"):
            assert close(logged(record, f"gradient_noise/{key}"), expected[key], 1e-9), key
    # the statistics reach the loggers, and a real signal was measured (not a degenerate all-noise case)
    assert "gradient_noise/noise_scale" in fit.callback_metrics
    assert all(r["values"]["gradient_noise/signal"] > 0 for r in plain.history)


class GradientRecorder(pl.Callback):
    """The final gradient of every optimizer step, read by a hook of the test."""

    def __init__(self):
        self.grads = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append({n: p.grad.detach().double().clone() for n, p in pl_module.named_parameters()})


def test_windows_are_optimizer_steps_also_with_several_steps_per_batch(tmp_path):
    # An RNN trained online by manual optimisation: 5 optimizer steps per chunk, windows of 7 steps close inside
    # chunks (after steps 7 and 14) and are logged at the end of those chunks (global steps 10 and 15).
    pl.seed_everything(0)
    module = online_model("uoro", update_every=1)
    recorder, monitor = GradientRecorder(), GradientNoiseMonitor(every_n_steps=7, window_steps=7, plot=False)
    data = TinyStreams(streams=4, steps=5, chunks_per_epoch=4)
    trainer(tmp_path, max_epochs=1, limit_val_batches=0, callbacks=[recorder, monitor]).fit(module, data)
    assert len(recorder.grads) == 20 and [r["step"] for r in monitor.history] == [10, 15]
    assert sorted(monitor._watched) == ["", "cell", "readout"]
    for w, record in enumerate(monitor.history):
        window = recorder.grads[7 * w : 7 * (w + 1)]
        for group in ("", "cell", "readout"):
            names = [n for n in window[0] if n.startswith(group)]
            expected = brute_force(window, names, batch_size=4)  # a chunk's 4 streams per step
            prefix = f"gradient_noise/{group}/" if group else "gradient_noise/"
            for key in ("batch_variance", "signal", "noise_scale"):
                assert close(logged(record, prefix + key), expected[key], 1e-5), (w, group, key)
    assert monitor._steps == 6  # the partial window is kept


class SavingNoiseMonitor(GradientNoiseMonitor):
    """Writes each process's history at the end of fit (ddp_spawn runs the callbacks in other processes)."""

    def __init__(self, folder, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def on_fit_end(self, trainer, pl_module):
        super().on_fit_end(trainer, pl_module)
        torch.save(self.history, self.folder / f"history-rank{trainer.global_rank}.pt")


@pytest.mark.ddp
def test_ddp_two_processes_log_the_single_process_statistics_of_the_same_global_batch(tmp_path, monkeypatch):
    # DDP: 2 processes with 8 rows each; Lightning shards the data with DistributedSampler(shuffle=True,
    # seed=PL_GLOBAL_SEED). One process: batches of 16 that are the union of the two ranks' batches. The gradient
    # the monitor reads is the all-reduced one, the global batch's.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    data = user_data(128)

    def run(folder, loader, **kwargs):
        folder.mkdir()
        pl.seed_everything(0)
        model = UserMLP(lr=0.1)
        monitor = SavingNoiseMonitor(folder, every_n_steps=2, window_steps=2, plot=False)
        trainer(folder, max_epochs=1, precision="64-true", callbacks=[monitor], **kwargs).fit(model, loader)

    run(tmp_path / "ddp", DataLoader(data, batch_size=8), strategy="ddp_spawn", devices=2)
    ranks = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=0)) for r in (0, 1)]
    union = [ranks[0][8 * t : 8 * (t + 1)] + ranks[1][8 * t : 8 * (t + 1)] for t in range(8)]
    run(tmp_path / "single", DataLoader(data, batch_sampler=union))

    single = torch.load(tmp_path / "single" / "history-rank0.pt")
    ranks = [torch.load(tmp_path / "ddp" / f"history-rank{r}.pt") for r in (0, 1)]
    assert [r["step"] for r in single] == [2, 4, 6, 8]
    for history in ranks:
        assert [r["step"] for r in history] == [2, 4, 6, 8]
        for a, b in zip(single, history, strict=True):
            assert a["values"].keys() == b["values"].keys()
            for key, value in a["values"].items():
                assert close(b["values"][key], value, 1e-9), (a["step"], key, value, b["values"][key])
    assert single[0]["values"]["gradient_noise/batch_variance"] > 0


def test_resume_from_a_checkpoint_inside_a_window_measures_the_same_windows(tmp_path):
    def fit(root, epochs, ckpt_path=None, callbacks=()):
        pl.seed_everything(0)
        model, monitor = UserMLP(), GradientNoiseMonitor(every_n_steps=5, window_steps=5, plot=False)
        run = trainer(root, max_epochs=epochs, callbacks=[monitor, *callbacks], enable_checkpointing=bool(callbacks))
        run.fit(model, DataLoader(user_data(), batch_size=8), ckpt_path=ckpt_path)
        return monitor

    straight = fit(tmp_path / "straight", 2)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = fit(tmp_path / "first", 1, callbacks=[checkpoint])  # 12 steps: windows at 5, 10 and 2 steps pending
    assert first._steps == 2
    saved = torch.load(checkpoint.last_model_path, weights_only=False)["callbacks"][first.state_key]
    assert saved["window"]["steps"] == 2 and set(saved["window"]["means"]) == {
        "encoder.0.weight",
        "encoder.0.bias",
        "head.weight",
        "head.bias",
    }
    resumed = fit(tmp_path / "resumed", 2, ckpt_path=checkpoint.last_model_path)
    assert [r["step"] for r in straight.history] == [5, 10, 15, 20]
    assert resumed.history == straight.history  # bit for bit: the pending window was restored


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_n_steps": 1}, "every_n_steps must be at least 2"),
        ({"every_n_steps": 0}, "every_n_steps must be a positive int"),
        ({"window_steps": 1}, "window_steps must be an int of at least 2"),
        ({"batch_size": 0}, "batch_size must be None"),
        ({"smoothing": 1.0}, r"smoothing must be a number in \[0, 1\)"),
        ({"every_n_steps": 5, "window_steps": 10}, "window_steps=10 is longer than every_n_steps=5: one window is"),
        ({"modules": "head"}, "modules must be None"),
    ],
)
def test_noise_monitor_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GradientNoiseMonitor(**kwargs)


def test_every_n_steps_is_the_interval_and_the_window_fits_in_it():
    # every_n_steps is the interval between measurements, as for every monitor; the window is named on its own
    assert (GradientNoiseMonitor().every_n_steps, GradientNoiseMonitor().window_steps) == (100, 20)
    assert GradientNoiseMonitor(every_n_steps=10).window_steps == 10  # the default window fits a short interval
    assert GradientNoiseMonitor(every_n_steps=50, window_steps=5).window_steps == 5


@pytest.mark.parametrize(
    "modules, match",
    [(["frozen"], "cannot monitor 'frozen': it has no trainable parameters"), (["decoder"], "no submodule 'decoder'")],
)
def test_noise_monitor_on_modules_it_cannot_measure_is_a_clear_error(modules, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        trainer(tmp_path, max_steps=1, callbacks=[GradientNoiseMonitor(modules=modules)]).fit(
            UserMLP(), DataLoader(user_data(), batch_size=8)
        )


# --------------------------------------------------------------------------------------- online estimators


def online_model(estimator, options=None, **kwargs):
    options = {} if options is None else options
    cell = TanhRNNCell(3, 5)
    return OnlineRNNModule(cell, 4, estimator=estimator, estimator_options=options, lr=0.01, **kwargs)


def bptt_gradient(module, probe):
    """The exact gradient of the probe's loss (the module's normalisation), by an unrolled loop written here."""
    cell = copy.deepcopy(module.cell)
    x, y, mask = probe["x"].to(next(cell.parameters()).dtype), probe["y"], probe["mask"]
    h = torch.zeros(x.shape[0], cell.hidden_size, dtype=x.dtype)
    loss = 0
    for t in range(x.shape[1]):
        h = cell(x[:, t], h)
        loss = loss + masked_loss_sum(module.readout(h), y[:, t], mask[:, t], module.loss_name) / x.shape[0]
    grads = torch.autograd.grad(loss, list(cell.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]).double()


def rtrl_gradient(module, probe):
    """The same gradient by exact forward-mode RTRL (an independent algorithm)."""
    rtrl = RTRL(module.cell)
    x = probe["x"].to(next(module.cell.parameters()).dtype)
    state = rtrl.initial_state(torch.zeros(x.shape[0], module.cell.hidden_size, dtype=x.dtype))
    total = 0
    for t in range(x.shape[1]):
        h, state = rtrl.step(x[:, t], state)
        h = h.detach().requires_grad_(True)
        loss = masked_loss_sum(module.readout(h), probe["y"][:, t], probe["mask"][:, t], module.loss_name)
        (grad_h,) = torch.autograd.grad(loss / x.shape[0], h)
        total = total + rtrl.layout.flatten(rtrl.gradient(state, grad_h), lead=0)
    return total.double()


@pytest.mark.parametrize(
    "estimator, options, biased",
    [("uoro", {}, False), ("tbptt", {"k": 1}, True), ("tbptt", {"k": 8}, False)],
    ids=["uoro", "tbptt-k=1", "tbptt-k=T"],
)
def test_bias_is_within_its_standard_error_for_uoro_and_large_for_short_truncation(
    estimator, options, biased, tmp_path
):
    pl.seed_everything(0)
    module = online_model(estimator, options, update_every=1)
    monitor = OnlineEstimatorVarianceMonitor(every_n_steps=8, draws=64, probe_streams=3, seed=1, plot=False)
    data = TinyStreams(streams=4, steps=8, chunks_per_epoch=3)
    trainer(tmp_path, max_epochs=1, precision="64-true", limit_val_batches=0, callbacks=[monitor]).fit(module, data)

    assert [r["step"] for r in monitor.history] == [8, 16, 24]
    first = data.chunk("train", 0)
    for key in ("x", "y", "mask"):
        assert torch.equal(monitor.probe[key], first[key][:3])
    # the exact gradient used is the gradient of the probe loss at the final parameters (the last measurement
    # follows the last update), by two independent computations
    last = monitor.last
    torch.testing.assert_close(last.exact, bptt_gradient(module, monitor.probe), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(last.exact, rtrl_gradient(module, monitor.probe), rtol=1e-9, atol=1e-11)
    # the logged statistics are those of the draws (per-coordinate variances across draws, summed)
    values = monitor.history[-1]["values"]
    draws = last.estimates
    variance = float(draws.var(0).sum()) if draws.shape[0] > 1 else 0.0
    if draws.shape[0] > 1:
        assert values["estimator_variance/total_variance"] == pytest.approx(variance, rel=1e-9, abs=1e-15)
    else:  # a deterministic estimator has no variance: not logged (a constant 0 is no measurement)
        assert not {"total_variance", "squared_bias_se", "relative_variance"} & {k.split("/")[1] for k in values}
    assert values["estimator_variance/exact_grad_sq"] == pytest.approx(float(last.exact.square().sum()), rel=1e-12)
    raw = float((draws.mean(0) - last.exact).square().sum())
    assert values["estimator_variance/squared_bias"] == pytest.approx(
        raw - variance / draws.shape[0], rel=1e-9, abs=1e-20
    )
    for record in monitor.history:
        v = record["values"]
        bias, se = v["estimator_variance/squared_bias"], v.get("estimator_variance/squared_bias_se", 0.0)
        if estimator == "uoro":
            assert draws.shape[0] == 64 and v["estimator_variance/total_variance"] > 0
            assert abs(bias) < 3 * se, record  # unbiased: consistent with zero
            assert v["estimator_variance/relative_variance"] > 0.1  # and a noisy estimate, as UORO's is
        elif biased:
            assert draws.shape[0] == 1 and "estimator_variance/total_variance" not in v
            assert bias > 1e3 * max(se, 1e-12) and v["estimator_variance/relative_bias"] > 0.01
        else:  # truncation at the probe's length: backprop through time itself
            assert v["estimator_variance/relative_bias"] < 1e-20


def test_bias_standard_error_matches_the_scatter_of_the_squared_bias():
    # Synthetic draws with a known covariance: without bias, squared_bias scatters around 0 with the standard error
    # logged (so squared_bias / se is a z-score); with a bias, it estimates ||bias||^2 without the tr(C)/R offset.
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([3.0, 1.0, 0.5, 0.2, 0.1, 0.1], dtype=torch.float64)
    for bias_norm in (0.0, 2.0):
        bias = torch.zeros(6, dtype=torch.float64)
        bias[1] = bias_norm
        results = []
        for _ in range(1000):
            estimates = bias + torch.randn(40, 6, generator=g, dtype=torch.float64) * scales
            stats = EstimatorVariance(torch.zeros(6, dtype=torch.float64), estimates, ("p",), ((6,),)).statistics()
            results.append((stats["squared_bias"], stats["squared_bias_se"], stats["total_variance"]))
        squared, se, variance = (torch.tensor(c, dtype=torch.float64) for c in zip(*results, strict=True))
        assert float(variance.mean()) == pytest.approx(float(scales.square().sum()), rel=0.03)
        assert float(squared.mean()) == pytest.approx(bias_norm**2, abs=3 * float(squared.std()) / 30)
        if bias_norm == 0:
            assert float(se.mean()) == pytest.approx(float(squared.std()), rel=0.1)
            assert float((squared.abs() > 3 * se).double().mean()) < 0.05
        else:
            assert float((squared > 3 * se).double().mean()) > 0.9


def test_measuring_leaves_training_bit_for_bit_unchanged(tmp_path):
    def fit(callbacks):
        pl.seed_everything(0)
        module = online_model("uoro", update_every=3, seed=4)
        data = TinyStreams(streams=4, steps=5, chunks_per_epoch=3, reset_every=2)
        trainer(tmp_path, max_epochs=2, callbacks=callbacks).fit(module, data)
        return module, torch.get_rng_state()

    plain, plain_rng = fit([])
    monitor = OnlineEstimatorVarianceMonitor(every_n_steps=2, draws=4, plot=False)
    watched, watched_rng = fit([monitor])
    assert len(monitor.history) >= 5  # it did measure, between updates
    for (name, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs"
    a, b = carried(plain), carried(watched)
    assert torch.equal(a["state"]["h"], b["state"]["h"]) and torch.equal(
        a["state"]["generator"], b["state"]["generator"]
    )
    for key in a["state"]["tensors"]:
        assert torch.equal(a["state"]["tensors"][key], b["state"]["tensors"][key]), key
    assert torch.equal(plain_rng, watched_rng)  # the global generator too


def test_estimator_monitor_needs_a_model_trained_online(tmp_path):
    monitor = OnlineEstimatorVarianceMonitor()
    with pytest.raises(
        ValueError, match=r"UserMLP is not a model trained online: it has no `estimator`.*GradientNoiseMonitor"
    ):
        trainer(tmp_path, max_steps=1, callbacks=[monitor]).fit(UserMLP(), DataLoader(user_data(), batch_size=8))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"draws": 1}, "draws must be an int >= 2"),
        ({"every_n_steps": 0}, "every_n_steps must be a positive int"),
        ({"probe_streams": 0}, "probe_streams must be a positive int"),
        ({"probe_steps": 0}, "probe_steps must be None"),
        ({"seed": -1}, "seed must be a non-negative int"),
    ],
)
def test_estimator_monitor_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OnlineEstimatorVarianceMonitor(**kwargs)
