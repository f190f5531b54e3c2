"""Tiny datasets written in the real on-disk formats, for the real torchvision loaders."""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def write_mnist(root: Path, n_train: int = 64, n_test: int = 32, seed: int = 0) -> Path:
    """``root/MNIST/raw/*-ubyte`` in the IDX format (big-endian magic 0x0803 images, 0x0801 labels)."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        images[np.arange(n), labels * 2, :] = 255  # a learnable pattern: one bright row per class
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x0803, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x0801, n) + labels.tobytes())
    return Path(root)


def write_cifar10(root: Path, n_per_batch: int = 16, n_test: int = 16, seed: int = 0) -> Path:
    """``root/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}`` as pickled dicts (the real layout)."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int) -> dict:
        labels = rng.integers(0, 10, n)
        data = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
        return {"data": data, "labels": labels.tolist(), "batch_label": "synthetic"}

    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(n_per_batch)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(n_test)))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names, "num_vis": 3072}))
    return Path(root)


def write_photos(root: Path, seed: int = 0) -> Path:
    """``root/photos/*.png``: two 8-bit PNG photographs (one grey 32x40, one RGB 24x48) of smooth random texture,
    as an image folder for :class:`ImagePatchesDataModule` (20 + 18 = 38 patches of 8x8; the module reads root recursively)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder = Path(root) / "photos"
    folder.mkdir(parents=True, exist_ok=True)
    for name, shape in (("grey.png", (32, 40)), ("colour.png", (24, 48, 3))):
        pixels = rng.normal(size=shape).cumsum(0).cumsum(1)
        pixels = np.uint8(255 * (pixels - pixels.min()) / np.ptp(pixels))
        Image.fromarray(pixels).save(folder / name)
    return Path(root)


@dataclass(frozen=True)
class OnDisk:
    """How to give a file-reading data module tiny files: ``write(root)``, the folder under ``root`` that
    torchvision reads, the test-split size written, and the options (``name -> value``) hand-made files need."""

    write: Callable[[Path], Path]
    folder: str
    n_test: int
    options: dict[str, str] = field(default_factory=dict)


# Keyed by data module class name; a recipe whose data module reads files but is missing here fails its test.
ON_DISK = {
    "MNISTDataModule": OnDisk(write_mnist, "MNIST/raw", 32),
    "CIFAR10DataModule": OnDisk(write_cifar10, "cifar-10-batches-py", 16, {"verify_checksums": "false"}),
    "ImagePatchesDataModule": OnDisk(write_photos, "", 4),
}
