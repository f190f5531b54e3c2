"""scikit-learn's bundled 8x8 handwritten digits as a LightningDataModule (no download, ever)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from lightning_ortho.datamodules.splits import SplitDataModule


class DigitsDataModule(SplitDataModule):
    """The 1,797 real 8x8 digits of ``sklearn.datasets.load_digits``: the embedded default of every demo.

    Pixels (0..16) are scaled to [0, 1] and, optionally, resized bilinearly to ``image_size`` (28 gives
    MNIST-shaped 784-dimensional inputs of real handwriting, for timing runs at the paper's ``d``), then
    standardised with the training split's mean and standard deviation (``mean``/``std``, saved in the
    data module's ``state_dict`` and therefore in checkpoints).

    Args:
        batch_size: samples per batch.
        image_size: side of the square images (8 = original).
        flatten: yield ``(N, image_size**2)`` vectors (for fully connected models) instead of ``(N, 1, H, W)``.
        val_fraction: share of the digits in the validation split (a fixed permutation from ``seed``).
        test_fraction: share of the digits in the test split.
        seed: seed of the split and of the per-epoch shuffling (independent of the global seed, so every run
            sees the same split and a resumed run the same batches).
        shuffle: shuffle the training batches.
        standardize: standardise with the training split's statistics. ``False`` keeps pixels in [0, 1] as
            ``k / 16`` (what a normalizing flow needs for dequantisation, with 17 levels; use ``image_size=8``).
        num_workers: DataLoader workers (the data lives in memory; 0 is fastest here).

    Batches are ``(inputs, labels)`` with ``labels`` int64 in ``0..9`` (loaders: :class:`SplitDataModule`).
    The data is embedded in scikit-learn: there is no ``root`` and no file to read.

    Raises:
        ValueError: ``image_size`` is not positive, or the split fractions do not leave a training set.
    """

    num_classes = 10

    def __init__(
        self,
        batch_size: int = 64,
        image_size: int = 8,
        flatten: bool = True,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        standardize: bool = True,
    ) -> None:
        super().__init__()
        if image_size < 1:
            raise ValueError(f"DigitsDataModule: image_size must be positive, got {image_size}.")
        if not (0 < val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                "DigitsDataModule: val_fraction and test_fraction must be in (0, 1) and sum to less than 1."
            )
        self.save_hyperparameters()
        # Attributes, not self.hparams, drive the behaviour (see SplitDataModule).
        self.batch_size, self.image_size, self.flatten = batch_size, image_size, flatten
        self.val_fraction, self.test_fraction, self.seed, self.shuffle = val_fraction, test_fraction, seed, shuffle
        self.num_workers, self.standardize = num_workers, standardize
        self._splits: dict[str, TensorDataset] | None = None

    @property
    def num_features(self) -> int:
        """Input dimension of a flattened image: ``image_size ** 2``."""
        return self.image_size**2

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image (before flattening)."""
        return (1, self.image_size, self.image_size)

    def _images(self) -> tuple[torch.Tensor, torch.Tensor]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        if self.image_size != 8:
            images = torch.nn.functional.interpolate(
                images, size=(self.image_size,) * 2, mode="bilinear", align_corners=False
            )
        return images, torch.as_tensor(digits.target, dtype=torch.long)

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        images, labels = self._images()
        n = len(labels)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        n_val, n_test = round(n * self.val_fraction), round(n * self.test_fraction)
        index = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
        train = images[index["train"]]
        self.mean, self.std = float(train.mean()), float(train.std())
        if self.standardize:
            images = (images - self.mean) / self.std
        if self.flatten:
            images = images.flatten(1)
        self._splits = {name: TensorDataset(images[i], labels[i]) for name, i in index.items()}

    def split(self, name: str) -> TensorDataset:
        """The ``"train"``, ``"val"`` or ``"test"`` dataset (calls :meth:`setup` if needed)."""
        self.setup()
        assert self._splits is not None
        return self._splits[name]

    def state_dict(self) -> dict[str, float]:
        """Normalisation statistics, saved in checkpoints."""
        return {"mean": getattr(self, "mean", float("nan")), "std": getattr(self, "std", float("nan"))}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        self.mean, self.std = state_dict["mean"], state_dict["std"]
