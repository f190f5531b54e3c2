"""OnlineRNNModule: online training by manual optimisation."""

import copy
import math

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_ortho._lightning import pl
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import InfluenceBalancingCell, TanhRNNCell
from lightning_ortho.online.losses import masked_loss_sum
from tests.conftest import free_port, make_tiny_trainer


class _Chunks(IterableDataset):
    """``count`` chunks of the given streams: training chunks from the data module's position on (advancing it, as
    the stream data modules do), validation chunks ``0 .. count - 1``."""

    def __init__(self, data, split, streams, count):
        self.data, self.split, self.streams, self.count = data, split, streams, count

    def __len__(self):
        return self.count

    def __iter__(self):
        for k in range(self.count):
            if self.split == "train":
                chunk = self.data.next_chunk
                self.data.next_chunk += 1
            else:
                chunk = k
            yield self.data.chunk(self.split, chunk, self.streams)


class TinyStreams(pl.LightningDataModule):
    """Random streams in the batch contract of the stream data modules: ``x`` ``(b, T, I)``, ``y``, ``mask``,
    ``reset``, ``chunk``; chunk ``k`` of stream ``j`` depends only on ``(seed, split, j, k)``; rank ``r`` of ``W``
    holds streams ``r::W``; the training position is the data module's state."""

    def __init__(
        self,
        streams=4,
        steps=5,
        chunks_per_epoch=3,
        input_size=3,
        output_size=4,
        loss="cross_entropy",
        soft=False,
        val_streams=2,
        val_chunks=2,
        reset_every=None,
        seed=0,
    ):
        super().__init__()
        self.streams, self.steps, self.chunks_per_epoch = streams, steps, chunks_per_epoch
        self.input_size, self.output_size, self.loss, self.soft = input_size, output_size, loss, soft
        self.val_streams, self.val_chunks, self.reset_every, self.seed = val_streams, val_chunks, reset_every, seed
        self.next_chunk = 0

    def chunk(self, split, k, streams=None):
        total = self.streams if split == "train" else self.val_streams
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + (split == "val") * 10_007 + k)
        x = torch.randn(total, self.steps, self.input_size, generator=g)
        if self.loss == "mse":
            y = torch.randn(total, self.steps, self.output_size, generator=g)
        elif self.soft:
            y = torch.softmax(torch.randn(total, self.steps, self.output_size, generator=g), -1)
        else:
            y = torch.randint(0, self.output_size, (total, self.steps), generator=g)
        mask = torch.rand(total, self.steps, generator=g) < 0.8
        restart = k == 0 or (self.reset_every is not None and k % self.reset_every == 0)
        reset = torch.rand(total, generator=g) < 0.5 if restart and k else torch.full((total,), restart)
        streams = torch.arange(total) if streams is None else streams
        batch = {"x": x, "y": y, "mask": mask, "reset": reset}
        return {**{key: v[streams] for key, v in batch.items()}, "chunk": torch.tensor(k)}

    def _mine(self, total):
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return torch.arange(total)[rank::world]

    def train_dataloader(self):
        return DataLoader(_Chunks(self, "train", self._mine(self.streams), self.chunks_per_epoch), batch_size=None)

    def val_dataloader(self):
        return DataLoader(_Chunks(self, "val", self._mine(self.val_streams), self.val_chunks), batch_size=None)

    def state_dict(self):
        return {"next_chunk": self.next_chunk}

    def load_state_dict(self, state):
        self.next_chunk = state["next_chunk"]


def model(estimator="tbptt", hidden=5, input_size=3, output_size=4, **kwargs):
    options = {"tbptt": {"k": 3}, "rtrl": {}, "uoro": {}}[estimator]
    kwargs = {"estimator_options": options, "optimizer": "adam", "lr": 0.01, **kwargs}
    return OnlineRNNModule(TanhRNNCell(input_size, hidden), output_size, estimator=estimator, **kwargs)


def trainer(root, **kwargs):
    return make_tiny_trainer(root, **{"deterministic": True, "num_sanity_val_steps": 0, **kwargs})


def bptt_sgd_step(module, batch, lr):
    """Parameters after one SGD step on the full-BPTT gradient of ``sum_t L_t`` through one chunk, with
    ``L_t = sum of the masked per-stream losses / streams`` (the module's normalisation)."""
    module = copy.deepcopy(module)
    x, y, mask = batch["x"].double(), batch["y"], batch["mask"]
    b = x.shape[0]
    h = torch.zeros(b, module.cell.hidden_size, dtype=torch.float64)
    loss = 0
    for t in range(x.shape[1]):
        h = module.cell(x[:, t], h)
        target = y[:, t].double() if y.is_floating_point() else y[:, t]
        loss = loss + masked_loss_sum(module.readout(h), target, mask[:, t], module.loss_name) / b
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()))
    return {name: p.detach() - lr * g for (name, p), g in zip(params.items(), grads, strict=True)}


@pytest.mark.parametrize(
    "estimator, options, loss, soft",
    [
        ("rtrl", {}, "cross_entropy", False),
        ("rtrl", {}, "cross_entropy", True),
        ("rtrl", {}, "mse", False),
        ("tbptt", {"k": 6}, "cross_entropy", False),
    ],
    ids=["rtrl-ce", "rtrl-soft-ce", "rtrl-mse", "tbptt-k=T"],
)
def test_one_update_over_a_chunk_equals_full_bptt(estimator, options, loss, soft, tmp_path):
    steps, lr = 6, 0.3
    data = TinyStreams(streams=3, steps=steps, chunks_per_epoch=1, loss=loss, soft=soft)
    module = model(estimator, estimator_options=options, loss=loss, update_every=steps, optimizer="sgd", lr=lr).double()
    expected = bptt_sgd_step(module, data.chunk("train", 0), lr)
    initial = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer(tmp_path, max_epochs=1, precision="64-true", limit_val_batches=0).fit(module, data)
    assert module.global_step == 1
    for name, p in module.named_parameters():
        assert p.dtype == torch.float64
        torch.testing.assert_close(p.detach(), expected[name], rtol=1e-10, atol=1e-12, msg=name)
    moved = max((p.detach() - q).abs().max() for p, q in zip(module.parameters(), initial.values(), strict=True))
    assert moved > 1e-3  # the step did something


def carried(module):
    """What the module carries between chunks: the estimator state, the window position and buffer."""
    carry = module.carry
    return {
        "state": carry.state.state_dict(),
        "next": carry.next_chunk,
        "window": carry.window_steps,
        "pending": carry.pending,
    }


def assert_same_tree(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tree(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, where


@pytest.mark.parametrize("estimator", ["tbptt", "uoro", "rtrl"])
def test_fit_then_resume_equals_uninterrupted_fit_bit_for_bit(estimator, tmp_path):
    # 3 chunks of 5 steps per epoch and an update every 4 steps: the checkpoint falls inside an update window
    # (3 pending steps), with chunk resets, a soft-target loss and Adam's moments in flight.
    def build(seed):
        pl.seed_everything(seed)
        data = TinyStreams(streams=3, steps=5, chunks_per_epoch=3, soft=True, reset_every=2)
        return model(estimator, update_every=4, seed=7, clip_gradient_norm=0.5), data

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
    if estimator == "uoro":
        assert straight.carry.state.generator is not None  # the noise stream itself was resumed


def test_chunks_out_of_order_raise(tmp_path):
    data = TinyStreams()
    shuffled = [data.chunk("train", k) for k in (0, 2, 1)]
    with pytest.raises(ValueError, match=r"training chunk 2 arrived where chunk 1 was expected.*must not shuffle"):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(model(), DataLoader(shuffled, batch_size=None))


def test_chunk_zero_restarts_the_streams_and_a_fresh_model_accepts_any_first_chunk(tmp_path):
    data = TinyStreams()
    chunks = [data.chunk("train", k) for k in (4, 5, 0, 1)]
    module = model()
    trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, DataLoader(chunks, batch_size=None))
    assert module.carry.next_chunk == 2


def test_validation_chunks_out_of_order_raise(tmp_path):
    data = TinyStreams()
    val = [data.chunk("val", k) for k in (0, 1, 0, 2)]  # 0 restarts a pass; 2 after 0 skips one
    with pytest.raises(ValueError, match="validation chunk 2 arrived where chunk 1 was expected"):
        trainer(tmp_path).validate(model(), DataLoader(val, batch_size=None))


@pytest.mark.parametrize(
    "data_kwargs, match",
    [
        (
            {"input_size": 4},
            r"input_size=4 but the cell has input_size=3; set --model.init_args.cell.init_args.input_size=4",
        ),
        ({"output_size": 6}, r"output_size=6 but the model has output_size=4; set --model.init_args.output_size=6"),
        ({"loss": "mse"}, r"loss='mse' but the model has loss='cross_entropy'; set --model.init_args.loss=mse"),
    ],
    ids=["input", "output", "loss"],
)
def test_data_module_that_disagrees_with_the_model_is_a_clear_error(data_kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        trainer(tmp_path, max_epochs=1).fit(model(), TinyStreams(**data_kwargs))


@pytest.mark.parametrize(
    "batch_change, match",
    [
        (lambda b: {**b, "x": b["x"][..., :2]}, r"2 input features per step but the cell's input_size is 3"),
        (lambda b: {**b, "y": torch.zeros(*b["y"].shape, 6)}, r"set --model.init_args.output_size=6"),
        (lambda b: {k: v for k, v in b.items() if k != "chunk"}, r"must be a dict with 'x' .* 'chunk'"),
        (lambda b: {**b, "mask": b["mask"].float()}, r"batch\['mask'\] must be bool"),
    ],
    ids=["x", "y", "no-chunk", "mask"],
)
def test_batches_that_break_the_stream_contract_are_clear_errors(batch_change, match, tmp_path):
    batches = [batch_change(TinyStreams().chunk("train", 0))]
    with pytest.raises(ValueError, match=match):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(model(), DataLoader(batches, batch_size=None))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"cell": torch.nn.Linear(2, 2)}, "int hidden_size attribute"),
        ({"output_size": 0}, "output_size must be a positive integer"),
        ({"loss": "l1"}, r"loss must be one of \('cross_entropy', 'mse'\)"),
        ({"readout": "mean"}, r"readout must be one of \('linear', 'units'\)"),
        ({"readout": "units", "output_size": 9}, "first output_size=9 units of the state, but the cell has only 5"),
        (
            {"estimator": "bptt"},
            r"estimator must be one of \('uoro', 'rtrl', 'tbptt', 'kf_rtrl', 'snap', 'diagonal_rtrl', 'rflo'\)",
        ),
        (
            {"estimator": "tbptt", "estimator_options": {}},
            r"needs the truncation length: estimator_options=\{'k': 10\}",
        ),
        ({"estimator": "rtrl", "estimator_options": {"k": 3}}, r"\['k'\] are not options of estimator='rtrl'"),
        ({"estimator": "uoro", "estimator_options": {"projection": "cube"}}, "projection must be one of"),
        ({"estimator": "uoro", "estimator_options": {"generator": 3}}, "seeded by the model's `seed`"),
        ({"update_every": 0}, "update_every must be a positive integer"),
        ({"optimizer": "lbfgs"}, r"optimizer must be one of \('sgd', 'adam'\)"),
        ({"lr": 0.0}, "lr must be a positive number"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"clip_gradient_norm": 0}, "clip_gradient_norm must be a positive number or None"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_do(kwargs, match):
    args = {"cell": TanhRNNCell(3, 5), "output_size": 4, "estimator": "rtrl", **kwargs}
    with pytest.raises(ValueError, match=match):
        OnlineRNNModule(**args)


@pytest.mark.ddp
@pytest.mark.parametrize("estimator", [pytest.param("tbptt", marks=pytest.mark.slow), "uoro"])  # ~25 s each
def test_ddp_two_processes_match_one_process_on_the_same_global_streams(estimator, tmp_path, monkeypatch):
    # Two processes with streams 0, 2 and 1, 3 against one process with all four. Each process's gradient is
    # normalised by its own streams and DDP averages the two manual_backward gradients, so the updates agree;
    # UORO draws the noise of all four streams from its seed in every process and keeps its own rows.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    def run(root, **kwargs):
        pl.seed_everything(0)
        module = model(estimator, update_every=2, lr=0.05)
        fit = trainer(root, max_epochs=1, precision="64-true", **kwargs)
        fit.fit(module, TinyStreams(streams=4, steps=5, chunks_per_epoch=3, val_streams=4))
        return module, fit

    ddp, ddp_fit = run(tmp_path / "ddp", strategy="ddp_spawn", devices=2)
    single, single_fit = run(tmp_path / "single")
    pl.seed_everything(0)
    untrained = model(estimator)
    for (name, a), b, c in zip(
        single.state_dict().items(), ddp.state_dict().values(), untrained.state_dict().values(), strict=True
    ):
        # ddp_spawn hands rank 0's float64 weights back into the main process's float32 model: compare there
        torch.testing.assert_close(b, a.to(b.dtype), rtol=1e-6, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
        assert (a.double() - c.double()).abs().max() > 1e-3, f"{name} did not move"
    # the validation loss is reduced over the processes' streams exactly (a weighted mean over masked entries)
    torch.testing.assert_close(ddp_fit.callback_metrics["val_loss"], single_fit.callback_metrics["val_loss"])


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_mixed_and_double_precision_train_without_nan(precision, tmp_path):
    module = model("uoro", update_every=1)
    fit = trainer(tmp_path, max_epochs=1, precision=precision)
    fit.fit(module, TinyStreams())
    dtype = torch.float64 if precision == "64-true" else torch.float32
    assert all(p.dtype == dtype and torch.isfinite(p).all() for p in module.parameters())
    assert module.carry.state.h.dtype == dtype  # the estimator's recursion stays out of autocast
    assert torch.isfinite(fit.callback_metrics["train_loss"]) and torch.isfinite(fit.callback_metrics["val_loss"])


def test_influence_balancing_exact_gradient_converges_where_short_truncation_goes_the_wrong_way(tmp_path):
    # Tallec & Ollivier's influence balancing through the "units" readout and MSE: theta's total influence on
    # the first unit is negative, its influence over the last 2 steps positive (fixed point theta = -1/6).
    chunks = [
        {
            "x": torch.zeros(1, 10, 1),
            "y": torch.ones(1, 10, 1),
            "mask": torch.ones(1, 10, dtype=torch.bool),
            "reset": torch.tensor([k == 0]),
            "chunk": torch.tensor(k),
        }
        for k in range(30)
    ]
    thetas, losses = {}, {}
    for estimator, options in (("rtrl", {}), ("tbptt", {"k": 2})):
        module = OnlineRNNModule(
            InfluenceBalancingCell(23, 10),
            1,
            loss="mse",
            readout="units",
            estimator=estimator,
            estimator_options=options,
            optimizer="sgd",
            lr=2e-4,
        )
        fit = trainer(tmp_path, max_epochs=1, limit_val_batches=0)
        fit.fit(module, DataLoader(chunks, batch_size=None))
        thetas[estimator], losses[estimator] = float(module.cell.theta), float(fit.callback_metrics["train_loss"])
    assert abs(thetas["rtrl"] + 1 / 6) < 0.05 and losses["rtrl"] < 0.3
    assert thetas["tbptt"] > 0.05 and losses["tbptt"] > 0.9  # moved away from the solution


def test_validation_runs_each_pass_from_a_zero_state_and_leaves_training_alone(tmp_path):
    data = TinyStreams(val_chunks=3, reset_every=2)
    module = model("uoro")
    fit = trainer(tmp_path, max_epochs=1, limit_val_batches=0)
    fit.fit(module, data)
    carried_before = carried(module)
    total, count = 0.0, 0
    h = None
    with torch.no_grad():
        for k in range(3):
            batch = data.chunk("val", k)
            h = torch.zeros(2, 5) if h is None else torch.where(batch["reset"][:, None], 0.0, h)
            outputs, h = module(batch["x"], h)
            for t in range(batch["x"].shape[1]):
                total += float(masked_loss_sum(outputs[:, t], batch["y"][:, t], batch["mask"][:, t], "cross_entropy"))
            count += int(batch["mask"].sum())
    for _ in range(2):  # a second pass starts afresh and gives the same value
        metrics = trainer(tmp_path).validate(module, data, verbose=False)[0]
        assert metrics["val_loss"] == pytest.approx(total / count, rel=1e-5)
        assert metrics["val_bits"] == pytest.approx(total / count / math.log(2), rel=1e-5)
    assert_same_tree(carried(module), carried_before)


@pytest.mark.ddp
@pytest.mark.slow
def test_ddp_resume_restores_every_process_estimator_state(tmp_path, monkeypatch):
    # Rank 1's estimator state and gradient window reach the checkpoint that rank 0 writes (gathered), and come
    # back to rank 1 on resume: otherwise its gradients, and so the all-reduced update, would differ.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    def run(root, epochs, ckpt_path=None, **kwargs):
        pl.seed_everything(0)
        module = model("uoro", update_every=4)
        data = TinyStreams(streams=4, steps=5, chunks_per_epoch=3, val_streams=2)
        fit = trainer(root, max_epochs=epochs, strategy="ddp_spawn", devices=2, **kwargs)
        fit.fit(module, data, ckpt_path=ckpt_path)
        return module

    straight = run(tmp_path / "straight", 2)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    run(tmp_path / "first", 1, enable_checkpointing=True, callbacks=[checkpoint])
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["online_rnn_module"]
    assert saved["world_size"] == 2 and saved["window_steps"] == 3
    rank0, rank1 = saved["ranks"]
    assert not torch.equal(rank0["state"]["h"], rank1["state"]["h"])  # each process's own streams
    assert rank1["state"]["tensors"]["stream_ids"].tolist() == [1, 3]
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    resumed = run(tmp_path / "resumed", 2, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resume"
