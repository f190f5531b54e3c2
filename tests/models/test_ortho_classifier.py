import pytest
import pytorch_lightning as pl
import torch

from lightning_ortho.datamodules import DigitsDataModule
from lightning_ortho.models import OrthoClassifier
from lightning_ortho.nn import AuxiliaryReflection, SVDLinear


def test_architecture_is_the_papers_fcnn():
    model = OrthoClassifier(in_features=64, depth=3, orthogonal="aux")
    svd = [m for m in model.features if isinstance(m, SVDLinear)]
    assert len(svd) == 3 and all(isinstance(m.left, AuxiliaryReflection) for m in svd)
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.features) == 2
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)


@pytest.mark.parametrize("orthogonal", ["aux", "householder"])
def test_short_training_learns_digits(orthogonal, tiny_trainer):
    pl.seed_everything(0)
    dm = DigitsDataModule(batch_size=32)
    model = OrthoClassifier(in_features=64, orthogonal=orthogonal, lr=3e-3)
    trainer = tiny_trainer(max_epochs=2)
    trainer.fit(model, dm)
    assert float(trainer.callback_metrics["val_acc"]) > 0.5  # chance is 0.1
    assert float(trainer.callback_metrics["epoch_time"]) > 0
