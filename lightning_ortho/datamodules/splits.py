"""The one place where data modules turn their ``train``/``val``/``test`` datasets into DataLoaders."""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules._sampling import EpochSeededRandomSampler


class SplitDataModule(pl.LightningDataModule):
    """Base of the data modules that hold three fixed datasets, ``split("train" | "val" | "test")``.

    It builds their DataLoaders, identically for every subclass: batches of ``batch_size`` items loaded by
    ``num_workers`` worker processes; the training set is shuffled by an :class:`EpochSeededRandomSampler`
    drawn from ``shuffle_seed`` (so a resumed run sees the same batches as an uninterrupted one) when
    ``shuffle`` is true, and read in order otherwise; validation and test sets are always read in order, and
    prediction reads the test set.
    Under DDP, Lightning replaces the sampler by a ``DistributedSampler``.

    Subclasses implement :meth:`split` and set the attributes ``batch_size`` (int), ``num_workers`` (int),
    ``shuffle`` (bool) and ``seed`` (int, the default ``shuffle_seed``) in their constructor. Attributes, not
    ``self.hparams``, drive the behaviour: when a data module is nested inside another one
    (:class:`~lightning_ortho.datamodules.SequentialImageDataModule`), LightningCLI may hand the outer module's
    configuration to the inner module's ``save_hyperparameters()``.
    """

    batch_size: int
    num_workers: int
    shuffle: bool
    seed: int

    def split(self, name: str) -> Dataset:
        """The ``"train"``, ``"val"`` or ``"test"`` dataset (sets the data up if needed).

        Raises:
            NotImplementedError: the subclass does not provide its splits.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement split(name).")

    @property
    def shuffle_seed(self) -> int:
        """Seed of the per-epoch shuffling of the training set (``seed`` unless a subclass says otherwise)."""
        return self.seed

    def _loader(self, name: str, shuffle: bool = False) -> DataLoader:
        data = self.split(name)
        sampler = EpochSeededRandomSampler(len(data), self.shuffle_seed) if shuffle else None  # type: ignore[arg-type]
        return DataLoader(data, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=self.shuffle)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        """The test split, in order (what ``lightning-ortho predict`` and ``Trainer.predict`` read)."""
        return self._loader("test")
