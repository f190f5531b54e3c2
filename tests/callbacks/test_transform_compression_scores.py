"""TransformCompression and what the rest of the fit reads about the model: every checkpoint's score is that of the
weights it holds, the figures of an end-of-fit compression reach ``trainer.callback_metrics``, a checkpoint written
after compression holds optimizer state of the compressed parameters, and the modes set by ``train(mode)``
overrides are those of training again after the compression's evaluation."""

import warnings

import pytest
import torch
from torch import nn

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.transforms.compression import FactorizedLinear
from tests.callbacks.test_transform_compression import UserMLP, make_data
from tests.conftest import make_tiny_trainer


def compression(**kwargs):
    # s=1, m=2: a coarse compression that moves the validation accuracy, so a mislabelled score is visible
    return TransformCompression(s=1, m=2, verbose=False, progress=False, **kwargs)


@pytest.mark.parametrize("when", [{"at_epoch": 1}, {"finetune_epochs": 1}])
def test_every_checkpoint_carries_the_score_of_the_weights_it_holds(tmp_path, when):
    train, val = make_data()
    torch.manual_seed(0)
    model, callback = UserMLP(), compression(**when)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_acc", mode="max", save_top_k=-1)
    make_tiny_trainer(
        tmp_path, max_epochs=3, callbacks=[callback, checkpoints], enable_checkpointing=True, num_sanity_val_steps=0
    ).fit(model, train, val)
    assert callback.metric_after != callback.metric_before  # the compression changes the score: a stale one shows
    assert len(checkpoints.best_k_models) == 3
    kinds = []
    for path, recorded in checkpoints.best_k_models.items():
        fresh = UserMLP()
        validator = make_tiny_trainer(tmp_path / "v", callbacks=[TransformCompression(verbose=False)])
        (result,) = validator.validate(fresh, val, ckpt_path=path, verbose=False)
        assert float(recorded) == pytest.approx(result["val_acc"], abs=1e-6), path
        kinds.append(type(fresh.net[0]).__name__)
    assert sorted(kinds) == ["FactorizedLinear", "Linear", "Linear"]  # epochs 0, 1 dense; 2 compressed


def test_compressing_after_the_last_epoch_warns_only_when_fine_tuning_was_planned(tmp_path):
    train, val = make_data()
    callback = compression(at_epoch=1)  # the last of 2 epochs: compressed at the end of fit, as planned
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_tiny_trainer(tmp_path, max_epochs=2, callbacks=[callback]).fit(UserMLP(), train, val)
    assert callback.done and not [w for w in caught if "TransformCompression" in str(w.message)]
    callback = compression(at_epoch=2)  # 2 of 4 epochs, but the fit stops after epoch 1
    with pytest.warns(UserWarning, match=r"fit ended \(in epoch 2\) before the fine-tuning planned after epoch 2"):
        make_tiny_trainer(tmp_path, max_epochs=4, max_steps=4, callbacks=[callback]).fit(UserMLP(), train, val)
    assert callback.done


def test_an_end_of_fit_compression_reaches_callback_metrics_and_says_validation_came_before_it(tmp_path):
    train, val = make_data()
    callback = compression()
    trainer = make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback])
    trainer.fit(UserMLP(), train, val)
    metrics = trainer.callback_metrics
    assert metrics["compression/val_acc_before"].item() == pytest.approx(callback.metric_before)
    assert metrics["compression/val_acc_after"].item() == pytest.approx(callback.metric_after)
    assert metrics["compression/val_acc_before"].item() == pytest.approx(metrics["val_acc"].item())  # the dense
    assert "compression/ops_after" in metrics and "compression/error/net.0" in metrics
    assert callback.compressed_after_validation  # val_acc describes the dense model
    (result,) = trainer.validate(trainer.lightning_module, val, verbose=False)
    assert result["val_acc"] == pytest.approx(callback.metric_after, abs=1e-6)
    assert not callback.compressed_after_validation
    # compressed in the fit, then validated: the logged val_acc is the compressed model's
    callback = compression(at_epoch=0)
    make_tiny_trainer(tmp_path, max_epochs=2, callbacks=[callback]).fit(UserMLP(), train, val)
    assert callback.done and not callback.compressed_after_validation


class OptimizerStateOnStart(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        optimizer, names = trainer.optimizers[0], {id(p): n for n, p in pl_module.named_parameters()}
        self.state = {
            names[id(p)]: dict(optimizer.state.get(p, {})) for g in optimizer.param_groups for p in g["params"]
        }


def test_the_compressed_checkpoint_holds_optimizer_state_of_the_compressed_parameters(tmp_path):
    train, val = make_data()
    callback, model = compression(), UserMLP()
    make_tiny_trainer(
        tmp_path,
        max_epochs=2,
        callbacks=[callback, pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ck")],
        enable_checkpointing=True,
    ).fit(model, train, val)
    saved = torch.load(callback.compressed_checkpoint, weights_only=False)
    (state,) = saved["optimizer_states"]
    assert sum(len(g["params"]) for g in state["param_groups"]) == len(list(model.parameters()))
    assert state["state"] == {}  # no Adam moments of the dense weights (of the codes' shape) carried over
    # resuming from it, the codes start with fresh optimizer state and train on
    peek, fresh = OptimizerStateOnStart(), UserMLP()
    resumed = make_tiny_trainer(tmp_path / "r", max_epochs=3, callbacks=[compression(), peek])
    resumed.fit(fresh, train, val, ckpt_path=callback.compressed_checkpoint)
    assert isinstance(fresh.net[0], FactorizedLinear)
    assert set(peek.state) == {"net.0.codes", "net.0.bias", "net.2.codes", "net.2.bias"}
    assert all(state == {} for state in peek.state.values()), peek.state
    assert not torch.equal(fresh.net[0].codes, model.net[0].codes)


class NoisyInTraining(nn.Module):
    """Input noise while training; its ``train(mode)`` override sets the noise level (a pattern users write)."""

    def __init__(self):
        super().__init__()
        self.noise = 0.1

    def train(self, mode=True):
        super().train(mode)
        self.noise = 0.1 if mode else 0.0
        return self

    def forward(self, x):
        return x + self.noise * torch.randn_like(x)


class NoisyMLP(UserMLP):
    def __init__(self, val):
        super().__init__()
        self.augment, self.val, self.seen = NoisyInTraining(), val, []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, self.augment.training, self.augment.noise))
        return nn.functional.cross_entropy(self(self.augment(batch[0])), batch[1])

    def val_dataloader(self):
        return self.val


def test_fine_tuning_runs_with_what_train_mode_sets_after_the_compressions_evaluation(tmp_path):
    train, val = make_data()
    model = NoisyMLP(val)
    callback = compression(modules=["net.0", "net.2"], at_epoch=0)
    # no validation loop (Lightning's own restores flags only): the compression's evaluation is the only eval()
    make_tiny_trainer(tmp_path, max_epochs=2, limit_val_batches=0, callbacks=[callback]).fit(model, train)
    assert callback.done and callback.metric_after is not None  # evaluated on the model's val_dataloader
    assert {epoch for epoch, _, _ in model.seen} == {0, 1}
    assert all(training and noise == 0.1 for _, training, noise in model.seen), model.seen
