import pytest
import torch

from lightning_ortho.datamodules import CIFAR10DataModule, DatasetNotFoundError, MNISTDataModule
from tests.datasets_on_disk import write_cifar10, write_mnist


def test_mnist_reads_idx_files_through_torchvision(tmp_path):
    write_mnist(tmp_path, n_train=60, n_test=20)
    dm = MNISTDataModule(root=str(tmp_path), batch_size=8, val_size=10)
    assert len(dm.split("train")) == 50 and len(dm.split("val")) == 10 and len(dm.split("test")) == 20
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 784) and x.dtype == torch.float32 and y.dtype == torch.long
    assert dm.hparams.mean == (0.1307,) and dm.num_features == 784
    image, _ = MNISTDataModule(root=str(tmp_path), flatten=False, val_size=10).split("test")[0]
    assert image.shape == (1, 28, 28)


def test_cifar10_reads_pickled_batches_through_torchvision(tmp_path):
    write_cifar10(tmp_path, n_per_batch=8, n_test=6)
    with pytest.raises(DatasetNotFoundError):  # hand-made files fail torchvision's MD5 check
        CIFAR10DataModule(root=str(tmp_path)).setup()
    dm = CIFAR10DataModule(root=str(tmp_path), verify_checksums=False, batch_size=4, val_size=8, flatten=False)
    assert len(dm.split("train")) == 32 and len(dm.split("test")) == 6
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 32, 32)
    assert dm.hparams.verify_checksums is False and len(dm.hparams.std) == 3


@pytest.mark.parametrize("module,folder", [(MNISTDataModule, "MNIST/raw"), (CIFAR10DataModule, "cifar-10-batches-py")])
def test_missing_dataset_error_says_where_and_what_to_do(module, folder, tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        module(root=str(tmp_path / "nowhere")).setup()
    message = str(info.value)
    assert str(tmp_path / "nowhere" / folder) in message
    assert f"--data.root=DIR (the files go in DIR/{folder})" in message
    assert "relative root" not in message  # an absolute root needs no word on the working directory
    assert "--data.download=true" in message and "--config fcnn_digits" in message


@pytest.mark.parametrize("module,dataset", [(MNISTDataModule, "MNIST"), (CIFAR10DataModule, "CIFAR10")])
def test_failed_download_is_reported_as_missing_dataset(module, dataset, tmp_path, monkeypatch):
    import torchvision.datasets

    def no_network(self):
        raise RuntimeError("Error downloading: <urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(getattr(torchvision.datasets, dataset), "download", no_network)
    with pytest.raises(DatasetNotFoundError, match="download was attempted and failed"):
        module(root=str(tmp_path), download=True).setup()
