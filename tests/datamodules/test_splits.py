import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset

from lightning_ortho.datamodules import (
    DigitsDataModule,
    ImageDataModule,
    MNISTDataModule,
    SequentialImageDataModule,
    SplitDataModule,
)
from lightning_ortho.datamodules._sampling import EpochSeededRandomSampler
from tests.datasets_on_disk import write_mnist


class Numbers(SplitDataModule):
    """The smallest subclass: three datasets of consecutive integers."""

    def __init__(self, batch_size=4, num_workers=0, shuffle=True, seed=0):
        super().__init__()
        self.batch_size, self.num_workers, self.shuffle, self.seed = batch_size, num_workers, shuffle, seed
        self.sizes = {"train": 10, "val": 6, "test": 3}

    def split(self, name):
        return TensorDataset(torch.arange(self.sizes[name]))


def test_training_order_is_the_epoch_seeded_permutation_and_evaluation_is_in_order():
    data = Numbers(seed=5)
    loader = data.train_dataloader()
    for epoch in (0, 3):
        loader.sampler.set_epoch(epoch)
        reference = torch.randperm(10, generator=torch.Generator().manual_seed(5 * 1_000_003 + epoch))
        assert torch.cat([batch for (batch,) in loader]).tolist() == reference.tolist()
    for name in ("val", "test"):
        loader = getattr(data, f"{name}_dataloader")()
        assert isinstance(loader.sampler, SequentialSampler)
        assert torch.cat([batch for (batch,) in loader]).tolist() == list(range(data.sizes[name]))
    unshuffled = Numbers(shuffle=False).train_dataloader()
    assert torch.cat([batch for (batch,) in unshuffled]).tolist() == list(range(10))


def test_loaders_take_batch_size_and_workers_from_the_module():
    data = Numbers(batch_size=3, num_workers=2)
    for loader in (data.train_dataloader(), data.val_dataloader(), data.test_dataloader()):
        assert loader.batch_size == 3 and loader.num_workers == 2


def test_a_subclass_without_splits_says_so():
    class Empty(SplitDataModule):
        pass

    with pytest.raises(NotImplementedError, match="Empty must implement split"):
        Empty().val_dataloader()


def test_every_data_module_builds_its_loaders_here(tmp_path):
    # One place for the loaders: no data module of the package writes its own.
    for module in (DigitsDataModule, ImageDataModule, SequentialImageDataModule):
        assert issubclass(module, SplitDataModule)
        assert not {"train_dataloader", "val_dataloader", "test_dataloader", "_loader"} & set(vars(module))
    write_mnist(tmp_path, n_train=30, n_test=10)
    modules = {
        "digits": DigitsDataModule(batch_size=8, num_workers=1, seed=2),
        "mnist": MNISTDataModule(root=str(tmp_path), batch_size=8, val_size=5, num_workers=1, seed=2),
        "sequences": SequentialImageDataModule(DigitsDataModule(batch_size=8, num_workers=1), permutation_seed=2),
    }
    for name, data in modules.items():
        loader = data.train_dataloader()
        assert isinstance(loader.sampler, EpochSeededRandomSampler) and loader.sampler.seed == 2, name
        assert loader.batch_size == 8 and loader.num_workers == 1, name
