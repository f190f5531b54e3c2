"""FastTransformModule: learning a transform from any data module equals the in-memory learners, in one
process, under DDP and across a checkpoint resume."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.models.fast_transform_module import FastTransformModule
from lightning_ortho.transforms import learn_b_transform, learn_m_transform, learn_shear_transform
from lightning_ortho.transforms.patches import image_patches
from lightning_ortho.transforms.sparse_codes import keep_largest, representation_error
from tests.conftest import free_port, make_tiny_trainer


def _walks(count: int = 400, n: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, n, generator=g).cumsum(1)


class Vectors(pl.LightningDataModule):
    """A user's data module: (inputs, labels) batches of float32 vectors, shuffled; the module ignores labels."""

    def __init__(self, data: torch.Tensor, batch_size: int = 64, shuffle: bool = True) -> None:
        super().__init__()
        self.data, self.batch_size, self.shuffle = data, batch_size, shuffle

    def train_dataloader(self) -> DataLoader:
        labels = torch.zeros(len(self.data), dtype=torch.int64)
        generator = torch.Generator().manual_seed(1)
        return DataLoader(
            TensorDataset(self.data, labels), batch_size=self.batch_size, shuffle=self.shuffle, generator=generator
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.data[:100]), batch_size=50)


def _fit(root, module: FastTransformModule, data: pl.LightningDataModule, **kwargs) -> pl.Trainer:  # noqa: ANN001
    trainer = make_tiny_trainer(root, max_epochs=kwargs.pop("max_epochs", 30), **kwargs)
    trainer.fit(module, data)
    return trainer


def test_b_transform_learned_from_batches_equals_the_in_memory_learner(tmp_path) -> None:
    data = _walks()
    # tol above rounding: the streamed sums and the in-memory ones differ in their last bits (summation order), so
    # with tol = 0 whether two equal errors compare equal, and so when learning stops, depends on the CPU.
    module = FastTransformModule(family="b", m=12, s=3, iterations=6, tol=1e-9)
    trainer = _fit(tmp_path, module, Vectors(data), limit_val_batches=0)
    expected = learn_b_transform(data.double(), 12, 3, iterations=6, tol=1e-9)
    learned = module.transform()
    assert learned.pairs.tolist() == expected.transform.pairs.tolist()
    assert learned.core_index.tolist() == expected.transform.core_index.tolist()
    # basis pass, greedy pass, initial error, one pass per sweep; then it stops by itself (well before 30 epochs).
    assert trainer.current_epoch == 3 + len(expected.errors) and module.learner.finished
    assert trainer.global_step == trainer.current_epoch  # one (no-op) optimizer step per update
    assert float(trainer.callback_metrics["train_error"]) == pytest.approx(expected.errors[-1], rel=1e-6)
    assert float(trainer.callback_metrics["multiplications"]) == expected.transform.op_count().multiplications


def test_m_transform_and_validation_error(tmp_path) -> None:
    data = _walks(n=8)
    module = FastTransformModule(family="m", q=3, s=2)
    trainer = _fit(tmp_path, module, Vectors(data))
    expected = learn_m_transform(data.double(), 3, 2)
    assert module.transform().pairs.tolist() == expected.transform.pairs.tolist()
    d = expected.transform.matrix().double()
    held = data[:100].double()
    val = float(representation_error(held, keep_largest(held @ d, 2), d))
    assert float(trainer.callback_metrics["val_error"]) == pytest.approx(val, rel=1e-6)
    assert float(trainer.callback_metrics["additions"]) == 8 * 3  # nq additions (paper's count)


def test_shear_transform_with_one_bit_values_costs_no_multiplication(tmp_path) -> None:
    data = _walks(n=8)
    module = FastTransformModule(family="shear", m=10, s=3, bits=1, iterations=3, tol=None)
    trainer = _fit(tmp_path, module, Vectors(data), limit_val_batches=0)
    expected = learn_shear_transform(data.double(), 10, 3, bits=1, iterations=3)
    assert module.transform().pairs.tolist() == expected.transform.pairs.tolist()
    torch.testing.assert_close(module.transform(torch.float64).blocks, expected.transform.blocks.double())
    assert float(trainer.callback_metrics["multiplications"]) == 0
    assert float(trainer.callback_metrics["train_error"]) == pytest.approx(expected.errors[-1], rel=1e-6)


def test_patches_feature_mode_cuts_images_like_image_patches(tmp_path) -> None:
    g = torch.Generator().manual_seed(3)
    images = torch.rand(12, 1, 16, 16, generator=g)
    module = FastTransformModule(family="b", m=4, s=2, iterations=1, features="patches", patch_size=4)
    torch.testing.assert_close(module.features((images, None)), image_patches(images, 4))
    _fit(tmp_path, module, Vectors(images, batch_size=5), limit_val_batches=0)
    expected = learn_b_transform(image_patches(images, 4).double(), 4, 2, iterations=1)
    assert module.transform().pairs.tolist() == expected.transform.pairs.tolist()


@pytest.mark.ddp
@pytest.mark.parametrize(
    ("family", "coordinates"),
    [("b", "pairs"), pytest.param("b4x4", "quads", marks=pytest.mark.slow)],  # b4x4: ~10 s more (two spawns)
)
def test_ddp_spawn_two_processes_learns_the_single_process_transform(tmp_path, family, coordinates) -> None:
    data = _walks(count=512)

    def run(root, **kwargs):  # noqa: ANN001, ANN202
        module = FastTransformModule(family=family, m=10, s=3, iterations=4, tol=0.0)
        trainer = _fit(root, module, Vectors(data, shuffle=False), **kwargs)
        return module, trainer

    single, single_trainer = run(tmp_path / "single")
    ddp, ddp_trainer = run(tmp_path / "ddp", strategy="ddp_spawn", devices=2)
    assert ddp.learner is not None, "ddp_spawn did not hand the learned transform back"
    assert single.transform().num_blocks == 10
    assert getattr(ddp.transform(), coordinates).tolist() == getattr(single.transform(), coordinates).tolist()
    assert ddp.transform().core_index.tolist() == single.transform().core_index.tolist()
    torch.testing.assert_close(torch.tensor(ddp.learner.errors), torch.tensor(single.learner.errors), rtol=1e-9, atol=0)
    for key in ("train_error", "val_error"):
        torch.testing.assert_close(ddp_trainer.callback_metrics[key], single_trainer.callback_metrics[key])


class EpochCounter(pl.Callback):
    def __init__(self) -> None:
        self.count = 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.count += 1


def test_checkpoint_resume_learns_what_the_uninterrupted_run_learns(tmp_path, monkeypatch) -> None:
    data = _walks()  # in order: the sums then add up in the same order, so the runs agree bit for bit

    def module():  # noqa: ANN202
        return FastTransformModule(family="b", m=12, s=3, iterations=6, tol=0.0)

    straight = module()
    _fit(tmp_path / "straight", straight, Vectors(data, shuffle=False))
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)  # plain per-epoch checkpoints
    first = module()
    _fit(
        tmp_path / "first",
        first,
        Vectors(data, shuffle=False),
        max_epochs=4,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    assert not first.learner.finished
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    resumed = module()
    epochs_run = EpochCounter()
    trainer = make_tiny_trainer(tmp_path / "resumed", max_epochs=30, callbacks=[epochs_run])
    trainer.fit(resumed, Vectors(data, shuffle=False), ckpt_path=str(tmp_path / "ckpt" / "epoch=3-step=4.ckpt"))
    assert epochs_run.count == 3 + len(straight.learner.errors) - 4  # it went on from epoch 4, not from scratch
    assert resumed.learner.pairs == straight.learner.pairs and resumed.learner.index == straight.learner.index
    assert resumed.learner.errors == straight.learner.errors


class Unsized(torch.utils.data.IterableDataset):
    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __iter__(self):  # noqa: ANN204
        yield from (self.data[start : start + 50] for start in range(0, len(self.data), 50))


def test_a_loader_without_length_updates_at_the_epoch_end(tmp_path) -> None:
    data = _walks()
    module = FastTransformModule(family="b", m=12, s=3, iterations=6, tol=0.0)
    trainer = make_tiny_trainer(tmp_path, max_epochs=30, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader(Unsized(data), batch_size=None))
    expected = learn_b_transform(data.double(), 12, 3, iterations=6, tol=0.0)
    assert module.transform().pairs.tolist() == expected.transform.pairs.tolist()
    assert module.learner.finished and trainer.current_epoch == 3 + len(expected.errors)


def test_all_zero_features_fail_clearly(tmp_path) -> None:
    with pytest.raises(ValueError, match="every feature of the pass is zero"):
        _fit(tmp_path, FastTransformModule(), Vectors(torch.zeros(64, 8)))


def test_bad_settings_fail_clearly(tmp_path) -> None:
    with pytest.raises(ValueError, match="family must be 'b', 'm' or 'shear'"):
        FastTransformModule(family="dct")
    with pytest.raises(ValueError, match="features must be 'flatten' or 'patches'"):
        FastTransformModule(features="pixels")
    with pytest.raises(ValueError, match="n must be even"):
        _fit(tmp_path, FastTransformModule(family="m"), Vectors(_walks(n=7)))
    with pytest.raises(ValueError, match=r"s must be an int in \[1, 16\]"):
        _fit(tmp_path, FastTransformModule(s=17), Vectors(_walks()))
    with pytest.raises(ValueError, match="floating-point"):
        FastTransformModule().features((torch.zeros(3, 4, dtype=torch.int64),))
    with pytest.raises(RuntimeError, match="run trainer.fit first"):
        FastTransformModule().transform()


def _best_codes_error(data: torch.Tensor, dictionary: torch.Tensor, s: int) -> float:
    """``100 ||Y - X D^T||^2 / ||Y||^2`` with ``X`` the ``s`` largest entries of each row of ``Y D`` (the best
    ``s``-sparse codes for an orthonormal ``D``), written out here rather than taken from the library."""
    projected = data @ dictionary
    index = projected.abs().topk(s, dim=1).indices
    codes = torch.zeros_like(projected).scatter(1, index, projected.gather(1, index))
    return float(100 * (data - codes @ dictionary.T).square().sum() / data.square().sum())


@pytest.mark.parametrize(
    ("family", "kwargs"),
    [("b", {"m": 12, "iterations": 4}), ("m", {"q": 3}), ("b4x4", {"m": 5, "iterations": 3})],
)
def test_train_error_is_the_error_of_the_transform_the_module_holds_when_it_logs_it(tmp_path, family, kwargs) -> None:
    data = _walks(n=8)
    module = FastTransformModule(family=family, s=3, tol=0.0, **kwargs)
    records, log = [], module.log

    def recording_log(name, value, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name == "train_error":
            records.append((module.current_epoch, float(value), module.transform(torch.float64).matrix()))
        return log(name, value, *args, **kw)

    module.log = recording_log
    trainer = _fit(tmp_path, module, Vectors(data))
    assert [epoch for epoch, _, _ in records] == list(range(trainer.current_epoch))  # one per epoch
    y = data.double()
    for epoch, logged, dictionary in records:
        assert logged == pytest.approx(_best_codes_error(y, dictionary, 3), rel=1e-9), f"epoch {epoch}"
    # The PCA-basis pass (epoch 1) logs the identity's error, the transform the module still holds then.
    torch.testing.assert_close(records[1][2], torch.eye(8, dtype=torch.float64))
    assert records[1][1] == pytest.approx(records[0][1], rel=1e-12)
