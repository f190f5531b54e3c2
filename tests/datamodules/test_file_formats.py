"""Damaged dataset files are named with what is wrong (issue 9.12), using the real on-disk formats."""

import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_ortho.datamodules import CIFAR10DataModule, DatasetFormatError, MNISTDataModule
from tests.datasets_on_disk import write_cifar10, write_mnist

ROOT = Path(__file__).resolve().parents[2]


def raw(root: Path) -> Path:
    return root / "MNIST" / "raw"


def damage_truncate(root):
    path = raw(root) / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    return path, "bytes, but its header announces"


def damage_magic(root):
    path = raw(root) / "t10k-labels-idx1-ubyte"
    data = bytearray(path.read_bytes())
    data[2] = 0x0D  # float data, not unsigned bytes
    path.write_bytes(bytes(data))
    return path, "is not an IDX file"


def damage_size(root):
    path = raw(root) / "train-images-idx3-ubyte"
    images = np.zeros((64, 14, 14), dtype=np.uint8)
    path.write_bytes(struct.pack(">IIII", 0x0803, 64, 14, 14) + images.tobytes())
    return path, "shape 14x14, expected 28x28"


def damage_label(root):
    path = raw(root) / "train-labels-idx1-ubyte"
    data = bytearray(path.read_bytes())
    data[8 + 5] = 200
    path.write_bytes(bytes(data))
    return path, "label 200 at index 5 is outside 0..9"


def damage_count(root):
    path = raw(root) / "t10k-labels-idx1-ubyte"
    path.write_bytes(struct.pack(">II", 0x0801, 3) + bytes(3))
    return path, "3 labels for 32 images"


@pytest.mark.parametrize("damage", [damage_truncate, damage_magic, damage_size, damage_label, damage_count])
def test_damaged_mnist_files_are_named_with_the_problem(damage, tmp_path):
    write_mnist(tmp_path)
    path, problem = damage(tmp_path)
    with pytest.raises(DatasetFormatError, match="download it again") as error:
        MNISTDataModule(root=str(tmp_path)).setup()
    assert str(path) in str(error.value) and problem in str(error.value)


def test_damaged_cifar10_batches_are_named(tmp_path):
    write_cifar10(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DatasetFormatError, match=r"data_batch_3: cannot be unpickled"):
        CIFAR10DataModule(root=str(tmp_path), verify_checksums=False).setup()
    write_cifar10(tmp_path)
    batch = pickle.loads((folder / "test_batch").read_bytes())
    batch["labels"][2] = 200
    (folder / "test_batch").write_bytes(pickle.dumps(batch))
    with pytest.raises(DatasetFormatError, match=r"test_batch: label 200 at index 2"):
        CIFAR10DataModule(root=str(tmp_path), verify_checksums=False).setup()


def test_the_command_reports_a_damaged_file_in_one_message(tmp_path):
    write_mnist(tmp_path / "data")
    damage_truncate(tmp_path / "data")
    script = Path(sys.executable).parent / "lightning-ortho"
    command = [str(script), "fit", "--config", str(ROOT / "recipes" / "fcnn_mnist.yaml")]
    command += [f"--data.root={tmp_path / 'data'}", f"--trainer.default_root_dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2
    assert "Dataset file damaged." in result.stderr and "train-images-idx3-ubyte" in result.stderr
    assert "Traceback" not in result.stderr
