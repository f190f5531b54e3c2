import pytest
import torch

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import DigitsDataModule, SequentialImageDataModule
from lightning_ortho.models import OrthogonalRNNClassifier


def test_two_optimizers_split_the_transition_from_the_rest():
    model = OrthogonalRNNClassifier(in_features=1, hidden_size=12, transition="cayley", optimizer="rmsprop")
    transition_opt, rest_opt = model.configure_optimizers().optimizers
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
    """Records the gradient norm each member optimizer steps with (after clipping), and the optimizer steps."""

    def __init__(self):
        self.norms = []
        self.steps = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps += 1

    def on_train_start(self, trainer, pl_module):
        for member in trainer.optimizers[0].optimizers:
            member.step = self._recording(member, member.step)

    def _recording(self, member, step):
        def recorded(*args, **kwargs):
            grads = [p.grad for g in member.param_groups for p in g["params"] if p.grad is not None]
            self.norms.append(
                float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            )
            return step(*args, **kwargs)

        return recorded


@pytest.mark.parametrize("transition", ["aux", "householder"])
def test_training_learns_and_clips(transition, tiny_trainer):
    pl.seed_everything(0)
    dm = SequentialImageDataModule(DigitsDataModule(flatten=False, batch_size=32), mode="row")
    model = OrthogonalRNNClassifier(in_features=8, hidden_size=32, transition=transition, gradient_clip_val=0.05)
    norms = GradientNorms()
    trainer = tiny_trainer(max_epochs=2, callbacks=[norms])
    trainer.fit(model, dm)
    assert float(trainer.callback_metrics["val_acc"]) > 0.5  # chance is 0.1
    assert norms.steps == 2 * len(dm.train_dataloader())  # one optimizer step per batch ...
    assert len(norms.norms) == 2 * norms.steps  # ... stepping both optimizers
    assert max(norms.norms) <= 0.05 + 1e-5  # clipped per optimizer


def test_max_steps_counts_batches_and_old_two_optimizer_checkpoints_resume(tiny_trainer, tmp_path):
    # Issue 9.10: two Lightning optimizers made max_steps=4 train 2 batches and name the checkpoint step=4.

    pl.seed_everything(0)
    dm = SequentialImageDataModule(DigitsDataModule(flatten=False, batch_size=16), mode="row")
    model = OrthogonalRNNClassifier(in_features=8, hidden_size=12)
    seen = []
    model.on_train_batch_start = lambda batch, batch_idx: seen.append(batch_idx)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=False)
    trainer = tiny_trainer(max_steps=4, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(model, dm)
    assert seen == [0, 1, 2, 3] and trainer.global_step == 4
    assert [p.name for p in (tmp_path / "ckpt").glob("*.ckpt")] == ["epoch=0-step=4.ckpt"]

    # A checkpoint of version 0.1 held the two optimizers' states side by side; it still resumes.
    saved = torch.load(next((tmp_path / "ckpt").glob("*.ckpt")), weights_only=False)
    saved["optimizer_states"] = saved["optimizer_states"][0]["optimizers"]
    torch.save(saved, tmp_path / "old.ckpt")
    resumed = OrthogonalRNNClassifier(in_features=8, hidden_size=12)
    second = tiny_trainer(max_steps=5)
    second.fit(resumed, dm, ckpt_path=tmp_path / "old.ckpt")
    adam = second.optimizers[0].optimizers[0]
    assert second.global_step == 5 and all(int(state["step"]) == 5 for state in adam.state.values())  # 4 loaded + 1
