"""StreamDataModule: the batch contract, order, determinism, rank split, resume, and Lightning's acceptance."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import (
    AddingTaskDataModule,
    CharacterStreamDataModule,
    CopyTaskDataModule,
    InfluenceBalancingDataModule,
    StreamDataModule,
)
from lightning_ortho.datamodules.streams import StreamLoader

SMALL = dict(streams=4, chunk_length=6, chunks_per_epoch=3, val_streams=2, val_chunks=2)
MODULES = {
    "copy": lambda **kw: CopyTaskDataModule(length=3, delay=2, **{**SMALL, **kw}),
    "adding": lambda **kw: AddingTaskDataModule(t1=2, t2=4, **{**SMALL, **kw}),
    "influence": lambda **kw: InfluenceBalancingDataModule(**{**SMALL, **kw}),
    "text": lambda **kw: CharacterStreamDataModule(**{**SMALL, **kw}),
}
KEYS = {"x", "y", "mask", "reset", "chunk"}


def assert_batches_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def fake_trainer(rank: int, world: int) -> SimpleNamespace:
    return SimpleNamespace(global_rank=rank, world_size=world)


@pytest.mark.parametrize("name", MODULES)
def test_batch_contract(name):
    dm = MODULES[name]()
    assert dm.loss in ("cross_entropy", "mse")
    for split, b in (("train", 4), ("val", 2)):
        batch = dm.batch(split, 1)
        assert set(batch) == KEYS
        assert batch["x"].shape == (b, 6, dm.input_size) and batch["x"].dtype == torch.float32
        if batch["y"].dtype == torch.long:  # class indices
            assert dm.loss == "cross_entropy" and batch["y"].shape == (b, 6)
            assert 0 <= int(batch["y"].min()) and int(batch["y"].max()) < dm.output_size
        else:  # a distribution (soft cross-entropy) or real targets (mse)
            assert batch["y"].dtype == torch.float32 and batch["y"].shape == (b, 6, dm.output_size)
            if dm.loss == "cross_entropy":
                torch.testing.assert_close(batch["y"].sum(-1), torch.ones(b, 6))
        assert batch["mask"].shape == (b, 6) and batch["mask"].dtype == torch.bool
        assert batch["reset"].shape == (b,) and batch["reset"].dtype == torch.bool
        assert batch["chunk"].shape == () and batch["chunk"].dtype == torch.long and int(batch["chunk"]) == 1
    assert bool(dm.batch("train", 0)["reset"].all())  # every stream starts at chunk 0


@pytest.mark.parametrize("name", MODULES)
def test_training_chunks_come_in_order_and_the_stream_continues_across_epochs(name):
    dm = MODULES[name]()
    loader = dm.train_dataloader()
    assert isinstance(loader, StreamLoader) and loader.batch_size is None and loader.num_workers == 0
    assert len(loader) == 3
    seen = []
    for _epoch in range(3):
        for batch in loader:
            seen.append(int(batch["chunk"]))
            assert_batches_equal(batch, dm.batch("train", seen[-1]))
            assert dm.next_chunk == seen[-1] + 1  # the position names the first chunk not yet handed out
    assert seen == list(range(9))
    assert [int(b["chunk"]) for b in dm.val_dataloader()] == [0, 1]  # validation restarts every pass
    assert [int(b["chunk"]) for b in dm.val_dataloader()] == [0, 1]


@pytest.mark.parametrize("name", ["copy", "adding"])
def test_chunks_are_a_function_of_seed_stream_and_chunk(name):
    a, b = MODULES[name](seed=3), MODULES[name](seed=3)
    for _ in a.train_dataloader():  # a's position moves; its chunks do not change
        pass
    assert_batches_equal(a.batch("train", 5), b.batch("train", 5))
    # a stream's chunk does not depend on which other streams are made with it
    alone, whole = a.batch("train", 5, torch.tensor([2])), a.batch("train", 5)
    assert torch.equal(alone["x"], whole["x"][2:3]) and torch.equal(alone["y"], whole["y"][2:3])
    # other seeds, streams, chunks and splits give other data
    data = lambda batch: torch.cat([batch["x"].flatten(1), batch["y"].flatten(1).float()], dim=1)  # noqa: E731
    assert not torch.equal(data(MODULES[name](seed=4).batch("train", 5)), data(whole))
    assert not torch.equal(data(whole)[0], data(whole)[1])
    assert not torch.equal(data(whole), data(a.batch("train", 6)))
    assert not torch.equal(data(a.batch("val", 5)), data(whole)[:2])


@pytest.mark.parametrize("name", MODULES)
def test_two_ranks_together_see_exactly_the_single_process_streams(name):
    single = MODULES[name]()
    ranks = [MODULES[name]() for _ in range(2)]
    for rank, dm in enumerate(ranks):
        dm.trainer = fake_trainer(rank, 2)
        assert dm.process_streams("train").tolist() == list(range(rank, 4, 2))
    for split, loaders in (
        ("train", [single.train_dataloader()] + [dm.train_dataloader() for dm in ranks]),
        ("val", [single.val_dataloader()] + [dm.val_dataloader() for dm in ranks]),
    ):
        for whole, part0, part1 in zip(*loaders, strict=True):
            assert int(whole["chunk"]) == int(part0["chunk"]) == int(part1["chunk"])
            for key in ("x", "y", "mask", "reset"):
                merged = torch.empty_like(whole[key])
                merged[0::2], merged[1::2] = part0[key], part1[key]  # rank r carries streams r::W
                assert torch.equal(merged, whole[key]), (split, key)


def test_stream_counts_must_divide_among_processes():
    dm = CopyTaskDataModule(streams=6, val_streams=3)
    dm.trainer = fake_trainer(0, 4)
    with pytest.raises(ValueError, match=r"streams=6 is not divisible by the world size 4.*multiple of 4"):
        dm.train_dataloader()
    dm.trainer = fake_trainer(1, 2)
    dm.train_dataloader()  # 6 streams over 2 processes: fine
    with pytest.raises(ValueError, match="val_streams=3 is not divisible by the world size 2"):
        dm.val_dataloader()


@pytest.mark.parametrize("name", MODULES)
def test_state_dict_round_trip_resumes_with_the_next_chunks(name):
    straight = MODULES[name]()
    expected = [b for _ in range(2) for b in straight.train_dataloader()]  # chunks 0..5
    first = MODULES[name]()
    iterator = iter(first.train_dataloader())
    for _ in range(2):
        next(iterator)  # stopped after two chunks of the first epoch
    state = first.state_dict()
    assert state["next_chunk"] == 2
    resumed = MODULES[name]()
    resumed.load_state_dict(state)
    got = list(resumed.train_dataloader())
    assert [int(b["chunk"]) for b in got] == [2, 3, 4]
    for a, b in zip(got, expected[2:5], strict=True):
        assert_batches_equal(a, b)
    # the loader itself is stateful too (Lightning saves it when it is passed to fit directly)
    loader = MODULES[name]().train_dataloader()
    loader.load_state_dict(first.train_dataloader().state_dict())
    assert int(next(iter(loader))["chunk"]) == 2
    with pytest.raises(ValueError, match="next_chunk must be a non-negative integer"):
        resumed.load_state_dict({"next_chunk": -1})
    resumed.load_state_dict({})  # a state without the key changes nothing


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: CopyTaskDataModule(streams=0), "streams must be a positive integer"),
        (lambda: AddingTaskDataModule(chunk_length=2.5), "chunk_length must be a positive integer"),
        (lambda: InfluenceBalancingDataModule(chunks_per_epoch=-1), "chunks_per_epoch must be a positive integer"),
        (lambda: CopyTaskDataModule(val_chunks=0), "val_chunks .* limit_val_batches=0"),
        (lambda: AddingTaskDataModule(val_streams=True), "val_streams must be a positive integer"),
        (lambda: CopyTaskDataModule(seed=-1), "seed must be a non-negative integer"),
        (lambda: CopyTaskDataModule(num_workers=2), "num_workers must be 0.*time order"),
        (lambda: CharacterStreamDataModule(num_workers=1), "num_workers must be 0"),
    ],
)
def test_bad_base_arguments_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_batch_refuses_unknown_splits_chunks_and_streams():
    dm = CopyTaskDataModule(streams=4)
    with pytest.raises(ValueError, match="split must be one of"):
        dm.batch("holdout", 0)  # "test" is a split now (test and predict read it)
    with pytest.raises(ValueError, match="chunk must be a non-negative integer"):
        dm.batch("train", -1)
    with pytest.raises(ValueError, match=r"indices in 0\.\.3"):
        dm.batch("train", 0, torch.tensor([4]))
    with pytest.raises(NotImplementedError, match="make_chunk"):
        StreamDataModule().batch("train", 0)


class Readout(pl.LightningModule):
    """A linear readout of x (no recurrence), automatic optimisation; records the chunks it is given."""

    def __init__(self, input_size: int, output_size: int, loss: str) -> None:
        super().__init__()
        self.linear, self.kind = torch.nn.Linear(input_size, output_size), loss
        self.train_chunks: list[int] = []
        self.val_chunks: list[int] = []

    def _loss(self, batch):
        out, mask = self.linear(batch["x"]), batch["mask"].float()
        if self.kind == "mse":
            per_step = ((out - batch["y"]) ** 2).mean(-1)
        elif batch["y"].dtype == torch.long:
            per_step = F.cross_entropy(out.transpose(1, 2), batch["y"], reduction="none")
        else:
            per_step = -(batch["y"] * out.log_softmax(-1)).sum(-1)
        return (per_step * mask).sum() / mask.sum().clamp(min=1)

    def training_step(self, batch, batch_idx):
        self.train_chunks.append(int(batch["chunk"]))
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        self.val_chunks.append(int(batch["chunk"]))
        self.log("val_loss", self._loss(batch), batch_size=len(batch["x"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def readout_for(dm: StreamDataModule) -> Readout:
    torch.manual_seed(0)  # the same initial weights every time
    return Readout(dm.input_size, dm.output_size, dm.loss)


@pytest.mark.parametrize("name", MODULES)
def test_a_trainer_iterates_the_loaders_in_order(name, tiny_trainer):
    dm = MODULES[name]()
    model = readout_for(dm)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    trainer = tiny_trainer(max_steps=6, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    assert model.train_chunks == [0, 1, 2, 3, 4, 5]  # across the epoch boundary (3 chunks per epoch)
    assert model.val_chunks == [0, 1, 0, 1]  # a full validation pass after each epoch
    assert dm.state_dict()["next_chunk"] == 6
    assert trainer.global_step == 6 and not torch.equal(before, torch.nn.utils.parameters_to_vector(model.parameters()))


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_lightning_checkpoint_resumes_the_stream_exactly(tmp_path, tiny_trainer):
    # Saved mid-epoch from on_train_batch_end: the position in the checkpoint must be the next chunk the model
    # has not seen (Lightning prefetches nothing from a loader of known length).
    straight = readout_for(MODULES["adding"]())
    tiny_trainer(max_steps=7, limit_val_batches=0).fit(straight, datamodule=MODULES["adding"]())

    first, dm = readout_for(MODULES["adding"]()), MODULES["adding"]()
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    tiny_trainer(max_steps=4, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint]).fit(
        first, datamodule=dm
    )
    path = checkpoint.best_model_path or next((tmp_path / "ckpt").glob("*.ckpt"))
    saved = torch.load(path, weights_only=False)
    assert saved["AddingTaskDataModule"] == {"next_chunk": 4}

    resumed = readout_for(MODULES["adding"]())
    tiny_trainer(max_steps=7, limit_val_batches=0).fit(resumed, datamodule=MODULES["adding"](), ckpt_path=path)
    assert first.train_chunks == [0, 1, 2, 3] and resumed.train_chunks == [4, 5, 6]
    assert straight.train_chunks == first.train_chunks + resumed.train_chunks
    torch.testing.assert_close(resumed.linear.weight, straight.linear.weight)


class RecordingReadout(Readout):
    """A :class:`Readout` that writes the batches it trained on to ``out_dir/rank{r}.pt`` (for DDP tests)."""

    def __init__(self, input_size: int, output_size: int, loss: str, out_dir: str) -> None:
        super().__init__(input_size, output_size, loss)
        self.out_dir, self.batches = out_dir, []

    def training_step(self, batch, batch_idx):
        self.batches.append({key: value.cpu() for key, value in batch.items()})
        return super().training_step(batch, batch_idx)

    def on_train_end(self):
        torch.save(self.batches, f"{self.out_dir}/rank{self.global_rank}.pt")


@pytest.mark.ddp
@pytest.mark.slow
def test_ddp_ranks_carry_the_streams_r_mod_w(tmp_path, tiny_trainer, monkeypatch):
    # Real processes: Lightning attaches the trainer, each rank reads its rank and world size from it.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(sock.getsockname()[1]))
    dm = MODULES["copy"]()
    model = RecordingReadout(dm.input_size, dm.output_size, dm.loss, str(tmp_path))
    tiny_trainer(max_steps=4, limit_val_batches=0, strategy="ddp_spawn", devices=2).fit(model, datamodule=dm)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    single = MODULES["copy"]()
    for k, (part0, part1) in enumerate(zip(*ranks, strict=True)):
        whole = single.batch("train", k)
        assert int(part0["chunk"]) == int(part1["chunk"]) == k
        for key in ("x", "y", "mask", "reset"):
            assert torch.equal(part0[key], whole[key][0::2]) and torch.equal(part1[key], whole[key][1::2]), key
    assert len(ranks[0]) == 4


def test_the_chunk_index_stays_on_the_cpu_when_the_batch_is_moved():
    """Lightning's transfer moves every tensor but the chunk's index, which the model reads for the order check
    (on an accelerator a read of a moved index would wait for the work queued there)."""
    data = CopyTaskDataModule(**SMALL)
    batch = data.batch("train", 4)
    moved = data.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert set(moved) == set(batch)
    assert all(moved[key].is_meta for key in batch if key != "chunk")
    assert moved["chunk"] is batch["chunk"] and int(moved["chunk"]) == 4
    assert data.transfer_batch_to_device([torch.ones(1)], torch.device("meta"), 0)[0].is_meta
