"""OnlineLRUStackModule: an LRUStack trained online in Lightning by OnlineLRUStack, against OnlineLRUStack's own loop
(its gradient is tested against its reference in tests/online/test_lru_stack.py) in float64."""

import copy
import math
from pathlib import Path

import pytest
import torch

from lightning_ortho._lightning import pl
from lightning_ortho.cli import run_cli
from lightning_ortho.models import OnlineLRUStackModule
from lightning_ortho.online import LRUStack, OnlineLRUStack, TanhRNNCell
from lightning_ortho.online.losses import masked_loss_sum
from tests.conftest import free_port
from tests.models.test_online_rnn_module import TinyStreams, trainer

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "online_copy_lru_stack.yaml"
INPUT, HIDDEN, OUTPUT, LAYERS, MODEL = 3, 4, 4, 2, 5


def stack(seed=0):
    torch.manual_seed(seed)
    return LRUStack(INPUT, HIDDEN, OUTPUT, LAYERS, model_size=MODEL, r_min=0.6, r_max=0.95, max_phase=math.pi)


def module(seed=0, **kwargs):
    return OnlineLRUStackModule(stack(seed), **{"optimizer": "adam", "lr": 0.01, **kwargs})


def reference_sgd(model, chunks, lr, loss, update_every):
    """OnlineLRUStack's own loop: parameters after SGD on its gradient, one update every ``update_every`` steps, with
    ``L_t = masked_loss_sum(y_t) / streams`` differentiated by autograd; chunk 0 starts from zero states and a chunk's
    ``reset`` restarts those streams. Returns the trained model and the gradient of the window left open."""
    model = copy.deepcopy(model)
    online = OnlineLRUStack(model)
    window, steps, state = None, 0, None
    for batch in chunks:
        x, y, mask, streams = batch["x"].double(), batch["y"], batch["mask"], batch["x"].shape[0]
        if state is None or int(batch["chunk"]) == 0:
            state = online.initial_state(streams)
        state = online.reset(state, batch["reset"])
        for t in range(x.shape[1]):
            y_t, state = online.step(x[:, t], state)
            target = y[:, t].double() if y.is_floating_point() else y[:, t]
            if mask[:, t].any():
                (grad_y,) = torch.autograd.grad(masked_loss_sum(y_t, target, mask[:, t], loss) / streams, y_t)
                grads = online.gradient(state, grad_y)
                window = grads if window is None else {n: window[n] + g for n, g in grads.items()}
            steps += 1
            if steps == update_every:
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        if window is not None:
                            p -= lr * window[name]
                window, steps = None, 0
    return model, window


@pytest.mark.parametrize("loss, soft", [("cross_entropy", False), ("cross_entropy", True), ("mse", False)])
@pytest.mark.parametrize("update_every", [1, 7])
def test_training_equals_online_lru_stacks_own_loop_in_float64(loss, soft, update_every, tmp_path):
    # 2 chunks of 5 steps: resets, masked entries, an update per step or every 7 steps (across the chunks; 3 left)
    lr = 0.1
    data = TinyStreams(streams=3, steps=5, chunks_per_epoch=2, loss=loss, soft=soft, reset_every=1)
    model = module(loss=loss, optimizer="sgd", lr=lr, update_every=update_every).double()
    chunks = [data.chunk("train", k) for k in range(2)]
    expected, window = reference_sgd(model.cell, chunks, lr, loss, update_every)
    initial = copy.deepcopy(model.cell)
    trainer(tmp_path, max_epochs=1, precision="64-true", limit_val_batches=0).fit(model, data)
    assert model.global_step == 10 // update_every
    moved = 0.0
    for (name, p), q, p0 in zip(
        model.cell.named_parameters(), expected.parameters(), initial.parameters(), strict=True
    ):
        assert p.dtype == torch.float64
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-10, atol=1e-12, msg=name)
        moved = max(moved, float((p - p0).abs().max()))
    assert moved > 1e-3  # the updates did something
    pending = model.carry.pending
    if update_every == 1:
        assert pending is None and window is None
    else:  # an update at step 7 (its window spans the chunks), then 3 steps whose summed gradient is pending
        assert model.carry.window_steps == 3 and window is not None
        assert sorted(pending) == sorted(f"cell.{name}" for name in window)  # every parameter of the stack
        for name, g in window.items():
            torch.testing.assert_close(pending[f"cell.{name}"], g, rtol=1e-10, atol=1e-12, msg=name)


def _tree_equal(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _tree_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _tree_equal(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, where


def carried(model):
    carry = model.carry
    return {
        "state": carry.state.state_dict(),
        "next": carry.next_chunk,
        "window": carry.window_steps,
        "pending": carry.pending,
    }


def test_fit_then_resume_equals_uninterrupted_fit_bit_for_bit(tmp_path):
    # 3 chunks of 5 steps per epoch and an update every 4 steps: the checkpoint falls inside an update window
    # (3 pending steps), with chunk resets, soft targets, clipping and Adam's moments in flight.
    def build(seed):
        pl.seed_everything(seed)
        data = TinyStreams(streams=3, steps=5, chunks_per_epoch=3, soft=True, reset_every=2)
        return module(seed, update_every=4, clip_gradient_norm=0.5), data

    straight, data = build(0)
    trainer(tmp_path / "straight", max_epochs=2).fit(straight, data)

    first, data = build(0)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer(tmp_path / "first", max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint]).fit(first, data)
    assert first.carry.window_steps == 3 and first.carry.pending is not None
    saved = torch.load(checkpoint.last_model_path, weights_only=False)["online_rnn_module"]["ranks"][0]["state"]
    assert saved["kind"] == OnlineLRUStack.name and len(saved["layers"]) == LAYERS
    assert all(layer["h"].device.type == "cpu" and layer["h"].abs().max() > 0 for layer in saved["layers"])
    resumed, data = build(123)  # other initial weights and global RNG: the checkpoint must decide everything
    trainer(tmp_path / "resumed", max_epochs=2).fit(resumed, data, ckpt_path=checkpoint.last_model_path)

    assert straight.global_step == resumed.global_step == 7
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resume"
    _tree_equal(carried(straight), carried(resumed))


def test_a_checkpoint_of_another_stack_is_refused_naming_the_fit(tmp_path):
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    data = TinyStreams(streams=3, steps=5, chunks_per_epoch=2)
    trainer(tmp_path / "a", max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint]).fit(module(), data)
    saved = torch.load(checkpoint.last_model_path, weights_only=False)
    other = module()
    other.on_load_checkpoint({**saved, "online_rnn_module": {**saved["online_rnn_module"], "ranks": [
        {**saved["online_rnn_module"]["ranks"][0], "state": {"kind": OnlineLRUStack.name, "layers": []}}
    ]}})  # fmt: skip
    with pytest.raises(ValueError, match="does not fit this model's estimator.*lru_stack_online"):
        other._begin_chunk(other._read(data.chunk("train", 2)))


def test_validation_is_the_stack_run_forward_from_zero_states(tmp_path):
    data = TinyStreams(streams=3, steps=5, chunks_per_epoch=2, val_streams=2, val_chunks=2)
    model = module()
    chunks = [data.chunk("val", k) for k in range(2)]
    states, total, count = model.cell.initial_states(2), 0.0, 0
    with torch.no_grad():  # reference: LRUStack.step written out, zero states at chunk 0
        for batch in chunks:
            for t in range(batch["x"].shape[1]):
                y_t, states = model.cell.step(batch["x"][:, t], states)
                total += float(masked_loss_sum(y_t, batch["y"][:, t], batch["mask"][:, t], "cross_entropy"))
                count += int(batch["mask"][:, t].sum())
    metrics = trainer(tmp_path).validate(model, data, verbose=False)[0]
    assert metrics["val_loss"] == pytest.approx(total / count, rel=1e-5)
    assert metrics["val_bits"] == pytest.approx(total / count / math.log(2), rel=1e-5)


def test_forward_carries_the_blocks_states_side_by_side():
    model = module().double()
    x = torch.randn(2, 6, INPUT, dtype=torch.float64)
    whole, last = model(x)
    expected, states = model.cell(x.transpose(0, 1))  # LRUStack.forward: time first
    torch.testing.assert_close(whole, expected.transpose(0, 1), rtol=0, atol=1e-14)
    torch.testing.assert_close(last, torch.cat(states, 1), rtol=0, atol=1e-14)
    first, h = model(x[:, :4])
    rest, again = model(x[:, 4:], h)  # from the carried states: the same outputs
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, rtol=0, atol=1e-14)
    torch.testing.assert_close(again, last, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match=r"h0 must be the blocks' states side by side.*\(2, 8\)"):
        model(x, torch.zeros(2, HIDDEN, dtype=torch.complex128))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"cell": TanhRNNCell(3, 4)}, "cell must be a lightning_ortho.online.LRUStack.*OnlineRNNModule"),
        ({"lr": 0.0}, "lr must be a positive number"),
        ({"update_every": 0}, "update_every must be a positive integer"),
        ({"loss": "hinge"}, "loss must be one of"),
        ({"num_threads": 0}, "num_threads"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OnlineLRUStackModule(**{"cell": stack(), **kwargs})


def test_the_recipe_links_the_datas_input_size_into_the_stack_and_resumes_from_its_checkpoint(tmp_path):
    short = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.logger=false"]
    short += ["--data.init_args.delay=3", "--data.init_args.chunk_length=8", "--trainer.enable_progress_bar=false"]
    fit = run_cli(["fit", "--config", str(RECIPE), f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1",
                   *short])  # fmt: skip
    data, model = fit.datamodule, fit.model
    assert isinstance(model, OnlineLRUStackModule)
    assert (model.cell.input_size, model.cell.output_size) == (data.input_size, data.output_size)
    assert model.output_size == data.output_size and model.global_step == 2 * 8
    checkpoint = next((tmp_path / "checkpoints").glob("*.ckpt"))
    resumed = run_cli(["fit", "--config", str(RECIPE), f"--trainer.default_root_dir={tmp_path / 'resumed'}",
                       f"--ckpt_path={checkpoint}", "--trainer.max_epochs=2", *short])  # fmt: skip
    assert resumed.model.global_step == 2 * 2 * 8
    assert resumed.model.carry.state.step > 0 and resumed.model.carry.next_chunk == 4
    tested = run_cli(["test", "--config", str(RECIPE), f"--trainer.default_root_dir={tmp_path / 'test'}",
                      f"--ckpt_path={checkpoint}", "--trainer.limit_test_batches=1", *short])  # fmt: skip
    assert math.isfinite(float(tested.trainer.callback_metrics["test_loss"]))


def test_an_output_size_that_is_not_the_datas_names_the_stacks_option(tmp_path):
    with pytest.raises(ValueError, match=r"has output_size=9 but the stack has output_size=5; set --model\.init_args"
                       r"\.cell\.init_args\.output_size=9"):  # fmt: skip
        run_cli(["fit", "--config", str(RECIPE), f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
                 "--trainer.fast_dev_run=true", "--data.init_args.symbols=8"])  # fmt: skip


@pytest.mark.ddp
@pytest.mark.slow  # ~25-45 s: two spawned processes
def test_ddp_two_processes_match_one_process_on_the_same_global_streams(tmp_path, monkeypatch):
    # Streams 0, 2 and 1, 3 in two processes (each its own blocks' states and traces) against all four in one.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    def run(root, **kwargs):
        model = module(update_every=2, lr=0.05)
        fit = trainer(root, max_epochs=1, precision="64-true", **kwargs)
        fit.fit(model, TinyStreams(streams=4, steps=5, chunks_per_epoch=3, val_streams=4, reset_every=2))
        return model, fit

    ddp, ddp_fit = run(tmp_path / "ddp", strategy="ddp_spawn", devices=2)
    single, single_fit = run(tmp_path / "single")
    untrained = module()
    for (name, a), b, c in zip(
        single.state_dict().items(), ddp.state_dict().values(), untrained.state_dict().values(), strict=True
    ):
        # ddp_spawn hands rank 0's float64 weights back into the main process's float32 model: compare there
        torch.testing.assert_close(b, a.to(b.dtype), rtol=1e-6, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
        assert (a.double() - c.double()).abs().max() > 1e-3, f"{name} did not move"
    torch.testing.assert_close(ddp_fit.callback_metrics["val_loss"], single_fit.callback_metrics["val_loss"])


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_mixed_and_double_precision_train_the_stack_outside_autocast(precision, tmp_path):
    model = module()
    fit = trainer(tmp_path, max_epochs=1, precision=precision)
    fit.fit(model, TinyStreams())
    dtype = torch.float64 if precision == "64-true" else torch.float32
    assert all(p.dtype == dtype and torch.isfinite(p).all() for p in model.parameters())
    assert all(h.dtype == model.cell.layers[0].lru.state_dtype() for h in model.carry.state.h)
    assert torch.isfinite(fit.callback_metrics["train_loss"]) and torch.isfinite(fit.callback_metrics["val_loss"])


def test_auto_threads_follow_the_stacks_widest_layer():
    model = module()  # hidden 4, model 5, MLP 10
    (threads,) = model.configure_callbacks()
    assert threads.hidden_size == 2 * MODEL and model.estimator.num_threads == "auto"
    model = OnlineLRUStackModule(stack(), num_threads=3)
    assert model.configure_callbacks()[0].setting == 3 and model.estimator.num_threads is None
