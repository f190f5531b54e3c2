"""CIFAR-10 through ``torchvision.datasets.CIFAR10`` from a local root."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_ortho._extras import require
from lightning_ortho.datamodules.file_formats import check_cifar10_batch
from lightning_ortho.datamodules.images import ImageDataModule

CIFAR10_FILES = ("data_batch_1", "...", "data_batch_5", "test_batch", "batches.meta")


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 (50,000 + 10,000 32x32 colour images, 10 classes) read by torchvision from
    ``root/cifar-10-batches-py``.

    Args:
        root: folder holding ``cifar-10-batches-py/`` (torchvision's layout).
        download: let torchvision download and unpack the archive into ``root`` (needs internet).
        verify_checksums: check the files' MD5 sums as torchvision does (turn off only for hand-made subsets).
        batch_size: samples per batch.
        val_size: training images held out for validation, chosen by ``seed`` (0 validates on the test set; see
            :class:`ImageDataModule`).
        seed: seed of the validation sample and of the per-epoch shuffling.
        flatten: yield ``(N, 3072)`` vectors instead of ``(N, 3, 32, 32)`` images.
        shuffle: shuffle the training batches.
        num_workers: DataLoader worker processes.
        mean: per-channel normalisation mean (default: CIFAR-10's).
        std: per-channel normalisation standard deviation (default: CIFAR-10's).

    Raises:
        MissingExtraError: torchvision is not installed (the ``vision`` extra), at ``prepare_data``/``setup``.
        DatasetNotFoundError: the files are missing (or fail their checksums) and ``download`` is false.
        DatasetFormatError: a batch file is damaged (cannot be unpickled, wrong shape, labels out of range).
    """

    image_shape = (3, 32, 32)

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        batch_size: int = 128,
        val_size: int = 5000,
        seed: int = 0,
        flatten: bool = True,
        shuffle: bool = True,
        num_workers: int = 0,
        mean: Sequence[float] = (0.4914, 0.4822, 0.4465),
        std: Sequence[float] = (0.2470, 0.2435, 0.2616),
        verify_checksums: bool = True,
    ) -> None:
        super().__init__(root, download, batch_size, val_size, seed, flatten, shuffle, num_workers, mean, std)
        self.verify_checksums = verify_checksums

    def _load(self):
        CIFAR10 = require("torchvision.datasets", "CIFAR10DataModule reads CIFAR-10").CIFAR10

        cls = CIFAR10
        if not self.verify_checksums:

            class CIFAR10WithoutChecksums(CIFAR10):
                # torchvision's check_integrity(path, md5=None) checks that the file exists; parsing is unchanged.
                train_list = [[name, None] for name, _ in CIFAR10.train_list]
                test_list = [[name, None] for name, _ in CIFAR10.test_list]
                meta = {**CIFAR10.meta, "md5": None}

            cls = CIFAR10WithoutChecksums
        folder = str(Path(self.root) / "cifar-10-batches-py")
        for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
            if (Path(folder) / name).exists():  # missing files are reported by the loader
                check_cifar10_batch(Path(folder) / name, self.num_classes)
        train, test = self._open_torchvision(cls, "CIFAR-10", folder, CIFAR10_FILES)
        as_images = lambda data: torch.as_tensor(data).permute(0, 3, 1, 2).contiguous()  # noqa: E731
        return (
            as_images(train.data),
            torch.as_tensor(train.targets),
            as_images(test.data),
            torch.as_tensor(test.targets),
        )
