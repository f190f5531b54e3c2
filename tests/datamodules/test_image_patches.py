import numpy as np
import pytest
import torch
from PIL import Image

from lightning_ortho.datamodules.file_formats import DatasetFormatError
from lightning_ortho.datamodules.image_patches import ImagePatchesDataModule
from lightning_ortho.datamodules.images import DatasetNotFoundError

LUMA = np.array([0.299, 0.587, 0.114])


def reference_patches(pixels: np.ndarray, size: int, remove_mean: bool = True) -> torch.Tensor:
    """Non-overlapping patches of one float64 image (H, W) or (H, W, C) by numpy reshapes (independent of the code
    under test): rows image-row-major, entries channel, then row, then column."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    rows, cols = pixels.shape[0] // size, pixels.shape[1] // size
    cut = pixels[: rows * size, : cols * size].reshape(rows, size, cols, size, -1)
    out = cut.transpose(0, 2, 4, 1, 3).reshape(rows * cols, -1)
    if remove_mean:
        out = out - out.mean(axis=1, keepdims=True)
    return torch.from_numpy(out)


def sample_images() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return [np.asarray(image, dtype=np.float64) / 255 for image in load_sample_images().images]


def is_subsequence(rows: torch.Tensor, full: torch.Tensor) -> bool:
    """Every row of ``rows`` is a distinct row of ``full``, in ``full``'s order (exact equality)."""
    remaining = iter(map(tuple, full.tolist()))
    return all(any(row == other for other in remaining) for row in map(tuple, rows.tolist()))


def multiset(rows: torch.Tensor) -> dict:
    counts: dict = {}
    for row in map(tuple, rows.tolist()):
        counts[row] = counts.get(row, 0) + 1
    return counts


@pytest.fixture(scope="module")
def default_patches() -> torch.Tensor:
    return ImagePatchesDataModule(val_fraction=0).all_patches()


def test_default_is_the_sample_photographs_as_zero_mean_luma_patches(default_patches):
    images = sample_images()
    assert [image.shape for image in images] == [(427, 640, 3)] * 2
    count = sum((image.shape[0] // 8) * (image.shape[1] // 8) for image in images)
    assert count == 2 * 53 * 80 == 8480
    assert default_patches.shape == (count, 64) and default_patches.dtype == torch.float32
    torch.testing.assert_close(default_patches.mean(dim=1), torch.zeros(count), rtol=0, atol=1e-6)
    expected = torch.cat([reference_patches(image @ LUMA, 8) for image in images]).float()
    torch.testing.assert_close(default_patches, expected, rtol=0, atol=1e-6)
    assert ImagePatchesDataModule().num_features == 64


def test_color_patches_have_three_channels_channel_major():
    dm = ImagePatchesDataModule(grayscale=False, remove_mean=False, patch_size=16, val_fraction=0)
    assert dm.num_features == 3 * 16 * 16
    patches = dm.all_patches()
    expected = torch.cat([reference_patches(image, 16, remove_mean=False) for image in sample_images()]).float()
    assert patches.shape == ((427 // 16) * (640 // 16) * 2, 768)
    torch.testing.assert_close(patches, expected, rtol=0, atol=1e-7)
    assert 0 <= float(patches.min()) and float(patches.max()) <= 1


def test_default_color_gives_3_times_64_features_in_batches():
    dm = ImagePatchesDataModule(grayscale=False, batch_size=32)
    (patches,) = next(iter(dm.val_dataloader()))
    assert dm.num_features == 192 and patches.shape == (32, 192)


def write_folder(root) -> dict[str, np.ndarray]:
    """Real image files (PNG RGB, PNG grey, JPEG, BMP, 16-bit PNG in a subfolder) and a non-image; returns the
    pixels as each file decodes (JPEG is lossy), in [0, 1], keyed by the path below root."""
    rng = np.random.default_rng(0)
    (root / "sub").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (20, 17, 3), dtype=np.uint8)).save(root / "b_rgb.png")
    Image.fromarray(rng.integers(0, 256, (16, 24), dtype=np.uint8)).save(root / "a_grey.PNG")
    Image.fromarray(rng.integers(0, 256, (24, 16, 3), dtype=np.uint8)).save(root / "c.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (9, 9, 3), dtype=np.uint8)).save(root / "d.bmp")
    Image.fromarray(rng.integers(0, 65536, (8, 16), dtype=np.uint16)).save(root / "sub" / "0_e16.png")
    (root / "notes.txt").write_text("not an image")
    decoded = {}
    for name in ("a_grey.PNG", "b_rgb.png", "c.jpg", "d.bmp", "sub/0_e16.png"):
        pixels = np.asarray(Image.open(root / name), dtype=np.float64)
        decoded[name] = pixels / (65535 if name.startswith("sub/") else 255)
    return decoded


def test_folder_of_real_image_files_is_read_back_exactly(tmp_path):
    decoded = write_folder(tmp_path)
    dm = ImagePatchesDataModule(root=str(tmp_path), val_fraction=0)
    grey = [pixels @ LUMA if pixels.ndim == 3 else pixels for pixels in decoded.values()]
    expected = torch.cat([reference_patches(pixels, 8) for pixels in grey]).float()
    assert expected.shape == (6 + 4 + 6 + 1 + 2, 64)
    torch.testing.assert_close(dm.all_patches(), expected, rtol=0, atol=1e-6)
    names = [name for name, _ in dm.load_images()]
    assert names == [str(tmp_path / name) for name in decoded]


def test_folder_in_color_scales_pixels_and_repeats_grey_images(tmp_path):
    decoded = write_folder(tmp_path)
    dm = ImagePatchesDataModule(root=str(tmp_path), grayscale=False, remove_mean=False, patch_size=4, val_fraction=0)
    color = [np.repeat(p[:, :, None], 3, axis=2) if p.ndim == 2 else p for p in decoded.values()]
    expected = torch.cat([reference_patches(pixels, 4, remove_mean=False) for pixels in color]).float()
    torch.testing.assert_close(dm.all_patches(), expected, rtol=0, atol=1e-7)
    assert dm.all_patches().shape[1] == dm.num_features == 48


def test_single_file_root(tmp_path):
    decoded = write_folder(tmp_path)
    dm = ImagePatchesDataModule(root=str(tmp_path / "c.jpg"), val_fraction=0)
    torch.testing.assert_close(dm.all_patches(), reference_patches(decoded["c.jpg"] @ LUMA, 8).float())


def test_missing_or_empty_folder_says_what_to_pass(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        ImagePatchesDataModule(root=str(tmp_path / "nowhere")).setup()
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message and "does not exist" in message
    assert "--data.root=DIR" in message and "--data.root=null" in message and "scikit-learn" in message
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no images here")
    with pytest.raises(DatasetNotFoundError, match=r"No image files in .*empty[\s\S]*--data.root=null"):
        ImagePatchesDataModule(root=str(tmp_path / "empty")).setup()


def test_damaged_file_and_too_small_image_are_named(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DatasetFormatError, match="broken.png: not a readable image"):
        ImagePatchesDataModule(root=str(tmp_path)).setup()
    (tmp_path / "broken.png").unlink()
    Image.fromarray(np.zeros((5, 30), dtype=np.uint8)).save(tmp_path / "thin.png")
    with pytest.raises(ValueError, match=r"thin.png is 5x30, smaller than patch_size=8"):
        ImagePatchesDataModule(root=str(tmp_path)).setup()


def test_max_patches_is_a_seeded_ordered_subset(default_patches):
    a = ImagePatchesDataModule(max_patches=500, seed=1, val_fraction=0).all_patches()
    b = ImagePatchesDataModule(max_patches=500, seed=1, val_fraction=0).all_patches()
    c = ImagePatchesDataModule(max_patches=500, seed=2, val_fraction=0).all_patches()
    assert a.shape == (500, 64)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    assert is_subsequence(a, default_patches)  # rows of the full set, in its order
    assert not is_subsequence(a.flip(0), default_patches)
    assert ImagePatchesDataModule(max_patches=10**6, val_fraction=0).all_patches().shape == (8480, 64)


def test_split_is_disjoint_complete_and_loaders_yield_one_tuples(default_patches):
    dm = ImagePatchesDataModule(batch_size=64, val_fraction=0.25, seed=3)
    train, val = dm.split("train").tensors[0], dm.split("val").tensors[0]
    assert len(train) + len(val) == 8480 and len(val) == 2120
    assert dm.split("test") is dm.split("val")
    assert multiset(torch.cat([train, val])) == multiset(default_patches)
    assert is_subsequence(train, default_patches) and is_subsequence(val, default_patches)  # kept in image order
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 1 and batch[0].shape == (64, 64) and batch[0].dtype == torch.float32
    (first,) = next(iter(dm.val_dataloader()))
    torch.testing.assert_close(first, val[:64], rtol=0, atol=0)  # validation reads in order
    again = ImagePatchesDataModule(batch_size=64, val_fraction=0.25, seed=3)
    assert torch.equal(next(iter(again.train_dataloader()))[0], batch[0])  # shuffling is seeded
    everything = ImagePatchesDataModule(val_fraction=0)
    assert everything.split("train") is everything.split("val")


def test_stride_and_patch_size_options():
    dm = ImagePatchesDataModule(patch_size=4, stride=2, max_patches=None, val_fraction=0)
    assert dm.num_features == 16
    assert dm.all_patches().shape == (2 * ((427 - 4) // 2 + 1) * ((640 - 4) // 2 + 1), 16)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"patch_size": 0}, "patch_size must be at least 1"),
        ({"stride": 0}, "stride must be at least 1"),
        ({"max_patches": 0}, "max_patches must be at least 1"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"val_fraction": 1.0}, r"val_fraction must be in \[0, 1\)"),
        ({"val_fraction": -0.1}, r"val_fraction must be in \[0, 1\)"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ImagePatchesDataModule(**kwargs)


def test_plain_typed_arguments_parse_like_lightning_cli(tmp_path):
    from lightning_ortho.cli import LightningArgumentParser

    write_folder(tmp_path)
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(ImagePatchesDataModule, "data")
    config = parser.parse_args([f"--data.root={tmp_path}", "--data.stride=4", "--data.max_patches=null"])
    dm = parser.instantiate(config).data
    assert isinstance(dm, ImagePatchesDataModule) and dm.root == str(tmp_path) and dm.stride == 4
    assert dm.hparams.max_patches is None and dm.all_patches().shape[1] == 64
