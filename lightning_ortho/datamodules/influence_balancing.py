"""The influence-balancing task of Tallec & Ollivier (2017), as streams for online recurrent training."""

from __future__ import annotations

import torch

from lightning_ortho.datamodules.streams import StreamDataModule


class InfluenceBalancingDataModule(StreamDataModule):
    """Influence balancing (Tallec & Ollivier 2017, "Unbiased Online Recurrent Optimization", the UORO paper).

    The difficulty is in the model, not in the data: a fixed linear recurrence of ``n = 23`` units,
    ``s_{t+1} = A s_t + (theta, ..., theta, -theta, ..., -theta)``, with ``A = 0.5 (I + superdiagonal)`` (each unit
    keeps half of itself and receives half of the next one), a single scalar parameter ``theta`` entering
    ``p = 10`` units positively and the others negatively; the loss asks the first unit to reach 1. An input that
    enters unit ``k`` reaches the first unit only after ``k - 1`` steps, so a truncated gradient (truncated BPTT
    with a short truncation) sees only the nearby, positive influences of ``theta``, overshoots and diverges,
    while the exact gradient (RTRL, or UORO in expectation) balances the delayed negative ones and converges.
    The cell itself lives with the online estimators (``lightning_ortho.online``); this module only feeds it.

    Batches: ``x`` float32 zeros ``(b, T, 1)`` (the recurrence has no input); ``y`` float32 ones ``(b, T, 1)``
    (the target of the first unit); ``mask`` all true; ``reset`` true at chunk 0 only; ``loss = "mse"``. Every
    stream, training, validation or test, is the same: the task is deterministic and ``seed`` changes nothing.

    Args:
        streams: ``B``, the parallel training streams over all processes (divisible by the world size; see
            :class:`~lightning_ortho.datamodules.StreamDataModule`).
        chunk_length: ``T``, time steps per chunk.
        chunks_per_epoch: chunks per training epoch.
        val_streams: validation streams over all processes (divisible by the world size).
        val_chunks: chunks per validation pass.
        seed: changes nothing (the task is deterministic; accepted for a uniform interface).
        num_workers: must be 0 (chunks must stay in order; see :class:`~lightning_ortho.datamodules.StreamDataModule`).

    Raises:
        ValueError: a base argument is invalid.
    """

    input_size = 1
    output_size = 1
    loss = "mse"

    def __init__(
        self,
        streams: int = 1,
        chunk_length: int = 10,
        chunks_per_epoch: int = 100,
        val_streams: int = 1,
        val_chunks: int = 10,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(streams, chunk_length, chunks_per_epoch, val_streams, val_chunks, seed, num_workers)
        self.save_hyperparameters()

    def make_chunk(self, split: str, streams: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
        """The same chunk for every split, stream and index but ``reset``, as
        :meth:`StreamDataModule.make_chunk <lightning_ortho.datamodules.StreamDataModule.make_chunk>`.

        ``x`` float32 zeros ``(b, T, 1)``; ``y`` float32 ones ``(b, T, 1)``; ``mask`` all true; ``reset`` true at
        chunk 0 only.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"`` (the same data).
            streams: int64 ``(b,)`` global stream indices (only their number matters).
            chunk: the chunk index.
        """
        b, T = len(streams), self.chunk_length
        return {
            "x": torch.zeros(b, T, 1),
            "y": torch.ones(b, T, 1),
            "mask": torch.ones(b, T, dtype=torch.bool),
            "reset": torch.full((b,), chunk == 0),
        }
