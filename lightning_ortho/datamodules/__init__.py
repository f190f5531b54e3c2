"""LightningDataModules. The embedded default (scikit-learn's digits) needs no download."""

from lightning_ortho.datamodules.digits import DigitsDataModule

__all__ = ["DigitsDataModule"]
