import pytest
import torch

from lightning_ortho.datamodules import (
    DataOptionError,
    DatasetNotFoundError,
    DigitsDataModule,
    MNISTDataModule,
    SequentialImageDataModule,
)
from tests.datasets_on_disk import write_mnist


def test_pixel_sequences_follow_raster_order():
    images = DigitsDataModule(flatten=False)
    seq = SequentialImageDataModule(images, mode="pixel")
    x, y = seq.split("val")[3]
    image, label = images.split("val")[3]
    assert x.shape == (64, 1) and seq.num_features == 1 and seq.sequence_length == 64
    torch.testing.assert_close(x[:, 0], image.flatten())
    assert y == label


def test_row_sequences_and_flattened_inner_module():
    images = DigitsDataModule(flatten=True)  # flat vectors are reshaped with image_shape
    seq = SequentialImageDataModule(images, mode="row")
    x, _ = seq.split("train")[0]
    image, _ = images.split("train")[0]
    assert x.shape == (8, 8) and seq.num_features == 8
    torch.testing.assert_close(x, image.reshape(8, 8))


def test_permutation_is_fixed_recorded_and_shared(tmp_path):
    write_mnist(tmp_path, n_train=30, n_test=10)
    a = SequentialImageDataModule(
        MNISTDataModule(root=str(tmp_path), flatten=False, val_size=5), permute=True, permutation_seed=7
    )
    b = SequentialImageDataModule(
        MNISTDataModule(root=str(tmp_path), flatten=False, val_size=5), permute=True, permutation_seed=7
    )
    assert torch.equal(a.permutation, b.permutation)  # drawn from the seed alone: same in every process
    assert sorted(a.permutation.tolist()) == list(range(784)) and not torch.equal(a.permutation, torch.arange(784))
    x, _ = a.split("test")[0]
    image, _ = a.images.split("test")[0]
    torch.testing.assert_close(x[:, 0], image.flatten()[a.permutation])
    b.load_state_dict(a.state_dict())  # same permutation: accepted
    other = SequentialImageDataModule(
        MNISTDataModule(root=str(tmp_path), flatten=False), permute=True, permutation_seed=8
    )
    with pytest.raises(ValueError, match="permutation_seed"):
        other.load_state_dict(a.state_dict())


def test_a_permuted_checkpoint_is_refused_by_an_unpermuted_module_and_back():
    # Issue 9.8: the check was skipped when one side was unpermuted.
    permuted = SequentialImageDataModule(DigitsDataModule(flatten=False), permute=True, permutation_seed=3)
    plain = SequentialImageDataModule(DigitsDataModule(flatten=False))
    with pytest.raises(ValueError, match="trained on permuted .* set permute=True"):
        plain.load_state_dict(permuted.state_dict())
    with pytest.raises(ValueError, match="trained on unpermuted .* set permute=False"):
        permuted.load_state_dict(plain.state_dict())
    plain.load_state_dict(SequentialImageDataModule(DigitsDataModule(flatten=False)).state_dict())  # both plain
    plain.load_state_dict({})  # a state without the key (not ours): nothing to compare


def test_batches_and_shuffling_are_epoch_seeded():
    seq = SequentialImageDataModule(DigitsDataModule(flatten=False, batch_size=16))
    loader = seq.train_dataloader()
    first = next(iter(loader))[1]
    assert next(iter(loader))[1].equal(first)  # same epoch, same order, whatever the global RNG did
    loader.sampler.set_epoch(1)
    assert not next(iter(loader))[1].equal(first)
    assert next(iter(loader))[0].shape == (16, 64, 1)


def test_wrapping_a_non_image_module_is_a_clear_error():
    from lightning_ortho._lightning import pl

    with pytest.raises(TypeError, match="image data module"):
        SequentialImageDataModule(pl.LightningDataModule())
    with pytest.raises(ValueError, match="mode"):
        SequentialImageDataModule(DigitsDataModule(), mode="column")


def test_hyperparameters_record_the_wrapped_images(tmp_path):
    write_mnist(tmp_path, n_train=30, n_test=10)
    inner = MNISTDataModule(root=str(tmp_path), flatten=False, val_size=5, seed=3)
    recorded = SequentialImageDataModule(inner, permute=True).hparams["images"]
    assert recorded["class_path"] == "lightning_ortho.datamodules.mnist.MNISTDataModule"
    args = recorded["init_args"]
    assert args["root"] == str(tmp_path) and args["seed"] == 3 and args["val_size"] == 5
    assert tuple(args["mean"]) == (0.1307,) and tuple(args["std"]) == (0.3081,)


def test_root_and_download_are_forwarded_to_the_wrapped_module_and_recorded(tmp_path):
    write_mnist(tmp_path, n_train=30, n_test=10)
    inner = MNISTDataModule(root=str(tmp_path / "elsewhere"), flatten=False, val_size=5)
    seq = SequentialImageDataModule(inner, root=str(tmp_path), download=False)
    assert seq.root == inner.root == str(tmp_path) and seq.download is False
    assert seq.hparams["images"]["init_args"]["root"] == str(tmp_path) and seq.hparams["root"] == str(tmp_path)
    assert len(seq.split("test")) == 10  # read from tmp_path, not from "elsewhere"
    untouched = SequentialImageDataModule(MNISTDataModule(root=str(tmp_path / "elsewhere")))
    assert untouched.root == str(tmp_path / "elsewhere") and untouched.hparams["root"] is None
    with pytest.raises(DatasetNotFoundError, match="--data.root=DIR"):
        untouched.setup()


def test_root_for_embedded_digits_is_a_clear_error():
    with pytest.raises(DataOptionError, match="DigitsDataModule has no `root`"):
        SequentialImageDataModule(DigitsDataModule(), root="data")
    with pytest.raises(DataOptionError, match="no `download`"):
        SequentialImageDataModule(DigitsDataModule(), download=True)
    assert SequentialImageDataModule(DigitsDataModule()).root is None


def test_root_cannot_change_under_a_module_that_has_loaded_its_data(tmp_path):
    write_mnist(tmp_path, n_train=30, n_test=10)
    inner = MNISTDataModule(root=str(tmp_path), val_size=5)
    inner.setup()
    with pytest.raises(ValueError, match="already loaded"):
        SequentialImageDataModule(inner, root=str(tmp_path / "other"))
    assert SequentialImageDataModule(inner, root=str(tmp_path)).root == str(tmp_path)  # the same root is fine


def test_num_workers_come_from_the_wrapped_module_unless_given():
    inherited = SequentialImageDataModule(DigitsDataModule(flatten=False, num_workers=2))
    assert all(
        loader.num_workers == 2
        for loader in (inherited.train_dataloader(), inherited.val_dataloader(), inherited.test_dataloader())
    )
    given = SequentialImageDataModule(DigitsDataModule(flatten=False, num_workers=2), num_workers=0)
    assert given.train_dataloader().num_workers == 0
