"""Checks of dataset files on disk, so a damaged file is named with what is wrong instead of a loader's traceback.

torchvision reads MNIST's IDX files and CIFAR-10's pickled batches without checking them: a truncated file
fails with ``shape '[30, 28, 28]' is invalid``, a wrong header with a bare ``AssertionError``, and 14x14 images
or a label of 200 are accepted and crash much later. These functions read the headers (and the labels) first.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


class DatasetFormatError(ValueError):
    """A dataset file exists but is damaged or not in the expected format; the message names the file."""


def _damaged(path: Path, problem: str, name: str) -> DatasetFormatError:
    return DatasetFormatError(
        f"{path}: {problem}.\n  The {name} file is damaged or not in the {name} format. Delete "
        f"{path.parent} and download it again (--data.download=true on a machine with internet), or copy the "
        f"original files there."
    )


def check_idx_file(path: Path, *, item_shape: tuple[int, ...], name: str = "MNIST") -> int:
    """Check an IDX file of unsigned bytes (MNIST's format) holding items of ``item_shape``; return their count.

    The header is the magic ``0x0000 08 NDIM`` (big-endian) then NDIM big-endian 32-bit sizes; the file must hold
    exactly their product of bytes after it.

    Raises:
        DatasetFormatError: wrong magic, item shape or length (the message names the file and the fix).
    """
    data = path.read_bytes()
    ndim = 1 + len(item_shape)
    if len(data) < 4 + 4 * ndim:
        raise _damaged(path, f"{len(data)} bytes, too short for an IDX header", name)
    zero, code, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or code != 0x08 or dims != ndim:
        raise _damaged(path, f"header {data[:4].hex()} is not an IDX file of {ndim}-dimensional unsigned bytes", name)
    sizes = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    if tuple(sizes[1:]) != tuple(item_shape):
        shape = "x".join(map(str, sizes[1:])) or "scalar"
        raise _damaged(
            path, f"holds items of shape {shape}, expected {'x'.join(map(str, item_shape)) or 'scalar'}", name
        )
    expected = 4 + 4 * ndim + int(np.prod(sizes))
    if len(data) != expected:
        raise _damaged(path, f"{len(data)} bytes, but its header announces {sizes[0]} items ({expected} bytes)", name)
    return sizes[0]


def check_labels(path: Path, labels: np.ndarray, num_classes: int, name: str) -> None:
    """Raise :class:`DatasetFormatError` naming ``path`` unless every label is in ``0 .. num_classes - 1``."""
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise _damaged(path, f"label {int(labels[first])} at index {first} is outside 0..{num_classes - 1}", name)


def check_mnist_folder(folder: Path, num_classes: int = 10) -> None:
    """Check the four MNIST files that exist in ``folder`` (missing ones are reported by the loader): 28x28 images,
    labels in range, and as many labels as images."""
    for prefix in ("train", "t10k"):
        images, labels = folder / f"{prefix}-images-idx3-ubyte", folder / f"{prefix}-labels-idx1-ubyte"
        counts = {}
        if images.exists():
            counts["images"] = check_idx_file(images, item_shape=(28, 28))
        if labels.exists():
            counts["labels"] = check_idx_file(labels, item_shape=())
            check_labels(labels, np.frombuffer(labels.read_bytes()[8:], dtype=np.uint8), num_classes, "MNIST")
        if len(counts) == 2 and counts["images"] != counts["labels"]:
            raise _damaged(labels, f"{counts['labels']} labels for {counts['images']} images in {images.name}", "MNIST")


def check_cifar10_batch(path: Path, num_classes: int = 10) -> None:
    """Check one pickled CIFAR-10 batch: a dict with ``data`` ``(N, 3072)`` bytes and ``N`` labels in range."""
    try:
        with path.open("rb") as file:
            batch = pickle.load(file, encoding="latin1")
    except Exception as error:  # any unpickling failure means the same thing to the user
        raise _damaged(path, f"cannot be unpickled ({type(error).__name__}: {error})", "CIFAR-10") from error
    if not isinstance(batch, dict) or "data" not in batch or not ({"labels", "fine_labels"} & set(batch)):
        raise _damaged(path, "is not a dict with 'data' and 'labels'", "CIFAR-10")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch.get("labels", batch.get("fine_labels")))
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
        raise _damaged(
            path, f"'data' has shape {data.shape} and dtype {data.dtype}, expected (N, 3072) uint8", "CIFAR-10"
        )
    if labels.shape != (data.shape[0],):
        raise _damaged(path, f"{labels.size} labels for {data.shape[0]} images", "CIFAR-10")
    check_labels(path, labels, num_classes, "CIFAR-10")
