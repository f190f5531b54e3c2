"""OnlineRNNModule's chunk: no host read in its steps, and ``compile=True`` (the steps as one compiled region per
update window's piece of a chunk) trains exactly as the eager module does.

The default suite compiles with the ``aot_eager`` backend (Dynamo's capture and AOT autograd's functionalisation,
where a graph breaks, without inductor's code generation); the inductor variant is marked ``slow``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from lightning_ortho._lightning import pl
from lightning_ortho._native import native_kernels
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.models.online.chunk import run_steps
from lightning_ortho.online import LinearRecurrentUnit, TanhRNNCell
from tests.models.test_online_rnn_module import TinyStreams, assert_same_tree, carried, trainer
from tests.online.test_devices import noise_from_the_cpu
from tests.sync_counter import HostSyncCounter

OPTIONS = {"rtrl": {}, "rflo": {"tau": 3.0}, "snap": {"order": 1}, "diagonal_rtrl": {}, "uoro": {}, "kf_rtrl": {}}
OPTIONS["tbptt"] = {"k": 3}


def _module(estimator, **kwargs):
    cell = LinearRecurrentUnit(3, 4) if estimator == "diagonal_rtrl" else TanhRNNCell(3, 4)
    options = {"estimator_options": OPTIONS[estimator], "optimizer": "adam", "lr": 0.05, "seed": 3, **kwargs}
    return OnlineRNNModule(cell, 4, estimator=estimator, **options).double()  # float64: equal to rounding


def _fit(
    tmp_path,
    estimator,
    compile,
    epochs=1,
    ckpt_path=None,
    callbacks=(),
    backend="aot_eager",
    accelerator="cpu",
    **kwargs,
):
    """A fit of 3 chunks of 4 steps per epoch, an update every 2 steps (2 compiled calls per chunk), resets at
    chunk 2, on ``accelerator``; returns the module and the train_loss logged after each chunk."""
    pl.seed_everything(0)
    module = _module(estimator, compile=compile, compile_backend=backend, **{"update_every": 2, **kwargs})
    module.initial = [p.detach().clone() for p in module.parameters()]
    module.graphs, module.devices = [], set()  # the devices of the parameters and the state while training
    data = TinyStreams(streams=3, steps=4, chunks_per_epoch=3, reset_every=2, soft=True)
    losses = []

    class Losses(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            losses.append(float(trainer.callback_metrics["train_loss"]))
            module.graphs.append(counters["stats"]["unique_graphs"])  # graphs compiled so far
            module.devices.add((next(module.parameters()).device.type, module.carry.state.h.device.type))

    fit = trainer(
        tmp_path,
        max_epochs=epochs,
        limit_val_batches=0,
        callbacks=[Losses(), *callbacks],
        enable_checkpointing=bool(callbacks),
        accelerator=accelerator,
    )
    fit.fit(module, data, ckpt_path=ckpt_path)
    return module, losses


def _assert_compiles_only_while_warming_up(estimator, graphs):
    """``graphs``: the graphs compiled by the end of each of :func:`_fit`'s 3 chunks (6 calls of 2 steps). After the
    first chunk nothing compiles: one graph, or two where the estimator's first call fills a cache that the next
    call's guards see (SnAp's sparsity pattern). TruncatedBPTT's window of states grows until it holds k = 3 of them,
    a graph for each call that starts with another window length (0, 2, then 3); once full, nothing compiles."""
    if estimator == "tbptt":
        assert graphs == [2, 3, 3], graphs
    else:
        assert graphs[1:] == [graphs[0]] * 2 and graphs[0] <= (2 if estimator == "snap" else 1), graphs


def _assert_close_fits(eager, compiled):
    (a, losses_a), (b, losses_b) = eager, compiled
    assert a.global_step == b.global_step == 6
    torch.testing.assert_close(losses_b, losses_a, rtol=1e-10, atol=0)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-10, atol=1e-12, msg=f"{name}")
    sa, sb = a.carry.state, b.carry.state
    assert sa.step == sb.step == 12
    assert torch.equal(sa.health, sb.health) and not sa.health.any()
    torch.testing.assert_close(sb.h, sa.h, rtol=1e-10, atol=1e-12)
    assert sa.tensors.keys() == sb.tensors.keys()
    for key in sa.tensors:
        torch.testing.assert_close(sb.tensors[key], sa.tensors[key], rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.parametrize("estimator", ["rtrl", "rflo", "snap", "diagonal_rtrl", "uoro", "kf_rtrl", "tbptt"])
def test_compiled_fit_equals_eager_fit_without_recompiling(estimator, tmp_path):
    eager = _fit(tmp_path / "eager", estimator, compile=False)
    torch._dynamo.reset()
    counters.clear()
    compiled = _fit(tmp_path / "compiled", estimator, compile=True)
    _assert_close_fits(eager, compiled)
    _assert_compiles_only_while_warming_up(estimator, compiled[0].graphs)
    moved = max((p - q).abs().max() for p, q in zip(eager[0].parameters(), eager[0].initial, strict=True))
    assert moved > 1e-3  # trained: the comparison is not between two untouched models


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("estimator", ["rtrl", "uoro", "kf_rtrl", "diagonal_rtrl"])
def test_a_fit_on_the_gpu_equals_the_cpu_fit_and_compiles_to_it(estimator, tmp_path):
    # the randomised estimators draw the CPU's noise on both devices (CUDA's generator draws other numbers), each
    # fit from a generator seeded alike
    with noise_from_the_cpu():
        cpu, cpu_losses = _fit(tmp_path / "cpu", estimator, compile=False)
    with noise_from_the_cpu():
        gpu = _fit(tmp_path / "gpu", estimator, compile=False, accelerator="gpu")
    assert cpu.devices == {("cpu", "cpu")} and gpu[0].devices == {("cuda", "cuda")}
    torch.testing.assert_close(gpu[1], cpu_losses, rtol=1e-10, atol=0)
    for (name, p), q in zip(cpu.named_parameters(), gpu[0].parameters(), strict=True):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-10, atol=1e-12, msg=f"{name}")
    torch._dynamo.reset()
    counters.clear()
    # compiled and eager on the GPU, each with CUDA's own noise
    eager = _fit(tmp_path / "gpu-eager", estimator, compile=False, accelerator="gpu")
    compiled = _fit(tmp_path / "gpu-compiled", estimator, compile=True, accelerator="gpu")
    _assert_close_fits(eager, compiled)
    _assert_compiles_only_while_warming_up(estimator, compiled[0].graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("estimator", ["rtrl", "uoro"])
def test_a_fit_with_cuda_graphs_equals_the_eager_gpu_fit(estimator, tmp_path):
    """The inductor on CUDA captures the chunk's steps as CUDA graphs ("reduce-overhead"): the outputs are copied
    out of the graphs' memory, what the steps hand back untouched (UORO's stream ids) is kept, and the fit equals
    the eager one, without recompiling and without a declined capture."""
    eager = _fit(tmp_path / "eager", estimator, compile=False, accelerator="gpu")
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(fallback_random=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _fit(tmp_path / "graphs", estimator, compile=True, backend="inductor", accelerator="gpu")
    assert not [w for w in caught if "CUDA graph" in str(w.message)]
    assert compiled[0]._compiled_steps.mode_for(torch.device("cuda")) == "reduce-overhead"
    _assert_close_fits(eager, compiled)
    _assert_compiles_only_while_warming_up(estimator, compiled[0].graphs)


@pytest.mark.parametrize("estimator", ["rtrl", "rflo", "snap", "diagonal_rtrl", "uoro", "kf_rtrl", "tbptt"])
def test_a_compiled_region_writes_none_of_its_inputs(estimator, tmp_path):
    """CUDA graphs replay only a region that writes none of its inputs (the inductor skips one that does): the
    module's region, run here as the compiler traces it (the PyTorch path), leaves every input tensor it is given
    unwritten (version counters and values) and returns what it changed."""
    calls = []

    def traced_as_compiled(estimator, readout, loss, x, y, mask, state, buffers, plan, streams, functional):
        inputs = [state.h, *state.tensors.values(), *buffers, *([] if state.health is None else [state.health])]
        before = [(t._version, t.clone()) for t in inputs]
        with native_kernels(False):
            out = run_steps(estimator, readout, loss, x, y, mask, state, buffers, plan, streams, functional=functional)
        for t, (version, saved) in zip(inputs, before, strict=True):
            assert t._version == version and torch.equal(t, saved), "a compiled region wrote one of its inputs"
        calls.append(functional)
        return out

    pl.seed_everything(0)
    module = _module(estimator, compile=True, update_every=2)
    module._compiled_steps._compiled[str(module._compiled_steps.mode_for(torch.device("cpu")))] = traced_as_compiled
    data = TinyStreams(streams=3, steps=4, chunks_per_epoch=3, reset_every=2, soft=True)
    trainer(tmp_path, max_epochs=1, limit_val_batches=0, enable_checkpointing=False).fit(module, data)
    assert calls == [True] * 6 and module.global_step == 6


def test_a_window_that_spans_chunks_compiles_whole_chunks_and_equals_eager(tmp_path):
    # update_every=8 over chunks of 4 steps: one compiled call per chunk, an update every second chunk
    eager = _fit(tmp_path / "eager", "rtrl", compile=False, update_every=8, epochs=2)
    torch._dynamo.reset()
    counters.clear()
    compiled = _fit(tmp_path / "compiled", "rtrl", compile=True, update_every=8, epochs=2)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert counters["stats"]["calls_captured"] > 0
    (a, losses_a), (b, losses_b) = eager, compiled
    assert a.global_step == b.global_step == 3
    torch.testing.assert_close(losses_b, losses_a, rtol=1e-10, atol=0)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b.carry.state.tensors["influence"], a.carry.state.tensors["influence"])


def test_compiled_fit_then_resume_equals_uninterrupted_compiled_fit(tmp_path):
    straight, _ = _fit(tmp_path / "straight", "rtrl", compile=True, update_every=3, epochs=2)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first, _ = _fit(tmp_path / "first", "rtrl", compile=True, update_every=3, callbacks=[checkpoint])
    assert first.carry.window_steps == 0 and first.carry.state.step == 12
    resumed, _ = _fit(
        tmp_path / "resumed", "rtrl", compile=True, update_every=3, epochs=2, ckpt_path=checkpoint.last_model_path
    )
    assert straight.global_step == resumed.global_step == 8
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14, msg=f"{name} after resume")
    assert_same_tree(
        {k: v for k, v in carried(straight).items() if k != "state"},
        {k: v for k, v in carried(resumed).items() if k != "state"},
    )
    assert straight.carry.state.step == resumed.carry.state.step == 24
    copied = copy.deepcopy(straight)  # a copy compiles afresh: compiled functions are not copied
    assert copied._compiled_steps._compiled == {} and straight._compiled_steps._compiled


def _steady_state_reads(tmp_path, update_every, **kwargs):
    """The host reads of each training chunk (``training_step``, the window's update included)."""
    module = OnlineRNNModule(TanhRNNCell(3, 4), 4, estimator="rtrl", optimizer="sgd", update_every=update_every)
    step, reads = module.training_step, []

    def counted(batch, batch_idx):
        with HostSyncCounter() as counter:
            step(batch, batch_idx)
        reads.append(counter.reads)

    module.training_step = counted
    data = TinyStreams(streams=3, steps=4, chunks_per_epoch=4, **kwargs)
    trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, data)
    return reads


#: The chunk's index (``batch["chunk"]``, a 0-d int64 tensor of the stream contract), read to check the order of
#: the chunks and to restart the streams at chunk 0: the data module keeps it on the CPU (its
#: ``transfer_batch_to_device``), so on an accelerator this read waits for nothing queued there.
INDEX = "aten._local_scalar_dense.default"
#: The window's check: the estimator's NaN/inf record and the module's record of out-of-range classes, one read.
WINDOW = "Tensor.tolist"


@pytest.mark.parametrize("classes", ["hard", "soft"])
def test_a_steady_state_chunk_reads_only_its_index_and_the_windows_check(classes, tmp_path):
    # SGD: Adam's single-tensor step reads its step count once per parameter (torch's optimizer, after the chunk's
    # steps; capturable/fused Adam on a GPU does not). Hard class targets are checked on the device and read with
    # the window. No step reads anything.
    reads = _steady_state_reads(tmp_path / "one", update_every=4, soft=classes == "soft")  # an update per chunk
    assert reads[1:] == [[INDEX, WINDOW]] * 3, reads
    reads = _steady_state_reads(tmp_path / "two", update_every=8, soft=classes == "soft")  # every second chunk
    assert reads[1:] == [[INDEX, WINDOW], [INDEX], [INDEX, WINDOW]], reads


def test_out_of_range_classes_are_read_with_the_window_and_named(tmp_path):
    class Shifted(TinyStreams):
        def chunk(self, split, k, streams=None):
            batch = super().chunk(split, k, streams)
            if k == 2:
                batch["y"][1, 3], batch["mask"][1, 3] = 7, True
            return batch

    module = OnlineRNNModule(TanhRNNCell(3, 4), 4, estimator="rtrl", optimizer="sgd", update_every=8)
    with pytest.raises(
        ValueError,
        match=r"batch\['y'\] holds the class indices \[7\] at scored \(masked\) entries of training chunk 2,",
    ):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, Shifted(streams=3, steps=4))
    assert module.global_step == 1  # the window of chunks 0-1 was applied, the one holding chunk 2 was not


class _NaNInput(TinyStreams):
    def chunk(self, split, k, streams=None):
        batch = super().chunk(split, k, streams)
        if split == "train" and k == 1:
            batch["x"][1, 2, 0] = float("nan")  # step 4 + 3 = 7 of the run
        return batch


@pytest.mark.parametrize("compile", [False, True])
def test_a_recorded_failure_still_names_its_step_and_tensor(compile, tmp_path):
    torch._dynamo.reset()
    module = _module("rtrl", compile=compile, compile_backend="aot_eager", update_every=8)
    data = _NaNInput(streams=3, steps=4, chunks_per_epoch=3)
    with pytest.raises(ValueError, match=r"RTRL.step: x held NaN or inf values at step 7"):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, data)
    assert module.global_step == 0  # read at the window's end, before its update: nothing was applied


def test_compile_options_are_checked():
    with pytest.raises(ValueError, match="compile must be True or False"):
        OnlineRNNModule(TanhRNNCell(3, 4), 4, compile="yes")
    with pytest.raises(ValueError, match="compile_backend must be"):
        OnlineRNNModule(TanhRNNCell(3, 4), 4, compile=True, compile_backend="")
    schedule = {"rescaling": (lambda t: 1.0 / t, None)}  # UORO's alpha_t: a function of the step number
    OnlineRNNModule(TanhRNNCell(3, 4), 4, estimator_options=schedule)  # eager: taken
    with pytest.raises(ValueError, match="compile=True needs a constant UORO alpha"):
        OnlineRNNModule(TanhRNNCell(3, 4), 4, estimator_options=schedule, compile=True)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["rtrl", "rflo", "snap", "diagonal_rtrl", "uoro", "kf_rtrl", "tbptt"])
def test_compiled_fit_with_inductor_equals_eager_fit(estimator, tmp_path):
    eager = _fit(tmp_path / "eager", estimator, compile=False)
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(fallback_random=True):  # else inductor draws UORO's and KF-RTRL's noise itself
        compiled = _fit(tmp_path / "compiled", estimator, compile=True, backend="inductor")
    _assert_close_fits(eager, compiled)
    _assert_compiles_only_while_warming_up(estimator, compiled[0].graphs)


def test_the_cli_option_compiles_the_recipes_chunks(tmp_path):
    from lightning_ortho.cli import run_cli
    from tests.test_cli import ROOT

    counters.clear()
    torch._dynamo.reset()
    options = [
        "--model.init_args.compile=true",
        "--model.init_args.compile_backend=aot_eager",
        "--model.init_args.estimator=rflo",
        "--model.init_args.estimator_options={tau: 10}",
        "--model.init_args.update_every=4",
        "--data.init_args.streams=2",
        "--data.init_args.chunk_length=4",
        "--data.init_args.chunks_per_epoch=2",
    ]
    recipe = ROOT / "recipes" / "online_adding.yaml"
    cli = run_cli(
        ["fit", "--config", str(recipe), f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1"]
        + ["--trainer.limit_val_batches=0", *options]
    )
    assert cli.model.hparams.compile is True and cli.model.global_step == 2
    assert counters["stats"]["unique_graphs"] == 1  # the recipe's chunks ran as compiled calls
