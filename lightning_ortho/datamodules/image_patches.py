"""Square image patches (8x8 by default, each with its own mean removed): the data of the fast-transform learners.

The embedded default is scikit-learn's two bundled sample photographs (no download, ever); ``root`` reads a
folder of image files instead.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from lightning_ortho._extras import require
from lightning_ortho.datamodules.file_formats import DatasetFormatError
from lightning_ortho.datamodules.images import DatasetNotFoundError
from lightning_ortho.datamodules.splits import SplitDataModule
from lightning_ortho.transforms.patches import image_patches

#: Suffixes (lower-cased) of the files read from ``root``.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".pgm")
#: ITU-R BT.601 luma weights of R, G, B (what PIL's ``convert("L")`` uses, here without its rounding to 8 bits).
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


class ImagePatchesDataModule(SplitDataModule):
    """Non-overlapping (by default) ``patch_size x patch_size`` patches of photographs as ``(N, n)`` rows.

    With the defaults this is the paper's data (Rusu's experiments: 8x8 patches of 8-bit images divided by 255, each
    patch's own mean removed, ``n = 64``), cut from scikit-learn's bundled sample photographs
    (``sklearn.datasets.load_sample_images()``: ``china.jpg`` and ``flower.jpg``, 427x640 RGB, giving
    ``2 * 53 * 80 = 8480`` patches) instead of the paper's lena.

    Pixels: 8-bit images are divided by 255, 16-bit ones by 65535, so every pixel is in [0, 1]. With ``grayscale``
    colour images become their ITU-R 601 luma ``0.299 R + 0.587 G + 0.114 B`` (computed in float, not rounded to
    8 bits) and ``n = patch_size**2``; without it every image is RGB (grey ones are repeated over the three
    channels) and ``n = 3 * patch_size**2``. An alpha channel is dropped. Patches are cut by
    :func:`lightning_ortho.transforms.patches.image_patches` (ragged borders dropped; rows in the order image,
    patch row, patch column; each patch flattened channel-major, then row-major).

    Args:
        root: ``None`` for the embedded sample photographs; else a folder, read recursively: every file whose
            suffix is one of ``IMAGE_SUFFIXES`` (any case), in sorted order of the path below ``root``; or a single
            image file.
        patch_size: side of the square patches.
        grayscale: luma (one channel) instead of RGB.
        remove_mean: subtract each patch's own mean (over all its entries).
        stride: step between patches; ``None`` = ``patch_size`` (non-overlapping).
        max_patches: keep a random subset of this many patches (drawn from ``seed``, kept in image order); ``None``
            keeps all.
        batch_size: patches per batch.
        val_fraction: fraction of the patches held out (a fixed permutation from ``seed``) for validation and
            testing. ``0`` trains, validates and tests on all the patches (the paper's setting: a transform is
            fitted to, and its representation error reported on, the same data).
        seed: seed of ``max_patches``' subset, of the split and of the per-epoch shuffling (independent of the
            global seed).
        shuffle: shuffle the training batches.
        num_workers: DataLoader workers (the patches live in memory; 0 is fastest here).

    Batches follow the ``(inputs, ...)`` convention of the other data modules with no labels: the datasets hold
    1-tuples ``(patch,)`` (``TensorDataset``), so a loader yields a one-element sequence ``[patches]`` with
    ``patches`` float32 ``(batch, n)``; unpack it with ``(patches,) = batch`` (loaders: :class:`SplitDataModule`).
    ``"val"`` and ``"test"`` are the same held-out patches (``predict`` reads them too); where ``val_fraction``
    rounds to no patch, all of them. Nothing needs to survive a checkpoint: the patches are a function of the
    arguments.

    Raises:
        ValueError: an argument is out of range (in ``__init__``); an image is smaller than ``patch_size`` (in
            :meth:`setup`, naming the file).
        DatasetNotFoundError: ``root`` does not exist or holds no image file (in :meth:`setup`).
        DatasetFormatError: a file under ``root`` is not a readable image, or has an unsupported pixel format.
    """

    def __init__(
        self,
        root: str | None = None,
        patch_size: int = 8,
        grayscale: bool = True,
        remove_mean: bool = True,
        stride: int | None = None,
        max_patches: int | None = None,
        batch_size: int = 256,
        val_fraction: float = 0.1,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("patch_size", patch_size), ("stride", stride), ("max_patches", max_patches)):
            if value is not None and value < 1:
                raise ValueError(f"{name}: {arg} must be at least 1 (or None where allowed), got {value}.")
        if batch_size < 1:
            raise ValueError(f"{name}: batch_size must be at least 1, got {batch_size}.")
        if not 0 <= val_fraction < 1:
            raise ValueError(
                f"{name}: val_fraction must be in [0, 1) (0 validates on all patches), got {val_fraction}."
            )
        self.save_hyperparameters()
        # Attributes, not self.hparams, drive the behaviour (see SplitDataModule).
        self.root, self.patch_size, self.grayscale, self.remove_mean = root, patch_size, grayscale, remove_mean
        self.stride, self.max_patches, self.val_fraction = stride, max_patches, val_fraction
        self.batch_size, self.seed, self.shuffle, self.num_workers = batch_size, seed, shuffle, num_workers
        self._patches: torch.Tensor | None = None
        self._splits: dict[str, TensorDataset] | None = None

    @property
    def num_features(self) -> int:
        """``n``, the length of one patch: ``patch_size**2``, times 3 without ``grayscale`` (known before setup)."""
        return (1 if self.grayscale else 3) * self.patch_size**2

    def load_images(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, image)`` pairs, ``image`` float32 ``(C, H, W)`` in [0, 1] with ``C = 1`` (``grayscale``) or 3.

        Raises:
            DatasetNotFoundError: ``root`` does not exist or holds no image file.
            DatasetFormatError: a file is not a readable image or has an unsupported pixel format.
            MissingExtraError: Pillow is not installed (the ``transforms`` extra).
        """
        if self.root is None:
            from sklearn.datasets import load_sample_images

            require("PIL", "ImagePatchesDataModule reads scikit-learn's sample photographs (JPEG)")

            sample = load_sample_images()
            pairs = [
                (Path(f).name, torch.tensor(a, dtype=torch.float64).permute(2, 0, 1) / 255.0)
                for f, a in zip(sample.filenames, sample.images, strict=True)
            ]
        else:
            pairs = [(str(path), _read_image(path)) for path in self._image_files()]
        return [(name, self._channels(image)) for name, image in pairs]

    def _image_files(self) -> list[Path]:
        root = Path(self.root)  # type: ignore[arg-type]
        kinds = ", ".join(IMAGE_SUFFIXES)
        fallback = (
            "  - No images at hand? Leave root unset (--data.root=null) to use the two sample photographs bundled\n"
            "    with scikit-learn (china.jpg, flower.jpg; no download)."
        )
        if not root.exists():
            raise DatasetNotFoundError(
                f"Image folder {root} does not exist (ImagePatchesDataModule reads {kinds} files from it).\n"
                f"  - Images elsewhere? Point the recipe at their folder: --data.root=DIR (read recursively).\n"
                f"{fallback}"
            )
        if root.is_file():
            files = [root] if root.suffix.lower() in IMAGE_SUFFIXES else []
        else:
            files = sorted(
                (p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                key=lambda p: p.relative_to(root).as_posix(),
            )
        if not files:
            raise DatasetNotFoundError(
                f"No image files in {root} (ImagePatchesDataModule reads {kinds} files, searching subfolders).\n"
                f"  - Images elsewhere? Point the recipe at their folder: --data.root=DIR.\n"
                f"{fallback}"
            )
        return files

    def _channels(self, image: torch.Tensor) -> torch.Tensor:
        """float64 ``(1 or 3, H, W)`` -> float32 luma ``(1, H, W)`` or RGB ``(3, H, W)``."""
        if self.grayscale and image.shape[0] == 3:
            weights = torch.tensor(LUMA_WEIGHTS, dtype=image.dtype).reshape(3, 1, 1)
            image = (weights * image).sum(dim=0, keepdim=True)
        elif not self.grayscale and image.shape[0] == 1:
            image = image.expand(3, -1, -1)
        return image.float()

    def all_patches(self) -> torch.Tensor:
        """Every patch (after the ``max_patches`` subset, before the split) as one float32 ``(N, n)`` tensor, in
        image, patch row, patch column order; runs :meth:`setup` if needed.

        Raises:
            ValueError: an image is smaller than ``patch_size``.
            DatasetNotFoundError: ``root`` does not exist or holds no image file.
            DatasetFormatError: a file is not a readable image or has an unsupported pixel format.
        """
        self.setup()
        assert self._patches is not None
        return self._patches

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        rows = []
        for name, image in self.load_images():
            if image.shape[-2] < self.patch_size or image.shape[-1] < self.patch_size:
                raise ValueError(
                    f"{type(self).__name__}: {name} is {image.shape[-2]}x{image.shape[-1]}, smaller than "
                    f"patch_size={self.patch_size}; remove it or lower patch_size."
                )
            rows.append(image_patches(image, self.patch_size, stride=self.stride, remove_mean=self.remove_mean))
        patches = torch.cat(rows)
        generator = torch.Generator().manual_seed(self.seed)
        if self.max_patches is not None and self.max_patches < len(patches):
            keep = torch.randperm(len(patches), generator=generator)[: self.max_patches]
            patches = patches[keep.sort().values]
        self._patches = patches
        n = len(patches)
        n_val = round(n * self.val_fraction)
        if self.val_fraction == 0 or n_val == 0 or n_val == n:
            everything = TensorDataset(patches)
            self._splits = {"train": everything, "val": everything, "test": everything}
            return
        order = torch.randperm(n, generator=generator)
        val, train = order[:n_val].sort().values, order[n_val:].sort().values
        held_out = TensorDataset(patches[val])
        self._splits = {"train": TensorDataset(patches[train]), "val": held_out, "test": held_out}

    def split(self, name: str) -> TensorDataset:
        """The ``"train"``, ``"val"`` or ``"test"`` dataset of 1-tuples ``(patch,)`` (runs :meth:`setup` if needed)."""
        self.setup()
        assert self._splits is not None
        return self._splits[name]


def _read_image(path: Path) -> torch.Tensor:
    """One image file as float64 ``(1, H, W)`` (grey) or ``(3, H, W)`` (colour) in [0, 1], read with PIL.

    8-bit modes (``1``, ``L``, ``P``, ``RGB``, ``RGBA``, ``CMYK``, ...) are divided by 255 (alpha dropped; palette
    and CMYK images become RGB); 16-bit grey (``I;16*``, and ``I`` as PIL opens 16-bit PGM) by 65535.

    Raises:
        DatasetFormatError: not an image PIL can read, or a float / over-16-bit image (no known pixel range).
    """
    import numpy as np

    Image = require("PIL.Image", "ImagePatchesDataModule reads image files")
    UnidentifiedImageError = Image.UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode.startswith("I;16") or mode == "I":
                pixels, scale = np.asarray(image).astype(np.float64), 65535.0
                if pixels.size and not 0 <= pixels.min() <= pixels.max() <= scale:
                    raise DatasetFormatError(
                        f"{path}: 32-bit integer pixels outside 0..65535; convert it to an 8- or 16-bit image."
                    )
            elif mode == "F":
                raise DatasetFormatError(
                    f"{path}: floating-point pixels have no known range; convert it to an 8- or 16-bit image."
                )
            elif mode in ("1", "L", "LA"):
                pixels, scale = np.asarray(image.convert("L"), dtype=np.float64), 255.0
            else:
                pixels, scale = np.asarray(image.convert("RGB"), dtype=np.float64), 255.0
    except (UnidentifiedImageError, OSError, SyntaxError) as error:  # PIL raises SyntaxError for some broken headers
        raise DatasetFormatError(f"{path}: not a readable image ({error}); remove it or replace it.") from error
    tensor = torch.from_numpy(np.ascontiguousarray(pixels)) / scale
    return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)
