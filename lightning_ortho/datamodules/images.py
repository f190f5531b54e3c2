"""Shared machinery of the image data modules: in-memory uint8 images, fixed-seed splits, normalisation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from lightning_ortho.datamodules.splits import SplitDataModule


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing and cannot be downloaded; the message says where and what to do."""


class NormalizedImages(Dataset):
    """``(image, label)`` pairs from uint8 ``(N, C, H, W)`` images, scaled to [0, 1] then standardised.

    Items are ``(C, H, W)`` float32 images, or ``(C*H*W,)`` vectors with ``flatten=True``; labels int64.
    """

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float], flatten: bool
    ) -> None:
        if images.dim() != 4:
            raise ValueError(f"NormalizedImages: images must be (N, C, H, W), got {tuple(images.shape)}.")
        self.images, self.labels, self.flatten = images, labels.long(), flatten
        channels = images.shape[1]
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1).expand(channels, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1).expand(channels, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].float().div_(255.0).sub_(self.mean).div_(self.std)
        return (image.flatten() if self.flatten else image), self.labels[index]


class ImageDataModule(SplitDataModule):
    """Base of the image data modules read from files under ``root``: subclasses provide ``_load() ->
    (train_images, train_labels, test_images, test_labels)`` as uint8 ``(N, C, H, W)`` tensors and the class
    attributes below.

    The validation set is a fixed-seed ``val_size`` sample of the training set, or, with ``val_size=0``, the
    official test set (what expRNN and many papers report as "validation"); the test set is the official one.
    Normalisation ``mean``/``std`` are constructor arguments, so they are recorded in the hyperparameters
    and every checkpoint knows its data. Training batches are shuffled by :class:`EpochSeededRandomSampler`
    (reproducible across resumes) unless ``shuffle=False``; the loaders come from :class:`SplitDataModule`.

    Args:
        root: folder holding the dataset's files.
        download: let torchvision download the files into ``root`` (needs internet).
        batch_size: samples per batch.
        val_size: training images held out for validation (at most a fifth of the training set), chosen by
            ``seed``; 0 validates on the official test set.
        seed: seed of the validation sample and of the per-epoch shuffling (independent of the global seed).
        flatten: yield ``(N, C*H*W)`` vectors (for fully connected models) instead of ``(N, C, H, W)`` images.
        shuffle: shuffle the training batches.
        num_workers: DataLoader worker processes.
        mean: per-channel mean of the normalisation.
        std: per-channel standard deviation of the normalisation.

    Raises:
        ValueError: ``val_size`` is negative.
    """

    num_classes = 10
    image_shape: tuple[int, int, int] = (1, 1, 1)

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        batch_size: int = 64,
        val_size: int = 5000,
        seed: int = 0,
        flatten: bool = True,
        shuffle: bool = True,
        num_workers: int = 0,
        mean: Sequence[float] = (0.0,),
        std: Sequence[float] = (1.0,),
    ) -> None:
        super().__init__()
        if val_size < 0:
            raise ValueError(
                f"{type(self).__name__}: val_size must be >= 0 (0 validates on the test set), got {val_size}."
            )
        self.save_hyperparameters()
        # Attributes, not self.hparams, drive the behaviour (see SplitDataModule).
        self.root, self.download, self.batch_size, self.flatten = root, download, batch_size, flatten
        self.val_size, self.seed, self.shuffle, self.num_workers = val_size, seed, shuffle, num_workers
        self.mean, self.std = tuple(mean), tuple(std)
        self._splits: dict[str, Dataset] | None = None

    @property
    def num_features(self) -> int:
        """Input dimension of a flattened image."""
        c, h, w = self.image_shape
        return c * h * w

    def _load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _open_torchvision(self, dataset_class: type, name: str, folder: str, files: Sequence[str]) -> tuple:
        """``(train, test)`` torchvision datasets from ``root``; missing files, or a download that fails for lack
        of network, become one :class:`DatasetNotFoundError` saying where the files go and what to do."""
        try:
            train = dataset_class(self.root, train=True, download=self.download)
            return train, dataset_class(self.root, train=False, download=self.download)
        except (RuntimeError, OSError) as error:
            if not self.download and "not found" not in str(error).lower():
                raise
            attempted = f"\n  (the download was attempted and failed: {error})" if self.download else ""
            message = missing_dataset_message(name, folder, files, root=self.root)
            raise DatasetNotFoundError(message + attempted) from error

    def prepare_data(self) -> None:
        if self.download:
            self._load()  # downloads once, on the main process only

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        train_x, train_y, test_x, test_y = self._load()
        make = lambda x, y: NormalizedImages(x, y, self.mean, self.std, self.flatten)  # noqa: E731
        test = make(test_x, test_y)
        if self.val_size == 0:
            self._splits = {"train": make(train_x, train_y), "val": test, "test": test}
            return
        n = len(train_y)
        val_size = min(self.val_size, n // 5)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        val_idx, train_idx = order[:val_size], order[val_size:]
        self._splits = {
            "train": make(train_x[train_idx], train_y[train_idx]),
            "val": make(train_x[val_idx], train_y[val_idx]),
            "test": test,
        }

    def split(self, name: str) -> Dataset:
        """The ``"train"``, ``"val"`` or ``"test"`` dataset (runs :meth:`setup` if needed)."""
        self.setup()
        assert self._splits is not None
        return self._splits[name]


def missing_dataset_message(name: str, folder: str, files: Sequence[str], root: str | None = None) -> str:
    """The one error a user sees when a dataset is missing: where, how to get it, what to run instead.

    ``folder`` is where the files were expected; ``root`` (the data module's ``root``, a parent of ``folder``)
    lets the message say which part of the layout the user chooses and which part torchvision imposes.
    The options it names (``--data.root``, ``--data.download``) work in every recipe that reads files,
    including those whose image module is wrapped by ``SequentialImageDataModule``.
    """
    below = Path(folder).relative_to(root).as_posix() if root is not None and Path(folder).is_relative_to(root) else ""
    layout = f" (the files go in DIR/{below})" if below else ""
    # A recipe's default root is relative ("data"): name the folder it became, which is under the directory the
    # command ran in, not under the recipe's.
    relative = (
        "" if Path(folder).is_absolute() else "  - A relative root is taken from the directory the command runs in.\n"
    )
    return (
        f"{name} was not found in {Path(folder).absolute()} (expected {', '.join(files)}).\n"
        f"{relative}"
        f"  - Files elsewhere? Point the recipe at their folder: --data.root=DIR{layout}.\n"
        f"  - On a machine with internet: add --data.download=true (torchvision downloads the files into root).\n"
        f"  - No network? Run the same model on the embedded handwritten digits instead (bundled with\n"
        f"    scikit-learn, no download): lightning-ortho fit --config fcnn_digits (or rnn_digits)."
    )
