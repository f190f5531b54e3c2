import pytest
import pytorch_lightning as pl
import torch

from lightning_ortho.datamodules import DigitsDataModule, SequentialImageDataModule
from lightning_ortho.models import OrthogonalRNNClassifier


def test_two_optimizers_split_the_transition_from_the_rest():
    model = OrthogonalRNNClassifier(in_features=1, hidden_size=12, transition="cayley", optimizer="rmsprop")
    transition_opt, rest_opt = model.configure_optimizers()
    assert isinstance(transition_opt, torch.optim.Adam) and isinstance(rest_opt, torch.optim.RMSprop)
    transition = {id(p) for p in model.rnn.cell.transition.parameters()}
    assert {id(p) for g in transition_opt.param_groups for p in g["params"]} == transition
    rest = {id(p) for g in rest_opt.param_groups for p in g["params"]}
    assert not rest & transition and len(rest) + len(transition) == len(list(model.parameters()))
    assert transition_opt.param_groups[0]["lr"] == model.hparams.transition_lr
    with pytest.raises(ValueError, match="optimizer"):
        OrthogonalRNNClassifier(optimizer="sgd")


def test_forward_shapes_and_hidden_default():
    model = OrthogonalRNNClassifier(in_features=3)
    assert model.rnn.hidden_size == 170
    assert model(torch.randn(4, 9, 3)).shape == (4, 10)


class GradientNorms(pl.Callback):
    """Records the gradient norm of each optimizer's parameters right before it steps."""

    def __init__(self):
        self.norms = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))


@pytest.mark.parametrize("transition", ["aux", "householder"])
def test_training_learns_and_clips(transition, tiny_trainer):
    pl.seed_everything(0)
    dm = SequentialImageDataModule(DigitsDataModule(flatten=False, batch_size=32), mode="row")
    model = OrthogonalRNNClassifier(in_features=8, hidden_size=32, transition=transition, gradient_clip_val=0.05)
    norms = GradientNorms()
    trainer = tiny_trainer(max_epochs=2, callbacks=[norms])
    trainer.fit(model, dm)
    assert float(trainer.callback_metrics["val_acc"]) > 0.5  # chance is 0.1
    assert len(norms.norms) == 2 * 2 * len(dm.train_dataloader())  # two optimizers step on every batch
    assert max(norms.norms) <= 0.05 + 1e-5  # clipped per optimizer
