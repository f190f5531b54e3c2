"""LightningDataModules. The embedded default (scikit-learn's digits) needs no download; MNIST and CIFAR-10
come through torchvision from a local root (``download=True`` where there is a network). Online recurrent training
reads ordered chunks of parallel streams (:class:`StreamDataModule` and its tasks; the text one reads a corpus
shipped with Python). Fast transforms learn from 8x8 patches of photographs (:class:`ImagePatchesDataModule`)."""

from lightning_ortho._deprecation import moved_attributes
from lightning_ortho.datamodules.adding_task import AddingTaskDataModule
from lightning_ortho.datamodules.cifar10 import CIFAR10DataModule
from lightning_ortho.datamodules.copy_task import CopyTaskDataModule
from lightning_ortho.datamodules.digits import DigitsDataModule
from lightning_ortho.datamodules.file_formats import DatasetFormatError
from lightning_ortho.datamodules.image_patches import ImagePatchesDataModule
from lightning_ortho.datamodules.images import DatasetNotFoundError, ImageDataModule
from lightning_ortho.datamodules.influence_balancing import InfluenceBalancingDataModule
from lightning_ortho.datamodules.mnist import MNISTDataModule
from lightning_ortho.datamodules.sequential import DataOptionError, SequentialImageDataModule
from lightning_ortho.datamodules.splits import SplitDataModule
from lightning_ortho.datamodules.streams import StreamDataModule
from lightning_ortho.datamodules.text_stream import CharacterStreamDataModule

__all__ = [
    "AddingTaskDataModule",
    "CIFAR10DataModule",
    "CharacterStreamDataModule",
    "CopyTaskDataModule",
    "DataOptionError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "DigitsDataModule",
    "ImageDataModule",
    "ImagePatchesDataModule",
    "InfluenceBalancingDataModule",
    "MNISTDataModule",
    "SequentialImageDataModule",
    "SplitDataModule",
    "StreamDataModule",
]

#: Names exported here before and internal now: still resolved (with a LightningOrthoDeprecationWarning) for one release.
__getattr__ = moved_attributes(
    __name__,
    {
        "EpochSeededRandomSampler": "lightning_ortho.datamodules._sampling",
        "ImageSequences": "lightning_ortho.datamodules.sequential",
        "NormalizedImages": "lightning_ortho.datamodules.images",
        "StreamLoader": "lightning_ortho.datamodules.streams",
    },
)
