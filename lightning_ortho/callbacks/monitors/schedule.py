"""When a monitor measures (one rule for every monitor, whatever the batches hold): at the end of the first training
batch at or past each multiple of ``every_n_steps`` optimizer steps (``global_step``; a multiple crossed inside a
batch, as under manual optimisation with several steps a batch, is measured at that batch's end; a batch that takes
no step, as under gradient accumulation, crosses none), and at the end of the last batch of the fit however the fit
ends (except GradientNoiseMonitor, which reads complete windows of gradients only); never before the fit's first
optimizer step."""

from __future__ import annotations

from lightning_ortho._lightning import pl


def crossed_a_multiple(before: int, step: int, every_n_steps: int) -> bool:
    """Whether the optimizer steps of a batch, from ``global_step == before`` at its start to ``step`` at its end,
    reached or passed a multiple of ``every_n_steps``."""
    return step // every_n_steps > before // every_n_steps


def last_batch_of_fit(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether the training batch ``batch_idx`` that just ended is the last one of the fit (its last epoch's last
    batch, or the batch that reaches ``max_steps``).

    A loader without a length (an ``IterableDataset`` without ``__len__``) has ``num_training_batches = inf``; there
    the loop's own ``is_last_batch`` (its data fetcher looks one batch ahead) tells the last batch of an epoch."""
    epoch_loop = trainer.fit_loop.epoch_loop
    last_of_epoch = batch_idx + 1 == trainer.num_training_batches or bool(epoch_loop.batch_progress.is_last_batch)
    max_epochs = trainer.max_epochs
    return (last_of_epoch and max_epochs is not None and trainer.current_epoch + 1 == max_epochs) or (
        trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
    )
