"""Checkpoints saved after TransformCompression load by every standard route into a freshly built model (whose layers
are still dense) and predict exactly what the saved model predicted: ``load_from_checkpoint``, ``Trainer.validate /
fit(..., ckpt_path=...)``, and ``lightning-ortho predict | fit --ckpt_path`` with the shipped recipe."""

from pathlib import Path

import pytest
import torch

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.cli import run_cli
from lightning_ortho.models import OrthogonalClassifier
from lightning_ortho.models.factorized_checkpoint import RestoresFactorizedLayers
from lightning_ortho.transforms import FactorizedLinear
from lightning_ortho.transforms.factorized_linear import STATE_FORMAT
from tests.callbacks.test_transform_compression import UserMLP, make_data
from tests.conftest import make_tiny_trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "compress_fcnn_digits.yaml"


class UserMLPThatRestores(RestoresFactorizedLayers, UserMLP):
    """A user's module with the mixin in its bases."""


class Predictions(pl.Callback):
    """Outputs of the model on fixed inputs at the start of fit, i.e. right after a ckpt_path was restored."""

    def __init__(self, inputs):
        self.inputs, self.outputs = inputs, None

    def on_fit_start(self, trainer, pl_module):
        with torch.no_grad():
            self.outputs = pl_module.eval()(self.inputs)
        pl_module.train()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A UserMLP whose two layers were compressed and fine-tuned, its checkpoint and its outputs on held-out data."""
    root = tmp_path_factory.mktemp("compressed")
    train, val = make_data()
    model = UserMLP()
    callback = TransformCompression(modules=["net.0", "net.2"], s=3, m=12, finetune_epochs=1, verbose=False)
    trainer = make_tiny_trainer(root, max_epochs=2, callbacks=[callback])
    trainer.fit(model, train, val)
    path = root / "compressed.ckpt"
    trainer.save_checkpoint(path)
    inputs = next(iter(val))[0]
    with torch.no_grad():
        outputs = model.eval()(inputs)
    return path, inputs, outputs, model


def outputs_of(model, inputs):
    with torch.no_grad():
        return model.eval()(inputs)


def test_the_checkpoint_marks_each_compressed_layer(saved):
    path, _, _, model = saved
    state = torch.load(path, weights_only=True)["state_dict"]  # plain values: loads without trusting pickles
    for name in ("net.0", "net.2"):
        marker = state[f"{name}._extra_state"]
        layer = model.get_submodule(name)
        assert marker["format"] == STATE_FORMAT and marker["binary"] is True
        assert (marker["in_features"], marker["out_features"]) == (layer.in_features, layer.out_features)


def test_load_from_checkpoint_rebuilds_the_layers_of_a_user_module_with_the_mixin(saved):
    path, inputs, outputs, _ = saved
    loaded = UserMLPThatRestores.load_from_checkpoint(path)
    assert isinstance(loaded.net[0], FactorizedLinear) and isinstance(loaded.net[2], FactorizedLinear)
    assert torch.equal(outputs_of(loaded, inputs), outputs)


@pytest.mark.parametrize("route", ["callback", "mixin"])
def test_trainer_validate_with_ckpt_path(saved, tmp_path, route):
    """A plain user module while TransformCompression is among the callbacks, or the mixin and no callback."""
    path, inputs, outputs, _ = saved
    _, val = make_data()
    model = UserMLP() if route == "callback" else UserMLPThatRestores()
    callbacks = [TransformCompression(modules=["net.0", "net.2"], verbose=False)] if route == "callback" else []
    make_tiny_trainer(tmp_path, callbacks=callbacks).validate(model, val, ckpt_path=path, verbose=False)
    assert isinstance(model.net[2], FactorizedLinear)
    assert torch.equal(outputs_of(model, inputs), outputs)


def test_fit_resumes_from_ckpt_path_without_compressing_again(saved, tmp_path):
    path, inputs, outputs, model = saved
    train, val = make_data()
    fresh, predictions = UserMLP(), Predictions(inputs)
    callback = TransformCompression(modules=["net.0", "net.2"], s=3, m=12, finetune_epochs=1, verbose=False)
    callback.evaluate = lambda *args: pytest.fail("the resumed callback compressed again")
    make_tiny_trainer(tmp_path, max_epochs=3, callbacks=[callback, predictions]).fit(fresh, train, val, ckpt_path=path)
    assert torch.equal(predictions.outputs, outputs)  # restored exactly ...
    assert torch.equal(fresh.net[2].mask, model.net[2].mask)
    assert not torch.equal(fresh.net[2].codes, model.net[2].codes)  # ... then trained on, codes only


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """``lightning-ortho fit`` on the compression recipe, shortened: compress after epoch 0, fine-tune epoch 1."""
    root = tmp_path_factory.mktemp("recipe")
    quick = [
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_predict_batches=2",
        "--model.init_args.depth=1",
        "--trainer.callbacks.init_args.m=16",
        "--trainer.callbacks.init_args.finetune_epochs=1",
    ]
    cli = run_cli(["fit", "--config", str(RECIPE), "--trainer.max_epochs=2", *quick])
    (path,) = (root / "checkpoints").glob("*.ckpt")
    assert isinstance(cli.model.head, FactorizedLinear) and isinstance(cli.model.features[0], FactorizedLinear)
    inputs = next(iter(cli.datamodule.predict_dataloader()))[0]
    return path, quick, inputs, outputs_of(cli.model, inputs)


def test_recipe_checkpoint_loads_by_the_cli_and_load_from_checkpoint(recipe_run):
    path, quick, inputs, outputs = recipe_run
    predicted = run_cli(["predict", "--config", str(RECIPE), f"--ckpt_path={path}", *quick])
    assert torch.equal(predicted.trainer.predict_loop.predictions[0], outputs)
    # fit --ckpt_path to the epochs already run: it restores the compressed model and stops there.
    resumed = run_cli(["fit", "--config", str(RECIPE), f"--ckpt_path={path}", "--trainer.max_epochs=2", *quick])
    assert isinstance(resumed.model.head, FactorizedLinear)
    assert torch.equal(outputs_of(resumed.model, inputs), outputs)
    loaded = OrthogonalClassifier.load_from_checkpoint(path)
    assert torch.equal(outputs_of(loaded, inputs), outputs)
