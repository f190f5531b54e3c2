"""OnlineRNNModule with the estimators that came after UORO, by name: KF-RTRL, SnAp, RFLO and exact RTRL of diagonal
recurrences (the linear recurrent unit, whose complex state the readout reads as real and imaginary parts). Exact
ones equal full BPTT over a chunk; every one resumes bit for bit; KF-RTRL under DDP equals one process."""

import pytest
import torch
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import LinearRecurrentUnit, TanhRNNCell
from lightning_ortho.online.losses import masked_loss_sum
from tests.conftest import free_port
from tests.models.test_online_rnn_module import TinyStreams, assert_same_tree, carried, trainer


class ElementwiseTanhCell(nn.Module):
    """``h' = tanh(w * h + U x + b)`` with a vector ``w``: a diagonal recurrence, for which SnAp-1 is exact."""

    diagonal_recurrence = True  # for every w, so DiagonalRTRL takes it

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.w = nn.Parameter(0.5 * torch.randn(hidden_size))
        self.input = nn.Linear(input_size, hidden_size)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.w * h + self.input(x))


CELLS = {
    "tanh": lambda: TanhRNNCell(3, 5),
    "elementwise": lambda: ElementwiseTanhCell(3, 5),
    "lru": lambda: LinearRecurrentUnit(3, 5, r_min=0.4, r_max=0.9),
}


#: Parameters of LinearRecurrentUnit's own output ``Re(C h) + D x``, which OnlineRNNModule does not use (its readout
#: reads the state): the estimator gives them zero gradients.
OUTPUT_ONLY = ("C_re", "C_im", "D")


def model(estimator, cell, **kwargs):
    kwargs = {"optimizer": "adam", "lr": 0.01, **kwargs}
    return OnlineRNNModule(CELLS[cell](), 4, estimator=estimator, **kwargs)


def bptt_sgd_step(module, batch, lr):
    """Parameters after one SGD step on the full-BPTT gradient of ``sum_t L_t`` through one chunk (the module's
    normalisation: masked per-stream losses / streams), by autograd through the unrolled cell."""
    x, y, mask = batch["x"].double(), batch["y"], batch["mask"]
    h = module._zero_state(x.shape[0])
    loss = 0
    for t in range(x.shape[1]):
        h = module.cell(x[:, t], h)
        loss = loss + masked_loss_sum(module.readout(h), y[:, t], mask[:, t], module.loss_name) / x.shape[0]
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {
        name: p.detach() - lr * (torch.zeros_like(p) if g is None else g)
        for (name, p), g in zip(params.items(), grads, strict=True)
    }


@pytest.mark.parametrize(
    "estimator, options, cell",
    [
        ("diagonal_rtrl", {}, "lru"),
        ("diagonal_rtrl", {}, "elementwise"),
        ("snap", {"order": 1}, "elementwise"),
        ("snap", {"order": 2}, "tanh"),  # the dense cell's SnAp-2 pattern is full: RTRL
    ],
    ids=["diagonal-lru", "diagonal-elementwise", "snap1-elementwise", "snap2-tanh"],
)
def test_an_exact_estimator_over_a_chunk_equals_full_bptt(estimator, options, cell, tmp_path):
    steps, lr = 6, 0.3
    data = TinyStreams(streams=3, steps=steps, chunks_per_epoch=1)
    torch.manual_seed(0)
    module = model(estimator, cell, estimator_options=options, update_every=steps, optimizer="sgd", lr=lr).double()
    expected = bptt_sgd_step(module, data.chunk("train", 0), lr)
    initial = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer(tmp_path, max_epochs=1, precision="64-true", limit_val_batches=0).fit(module, data)
    assert module.global_step == 1
    for name, p in module.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=1e-10, atol=1e-12, msg=name)
    moved = max((p.detach() - q).abs().max() for p, q in zip(module.parameters(), initial.values(), strict=True))
    assert moved > 1e-3


@pytest.mark.parametrize(
    "estimator, options, cell",
    [("kf_rtrl", {}, "tanh"), ("snap", {"order": 1}, "tanh"), ("diagonal_rtrl", {}, "lru")],
    ids=["kf_rtrl", "snap1", "diagonal-lru"],
)
def test_fit_then_resume_equals_uninterrupted_fit_bit_for_bit(estimator, options, cell, tmp_path):
    def build(seed):
        pl.seed_everything(seed)
        data = TinyStreams(streams=3, steps=5, chunks_per_epoch=3, soft=True, reset_every=2)
        module = model(estimator, cell, estimator_options=options, update_every=4, seed=7, clip_gradient_norm=0.5)
        return module, data

    straight, data = build(0)
    trainer(tmp_path / "straight", max_epochs=2).fit(straight, data)
    first, data = build(0)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer(tmp_path / "first", max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint]).fit(first, data)
    assert first.carry.window_steps == 3 and first.carry.pending is not None
    resumed, data = build(123)  # other initial weights and global RNG: the checkpoint must decide everything
    trainer(tmp_path / "resumed", max_epochs=2).fit(resumed, data, ckpt_path=checkpoint.last_model_path)
    assert straight.global_step == resumed.global_step == 7
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resume"
    assert_same_tree(carried(straight), carried(resumed))
    if estimator == "kf_rtrl":
        assert straight.carry.state.generator is not None  # the sign stream itself was resumed


@pytest.mark.ddp
@pytest.mark.parametrize(
    "estimator, options, cell",
    [
        ("kf_rtrl", {}, "tanh"),
        ("snap", {"order": 1}, "tanh"),
        ("diagonal_rtrl", {}, "lru"),
        ("rflo", {"tau": 4.0}, "tanh"),
    ],
    ids=["kf_rtrl", "snap1", "diagonal-lru", "rflo"],
)
def test_ddp_two_processes_match_one_process_on_the_same_global_streams(
    estimator, options, cell, tmp_path, monkeypatch
):
    # KF-RTRL draws the signs of all four streams from its seed in every process and keeps its own rows; the
    # others draw nothing, and each process's gradient is normalised by its own streams before DDP averages.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    def run(root, **kwargs):
        pl.seed_everything(0)
        module = model(estimator, cell, estimator_options=options, update_every=2, lr=0.05)
        fit = trainer(root, max_epochs=1, precision="64-true", **kwargs)
        fit.fit(module, TinyStreams(streams=4, steps=5, chunks_per_epoch=3, val_streams=4))
        return module

    ddp = run(tmp_path / "ddp", strategy="ddp_spawn", devices=2)
    single = run(tmp_path / "single")
    pl.seed_everything(0)
    untrained = model(estimator, cell, estimator_options=options)
    for (name, a), b, c in zip(
        single.state_dict().items(), ddp.state_dict().values(), untrained.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(b, a.to(b.dtype), rtol=1e-6, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
        if name.split(".")[-1] in OUTPUT_ONLY:  # the LRU's output map: the module's readout reads the state instead
            continue
        assert (a.double() - c.double()).abs().max() > 1e-3, f"{name} did not move"


def test_rflo_trains_by_name_and_needs_its_time_constant(tmp_path):
    with pytest.raises(ValueError, match="tau"):
        model("rflo", "tanh")
    pl.seed_everything(0)
    module = model("rflo", "tanh", estimator_options={"tau": 4.0}, update_every=1)
    initial = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, TinyStreams(streams=3, steps=5))
    assert module.global_step == 15
    for name, p in module.named_parameters():
        assert torch.isfinite(p).all() and not torch.equal(p.detach(), initial[name]), name


def test_the_readout_of_a_complex_state_reads_real_and_imaginary_parts():
    module = model("diagonal_rtrl", "lru").double()
    assert module.readout.linear.in_features == 2 * module.cell.hidden_size
    h = torch.randn(2, 5, dtype=torch.complex128)
    features = torch.stack((h.real, h.imag), -1).flatten(1)
    torch.testing.assert_close(module.readout(h), module.readout.linear(features))
    outputs, last = module(torch.randn(2, 4, 3, dtype=torch.float64))
    assert outputs.shape == (2, 4, 4) and last.dtype == torch.complex128


@pytest.mark.parametrize(
    "estimator, options, cell, kind",
    [
        ("kf_rtrl", {}, "tanh", "unbiased"),
        ("snap", {"order": 1}, "tanh", "biased"),
        ("diagonal_rtrl", {}, "lru", "exact"),
    ],
    ids=["kf_rtrl", "snap1-dense", "diagonal-lru"],
)
def test_the_estimator_variance_monitor_measures_every_estimator(estimator, options, cell, kind, tmp_path):
    from lightning_ortho.callbacks import OnlineEstimatorVarianceMonitor

    pl.seed_everything(0)
    module = model(estimator, cell, estimator_options=options, update_every=1)
    monitor = OnlineEstimatorVarianceMonitor(every_n_steps=8, draws=64, probe_streams=3, seed=1, plot=False)
    data = TinyStreams(streams=4, steps=8, chunks_per_epoch=2)
    trainer(tmp_path, max_epochs=1, precision="64-true", limit_val_batches=0, callbacks=[monitor]).fit(module, data)
    assert [r["step"] for r in monitor.history] == [8, 16]
    # the exact gradient the monitor uses is BPTT's at the final parameters
    probe = monitor.probe
    expected = bptt_sgd_step(module, probe, 1.0)  # parameters minus the gradient: their difference is it
    flat = torch.cat([(p.detach() - expected[f"cell.{n}"]).reshape(-1) for n, p in module.cell.named_parameters()])
    torch.testing.assert_close(monitor.last.exact, flat.double(), rtol=1e-10, atol=1e-12)
    for record in monitor.history:
        values = record["values"]
        bias, se = values["estimator_variance/squared_bias"], values.get("estimator_variance/squared_bias_se", 0.0)
        if kind == "unbiased":  # random signs: a noisy estimate whose mean is the exact gradient
            assert monitor.last.estimates.shape[0] == 64 and values["estimator_variance/total_variance"] > 0
            assert abs(bias) < 3 * se, record
        elif kind == "biased":  # deterministic, and the dense cell's couplings it drops show as a bias
            assert monitor.last.estimates.shape[0] == 1
            assert values["estimator_variance/relative_bias"] > 1e-6
        else:
            assert values["estimator_variance/relative_bias"] < 1e-20
