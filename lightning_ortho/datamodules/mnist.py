"""MNIST through ``torchvision.datasets.MNIST`` from a local root."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_ortho._extras import require
from lightning_ortho.datamodules.file_formats import check_mnist_folder
from lightning_ortho.datamodules.images import ImageDataModule

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


class MNISTDataModule(ImageDataModule):
    """MNIST (60,000 + 10,000 handwritten 28x28 digits) read by torchvision from ``root/MNIST/raw``.

    Args:
        root: folder holding ``MNIST/raw/*-ubyte`` (torchvision's layout).
        download: let torchvision download the files into ``root`` (needs internet).
        batch_size: samples per batch.
        val_size: training images held out for validation, chosen by ``seed`` (5,000 by default; 0 validates on
            the test set; see :class:`ImageDataModule`).
        seed: seed of the validation sample and of the per-epoch shuffling.
        flatten: yield ``(N, 784)`` vectors instead of ``(N, 1, 28, 28)`` images.
        shuffle: shuffle the training batches.
        num_workers: DataLoader worker processes.
        mean: normalisation mean (default: the usual MNIST statistic 0.1307).
        std: normalisation standard deviation (default: the usual MNIST statistic 0.3081).

    Raises:
        MissingExtraError: torchvision is not installed (the ``vision`` extra), at ``prepare_data``/``setup``.
        DatasetNotFoundError: the files are missing and ``download`` is false; the message gives the expected
            path, how to get the files, and the embedded-digits recipe to run instead.
        DatasetFormatError: a file is damaged (truncated, wrong header, not 28x28, a label outside 0..9); the
            message names it.
    """

    image_shape = (1, 28, 28)

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
        mean: Sequence[float] = (0.1307,),
        std: Sequence[float] = (0.3081,),
    ) -> None:
        super().__init__(root, download, batch_size, val_size, seed, flatten, shuffle, num_workers, mean, std)

    def _load(self):
        MNIST = require("torchvision.datasets", "MNISTDataModule reads MNIST").MNIST

        folder = str(Path(self.root) / "MNIST" / "raw")
        check_mnist_folder(Path(folder), self.num_classes)  # a damaged file is named, not a torchvision traceback
        train, test = self._open_torchvision(MNIST, "MNIST", folder, MNIST_FILES)
        return (
            train.data.unsqueeze(1),
            torch.as_tensor(train.targets),
            test.data.unsqueeze(1),
            torch.as_tensor(test.targets),
        )
