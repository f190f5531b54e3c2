from pathlib import Path

import pytest
import torch

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import DigitsDataModule
from lightning_ortho.models import OrthogonalClassifier
from lightning_ortho.nn import AuxiliaryReflection, SVDLinear


def test_architecture_is_the_papers_fcnn():
    model = OrthogonalClassifier(in_features=64, depth=3, orthogonal="aux")
    svd = [m for m in model.features if isinstance(m, SVDLinear)]
    assert len(svd) == 3 and all(isinstance(m.left, AuxiliaryReflection) for m in svd)
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.features) == 2
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)


@pytest.mark.parametrize("orthogonal", ["aux", "householder"])
def test_short_training_learns_digits(orthogonal, tiny_trainer):
    pl.seed_everything(0)
    dm = DigitsDataModule(batch_size=32)
    model = OrthogonalClassifier(in_features=64, orthogonal=orthogonal, lr=3e-3)
    trainer = tiny_trainer(max_epochs=2)
    trainer.fit(model, dm)
    assert float(trainer.callback_metrics["val_acc"]) > 0.5  # chance is 0.1
    assert "epoch_time" not in trainer.callback_metrics  # wall time is Lightning's Timer callback's job


def test_names_of_version_0_1_still_resolve_with_a_warning(tmp_path):
    import lightning_ortho.models as models
    from lightning_ortho.cli import run_cli

    with pytest.warns(FutureWarning, match="renamed OrthogonalClassifier"):
        assert models.OrthoClassifier is OrthogonalClassifier
    with pytest.warns(FutureWarning, match="renamed OrthogonalRNNClassifier"):
        from lightning_ortho.models import OrthoRNNClassifier  # noqa: F401
    # An old config's class_path still runs.
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "fcnn_digits.yaml"
    args = ["fit", "--config", str(recipe), "--trainer.fast_dev_run=true"]
    args += ["--model.class_path=lightning_ortho.models.OrthoClassifier", f"--trainer.default_root_dir={tmp_path}"]
    with pytest.warns(FutureWarning):
        cli = run_cli(args)
    assert type(cli.model) is OrthogonalClassifier
