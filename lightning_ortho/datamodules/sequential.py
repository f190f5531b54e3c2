"""Images read as sequences: pixel-by-pixel (sequential / permuted MNIST) or row-by-row."""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from torch.utils.data import Dataset

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules.splits import SplitDataModule


class DataOptionError(TypeError):
    """An option was given to a data module that cannot honour it (``root`` for embedded data, ...)."""


def describe_module(module: object) -> dict:
    """``{"class_path", "init_args"}`` of a module whose constructor arguments are stored as attributes."""
    parameters = inspect.signature(type(module).__init__).parameters
    init_args = {name: getattr(module, name) for name in parameters if name != "self" and hasattr(module, name)}
    return {"class_path": f"{type(module).__module__}.{type(module).__qualname__}", "init_args": init_args}


class ImageSequences(Dataset):
    """Wraps an ``(image, label)`` dataset; items become ``(sequence (L, F), label)``.

    ``mode="pixel"``: ``L = H W`` steps of ``F = C`` values (raster order); ``mode="row"``: ``L = H`` steps of
    ``F = C W``. ``permutation`` (a ``(L,)`` index tensor) reorders the steps.
    """

    def __init__(
        self, images: Dataset, image_shape: tuple[int, int, int], mode: str, permutation: torch.Tensor | None
    ) -> None:
        self.images, self.image_shape, self.mode, self.permutation = images, image_shape, mode, permutation

    def __len__(self) -> int:
        return len(self.images)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.images[index]
        c, h, w = self.image_shape
        image = image.reshape(c, h, w)
        sequence = image.reshape(c, h * w).T if self.mode == "pixel" else image.permute(1, 0, 2).reshape(h, c * w)
        if self.permutation is not None:
            sequence = sequence[self.permutation]
        return sequence, label


class SequentialImageDataModule(SplitDataModule):
    """Any image data module read as sequences: the pixel-MNIST and permuted-MNIST tasks of Arjovsky et al.
    (2016) and the RNN experiment of "One Reflection Suffice" (section 3.2).

    Args:
        images: an image data module with ``image_shape``, ``num_classes`` and ``split(name)``
            (:class:`~lightning_ortho.datamodules.MNISTDataModule`, ``DigitsDataModule``, ...).
        mode: ``"pixel"`` (one pixel per step; 784 steps for MNIST) or ``"row"`` (one row per step).
        permute: apply a fixed random permutation of the time steps (permuted MNIST).
        permutation_seed: seed of that permutation. It is drawn from this seed alone, so it is the same in
            every process and after a resume; it is also saved in the data module's ``state_dict``. It also
            seeds the per-epoch shuffling of the training sequences.
        batch_size: overrides the wrapped module's batch size when given.
        shuffle: shuffle the training batches.
        num_workers: DataLoader workers; ``None`` takes the wrapped module's ``num_workers`` (0 if it has none).
        root: when given, replaces the wrapped module's ``root`` (the folder its files are read from), so
            ``--data.root=DIR`` points a sequential recipe at its data like a flat one.
        download: when given, replaces the wrapped module's ``download``.

    Batches are ``(x (B, L, F), labels (B,))``; ``num_features`` is ``F`` (the per-step input size). The
    loaders come from :class:`~lightning_ortho.datamodules.SplitDataModule`.

    Raises:
        ValueError: ``mode`` is neither ``"pixel"`` nor ``"row"``; or ``root``/``download`` is given for a
            wrapped module that has already loaded its data.
        TypeError: ``images`` is not an image data module.
        DataOptionError: ``root``/``download`` is given but the wrapped module has no such argument
            (``DigitsDataModule``: its data is embedded, there are no files); a ``TypeError``.
    """

    def __init__(
        self,
        images: pl.LightningDataModule,
        mode: Literal["pixel", "row"] = "pixel",
        permute: bool = False,
        permutation_seed: int = 0,
        batch_size: int | None = None,
        shuffle: bool = True,
        num_workers: int | None = None,
        root: str | None = None,
        download: bool | None = None,
    ) -> None:
        super().__init__()
        if mode not in ("pixel", "row"):
            raise ValueError(f"SequentialImageDataModule: mode must be 'pixel' or 'row', got {mode!r}.")
        for attribute in ("image_shape", "split", "num_classes"):
            if not hasattr(images, attribute):
                raise TypeError(
                    f"SequentialImageDataModule: the wrapped data module {type(images).__name__} has no `{attribute}`; "
                    "wrap an image data module such as MNISTDataModule or DigitsDataModule."
                )
        for name, value in (("root", root), ("download", download)):
            if value is not None:
                _forward(images, name, value)
        self.save_hyperparameters(ignore=["images"])
        # Record the wrapped module too (class and constructor arguments, read back from its attributes, after
        # root/download were forwarded), so a checkpoint knows its data: which images, normalisation and split.
        self.hparams["images"] = describe_module(images)
        self.images, self.mode, self.permute, self.shuffle = images, mode, permute, shuffle
        self.permutation_seed = permutation_seed
        self.batch_size = batch_size or getattr(images, "batch_size", 64)
        self.num_workers = getattr(images, "num_workers", 0) if num_workers is None else num_workers
        self.permutation = (
            torch.randperm(self.sequence_length, generator=torch.Generator().manual_seed(permutation_seed))
            if permute
            else None
        )

    @property
    def root(self) -> str | None:
        """The folder the wrapped module reads its files from (``None`` for embedded data)."""
        return getattr(self.images, "root", None)

    @property
    def download(self) -> bool | None:
        """Whether the wrapped module may download its files (``None`` for embedded data)."""
        return getattr(self.images, "download", None)

    @property
    def shuffle_seed(self) -> int:
        """The training batches are shuffled from ``permutation_seed``."""
        return self.permutation_seed

    @property
    def num_classes(self) -> int:
        """The wrapped image module's number of classes."""
        return self.images.num_classes

    @property
    def sequence_length(self) -> int:
        """``L``, time steps per sequence: ``H W`` for ``mode="pixel"``, ``H`` for ``mode="row"``."""
        c, h, w = self.images.image_shape
        return h * w if self.mode == "pixel" else h

    @property
    def num_features(self) -> int:
        """Values per time step."""
        c, h, w = self.images.image_shape
        return c if self.mode == "pixel" else c * w

    def prepare_data(self) -> None:
        self.images.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        self.images.setup(stage)

    def split(self, name: str) -> Dataset:
        """The wrapped module's ``"train"``, ``"val"`` or ``"test"`` images as sequences (sets them up if needed).

        Items are ``(sequence (L, F), label)``: ``L =`` :attr:`sequence_length` steps of ``F =``
        :attr:`num_features` values (raster order, then the fixed permutation of the steps with ``permute``).

        Args:
            name: ``"train"``, ``"val"`` or ``"test"``.

        Returns:
            The dataset (a ``torch.utils.data.Dataset``) of ``(float tensor (L, F), label)`` items.
        """
        return ImageSequences(self.images.split(name), self.images.image_shape, self.mode, self.permutation)

    def state_dict(self) -> dict:
        return {"permutation": self.permutation}

    def load_state_dict(self, state_dict: dict) -> None:
        """Refuse a checkpoint whose pixel order differs from this module's: a permuted checkpoint evaluated on
        unpermuted pixels (or the reverse, or another permutation) scores the wrong sequences without error.

        Raises:
            ValueError: the checkpoint's permutation (or its absence) differs; the message says what to set.
        """
        if "permutation" not in state_dict:  # written by something else: nothing to compare
            return
        saved = state_dict["permutation"]
        if saved is None and self.permutation is None:
            return
        if saved is None or self.permutation is None:
            trained, now = ("permuted", "unpermuted") if saved is not None else ("unpermuted", "permuted")
            raise ValueError(
                f"SequentialImageDataModule: the checkpoint was trained on {trained} pixel sequences but this data "
                f"module reads them {now}; set permute={saved is not None} (and the checkpoint's permutation_seed)."
            )
        if not torch.equal(saved.to(self.permutation.device), self.permutation):
            raise ValueError(
                "SequentialImageDataModule: the checkpoint was trained on a different pixel permutation "
                "(permutation_seed differs); resume with the same permutation_seed."
            )


def _forward(images: object, name: str, value: object) -> None:
    """Set the wrapped module's ``root`` or ``download`` (see :class:`SequentialImageDataModule`)."""
    kind = type(images).__name__
    if not hasattr(images, name):
        raise DataOptionError(
            f"SequentialImageDataModule: {name}={value!r} was given, but the wrapped {kind} has no `{name}`: it does "
            f"not read files from a folder (DigitsDataModule's data is embedded), so there is nothing to point "
            f"elsewhere. Leave {name} unset (drop --data.{name})."
        )
    if getattr(images, "_splits", None) is not None and getattr(images, name) != value:
        raise ValueError(
            f"SequentialImageDataModule: the wrapped {kind} has already loaded its data ({name}="
            f"{getattr(images, name)!r}); give {name}={value!r} to {kind} itself, or wrap it before setup()."
        )
    setattr(images, name, value)
