"""LightningDataModules. The embedded default (scikit-learn's digits) needs no download; MNIST and CIFAR-10
come through torchvision from a local root (``download=True`` where there is a network)."""

from lightning_ortho.datamodules._sampling import EpochSeededRandomSampler
from lightning_ortho.datamodules.cifar10 import CIFAR10DataModule
from lightning_ortho.datamodules.digits import DigitsDataModule
from lightning_ortho.datamodules.file_formats import DatasetFormatError
from lightning_ortho.datamodules.images import DatasetNotFoundError, ImageDataModule, NormalizedImages
from lightning_ortho.datamodules.mnist import MNISTDataModule
from lightning_ortho.datamodules.sequential import DataOptionError, ImageSequences, SequentialImageDataModule
from lightning_ortho.datamodules.splits import SplitDataModule

__all__ = [
    "CIFAR10DataModule",
    "DataOptionError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "DigitsDataModule",
    "EpochSeededRandomSampler",
    "ImageDataModule",
    "ImageSequences",
    "MNISTDataModule",
    "NormalizedImages",
    "SequentialImageDataModule",
    "SplitDataModule",
]
