"""Multi-process training (DDP, spawned on CPU), exact checkpoint/resume, and bf16 mixed precision."""

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import DigitsDataModule, SequentialImageDataModule
from lightning_ortho.models import OrthogonalClassifier, OrthogonalRNNClassifier
from tests.conftest import free_port, make_tiny_trainer


def fcnn(batch_size: int, shuffle: bool = True):
    return OrthogonalClassifier(in_features=64, orthogonal="aux"), DigitsDataModule(
        batch_size=batch_size, shuffle=shuffle
    )


def rnn(batch_size: int, shuffle: bool = True):
    images = DigitsDataModule(flatten=False, batch_size=batch_size, shuffle=shuffle)
    data = SequentialImageDataModule(images, mode="row", shuffle=shuffle)
    return OrthogonalRNNClassifier(in_features=8, hidden_size=24, transition="aux"), data


BUILDERS = {"fcnn": fcnn, "rnn": rnn}


def trainer(root, **kwargs) -> pl.Trainer:
    return make_tiny_trainer(root, **{"deterministic": True, **kwargs})


def same_global_batches(data, per_rank_batch: int, world_size: int = 2):
    """The single-process loader whose batch t is the union of every rank's batch t under DDP: Lightning
    shuffles a distributed training set with DistributedSampler(shuffle=True, seed=PL_GLOBAL_SEED)."""
    dataset = data.split("train")
    ranks = [
        list(DistributedSampler(dataset, num_replicas=world_size, rank=r, shuffle=True, seed=0))
        for r in range(world_size)
    ]
    steps = len(ranks[0]) // per_rank_batch
    batches = [sum((rank[t * per_rank_batch : (t + 1) * per_rank_batch] for rank in ranks), []) for t in range(steps)]
    return DataLoader(dataset, batch_sampler=batches)


@pytest.mark.ddp
@pytest.mark.parametrize("name", BUILDERS)
def test_ddp_two_processes_match_one_process_on_the_same_global_batch(name, tmp_path, monkeypatch):
    # Lightning caches its rendezvous port in MASTER_PORT; a fresh one per test avoids reusing a port that
    # the previous test's process group may still hold.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    # Two processes with batch 16 each against one process whose batches of 32 are exactly the union of the
    # two ranks' batches: DDP averages the two ranks' mean-loss gradients, so the updates must agree.
    pl.seed_everything(0)
    ddp_model, ddp_data = BUILDERS[name](16, shuffle=False)
    ddp = trainer(tmp_path / "ddp", max_epochs=1, limit_train_batches=6, strategy="ddp_spawn", devices=2)
    ddp.fit(ddp_model, ddp_data)

    pl.seed_everything(0)
    single_model, single_data = BUILDERS[name](16, shuffle=False)
    single_data.train_dataloader = lambda: same_global_batches(single_data, per_rank_batch=16)
    single = trainer(tmp_path / "single", max_epochs=1, limit_train_batches=6)
    single.fit(single_model, single_data)

    # Tolerances: float32 sums in a different order over 6 optimizer steps.
    for (key, a), (_, b) in zip(single_model.state_dict().items(), ddp_model.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")
    # val_acc is over the same 270 validation digits (split 135/135 under DDP): equal up to one flipped
    # prediction; val_loss (mean of the two ranks' means over equal halves) to 1e-4.
    assert abs(float(single.callback_metrics["val_acc"]) - float(ddp.callback_metrics["val_acc"])) <= 1 / 270 + 1e-6
    torch.testing.assert_close(
        ddp.callback_metrics["val_loss"], single.callback_metrics["val_loss"], rtol=1e-4, atol=1e-4
    )
    # and training did move the weights (the comparison is not between two untrained models)
    pl.seed_everything(0)
    untrained, _ = BUILDERS[name](16)
    moved = max(
        (a - b).abs().max()
        for a, b in zip(untrained.state_dict().values(), ddp_model.state_dict().values(), strict=True)
    )
    assert moved > 1e-3


@pytest.mark.parametrize("name", BUILDERS)
def test_checkpoint_resume_reproduces_uninterrupted_training_exactly(name, tmp_path):
    pl.seed_everything(0)
    straight_model, straight_data = BUILDERS[name](32)
    trainer(tmp_path / "straight", max_epochs=2, limit_train_batches=5).fit(straight_model, straight_data)

    pl.seed_everything(0)
    first_model, first_data = BUILDERS[name](32)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer(
        tmp_path / "first", max_epochs=1, limit_train_batches=5, enable_checkpointing=True, callbacks=[checkpoint]
    ).fit(first_model, first_data)
    pl.seed_everything(123)  # a different global RNG state must not matter on resume
    resumed_model, resumed_data = BUILDERS[name](32)
    trainer(tmp_path / "resumed", max_epochs=2, limit_train_batches=5).fit(
        resumed_model, resumed_data, ckpt_path=checkpoint.last_model_path
    )
    for (key, a), (_, b) in zip(straight_model.state_dict().items(), resumed_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{key} differs after resume"


@pytest.mark.parametrize("name", BUILDERS)
def test_bf16_mixed_precision_trains_without_nan(name, tmp_path):
    pl.seed_everything(0)
    model, data = BUILDERS[name](32)
    fit = trainer(tmp_path, max_epochs=1, limit_train_batches=8, limit_val_batches=2, precision="bf16-mixed")
    fit.fit(model, data)
    assert torch.isfinite(fit.callback_metrics["train_loss"]) and torch.isfinite(fit.callback_metrics["val_loss"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("name", BUILDERS)
def test_bf16_true_precision_trains_in_bfloat16_parameters(name, tmp_path):
    # Issue 9.9: --trainer.precision=bf16-true failed with "expected m1 and m2 to have the same dtype".
    pl.seed_everything(0)
    model, data = BUILDERS[name](32)
    fit = trainer(tmp_path, max_epochs=1, limit_train_batches=8, limit_val_batches=2, precision="bf16-true")
    fit.fit(model, data)
    assert torch.isfinite(fit.callback_metrics["train_loss"]) and torch.isfinite(fit.callback_metrics["val_loss"])
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in model.parameters())


class ReplicasAgree(pl.Callback):
    """At the end of training every process must hold identical weights (ActNorm's data-dependent init
    included, which averages its statistics over processes)."""

    def on_train_end(self, trainer, pl_module):
        flat = torch.cat([p.detach().reshape(-1) for p in pl_module.parameters()])
        gathered = trainer.strategy.all_gather(flat)
        assert torch.equal(gathered[0], gathered[1]), "replicas diverged"


@pytest.mark.ddp
def test_ddp_trains_a_tiny_glow_on_two_processes(tmp_path, monkeypatch):
    from lightning_ortho.models import GlowModule

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    pl.seed_everything(0)
    model = GlowModule(image_size=8, levels=3, steps=2, hidden_channels=8, conv1x1="aux", warmup_steps=2)
    data = DigitsDataModule(batch_size=32, flatten=False, standardize=False)
    fit = trainer(
        tmp_path,
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=2,
        strategy="ddp_spawn",
        devices=2,
        callbacks=[ReplicasAgree()],
    )
    fit.fit(model, data)
    assert torch.isfinite(fit.callback_metrics["val_bpd"]) and float(fit.callback_metrics["val_bpd"]) < 6
