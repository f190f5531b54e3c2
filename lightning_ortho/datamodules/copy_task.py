"""The copy task as an endless stream of episodes, for online recurrent training."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lightning_ortho.datamodules.streams import StreamDataModule, check_positive_int, counter_random, split_key


class CopyTaskDataModule(StreamDataModule):
    """Copy task (Hochreiter & Schmidhuber 1997; Arjovsky et al. 2016) as endless streams of episodes.

    An episode of ``L = 2 * length + delay + 1`` steps: ``length`` random symbols (uniform over ``symbols``
    symbols), ``delay`` blank steps, one "go" marker, then ``length`` blank steps during which the model must
    output the presented symbols in order. The symbol presented at episode step ``i`` is the target at step
    ``i + length + delay + 1``.

    * Inputs: one-hot over ``input_size = symbols + 2`` (symbols ``0 .. symbols - 1``, blank ``symbols``, go
      marker ``symbols + 1``); float32 ``(b, T, symbols + 2)``.
    * Targets: int64 ``(b, T)`` class indices over ``output_size = symbols + 1`` classes (the symbols, and blank
      ``symbols`` outside the recall phase); ``loss = "cross_entropy"``.
    * ``mask`` is true only in the recall phase (``length`` steps of every ``L``).

    With ``reset_between_episodes=False`` (default) episodes follow each other back to back and a stream never
    restarts after its first chunk: the model must learn to clear its own memory. With ``True``, every episode
    starts at a chunk boundary with ``reset`` true (the model's state is reset before it): an episode fills
    ``ceil(L / chunk_length)`` chunks, the steps after its end are padding (blank input, blank target, mask
    false); ``chunk_length = L`` wastes nothing.

    **Chance level** (per masked step, natural log): a model without memory of the presented symbols can do no
    better than the uniform distribution over the symbols, ``ln(symbols)`` nats (2.079 for 8 symbols; ``chance_loss``);
    a perfect copy reaches 0.

    The symbol at step ``i`` of episode ``e`` of stream ``j`` is a fixed function of ``(seed, split, j, e, i)``.

    Args:
        symbols: number of distinct symbols (at least 2).
        length: symbols presented per episode.
        delay: blank steps between the presentation and the go marker (0 allowed).
        reset_between_episodes: align episodes to chunks and reset the state before each (see above).
        streams: ``B``, the parallel training streams over all processes (divisible by the world size; see
            :class:`~lightning_ortho.datamodules.StreamDataModule`).
        chunk_length: ``T``, time steps per chunk.
        chunks_per_epoch: chunks per training epoch.
        val_streams: validation streams over all processes (divisible by the world size).
        val_chunks: chunks per validation pass.
        seed: seed of the data (a non-negative integer), the same in every process.
        num_workers: must be 0 (chunks must stay in order; see :class:`~lightning_ortho.datamodules.StreamDataModule`).

    Raises:
        ValueError: ``symbols < 2``, ``length`` not a positive integer, ``delay`` negative, or a base argument is
            invalid (see :class:`~lightning_ortho.datamodules.StreamDataModule`).
    """

    loss = "cross_entropy"

    def __init__(
        self,
        symbols: int = 8,
        length: int = 5,
        delay: int = 10,
        reset_between_episodes: bool = False,
        streams: int = 32,
        chunk_length: int = 32,
        chunks_per_epoch: int = 100,
        val_streams: int = 8,
        val_chunks: int = 8,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(streams, chunk_length, chunks_per_epoch, val_streams, val_chunks, seed, num_workers)
        owner = type(self).__name__
        if check_positive_int(owner, "symbols", symbols) < 2:
            raise ValueError(
                f"{owner}: symbols must be at least 2 (one symbol leaves nothing to remember), got {symbols}."
            )
        self.symbols = int(symbols)
        self.length = check_positive_int(owner, "length", length, "It is the number of symbols to remember.")
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(
                f"{owner}: delay must be a non-negative integer (blank steps before the go marker), got {delay!r}."
            )
        self.delay = int(delay)
        self.reset_between_episodes = bool(reset_between_episodes)
        self.input_size = self.symbols + 2
        self.output_size = self.symbols + 1
        self.save_hyperparameters()

    @property
    def blank(self) -> int:
        """Index of the blank input and of the blank target class (``symbols``)."""
        return self.symbols

    @property
    def go(self) -> int:
        """Index of the go marker in the inputs (``symbols + 1``)."""
        return self.symbols + 1

    @property
    def episode_length(self) -> int:
        """``L = 2 * length + delay + 1`` steps."""
        return 2 * self.length + self.delay + 1

    @property
    def recall_lag(self) -> int:
        """Steps between a symbol's presentation and its recall: ``length + delay + 1``."""
        return self.length + self.delay + 1

    @property
    def chance_loss(self) -> float:
        """``ln(symbols)``: the cross-entropy per masked step without memory of the symbols (nats)."""
        return math.log(self.symbols)

    def make_chunk(self, split: str, streams: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
        """Chunk ``chunk`` of the given streams' episodes, as
        :meth:`StreamDataModule.make_chunk <lightning_ortho.datamodules.StreamDataModule.make_chunk>`.

        ``x`` float32 one-hot ``(b, T, symbols + 2)``; ``y`` int64 ``(b, T)`` (the symbol to recall, blank
        elsewhere); ``mask`` true in the recall phase; ``reset`` true at chunk 0, and at the first chunk of
        every episode with ``reset_between_episodes``.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"`` (each has symbols of its own).
            streams: int64 ``(b,)`` global stream indices.
            chunk: the chunk index.
        """
        T, L = self.chunk_length, self.episode_length
        steps = torch.arange(T)
        if self.reset_between_episodes:
            per_episode = math.ceil(L / T)
            episode = torch.full((T,), chunk // per_episode, dtype=torch.long)
            phase = (chunk % per_episode) * T + steps
            reset = chunk % per_episode == 0
        else:
            time = chunk * T + steps
            episode, phase = time // L, time % L
            reset = chunk == 0
        recall = (phase >= self.recall_lag) & (phase < L)
        presented = phase < self.length
        # The symbol index within the episode that each step shows (presentation) or asks for (recall).
        position = torch.where(recall, phase - self.recall_lag, phase).clamp(0, self.length - 1)
        bits = counter_random(self.seed, split_key(split), streams.numpy()[:, None], episode.numpy(), position.numpy())
        symbol = torch.from_numpy((bits % self.symbols).astype("int64")).reshape(len(streams), T)
        blank = torch.full_like(symbol, self.blank)
        inputs = torch.where(presented, symbol, blank)
        inputs = torch.where(phase == self.length + self.delay, torch.full_like(symbol, self.go), inputs)
        return {
            "x": F.one_hot(inputs, self.input_size).float(),
            "y": torch.where(recall, symbol, blank),
            "mask": recall.expand(len(streams), T).clone(),
            "reset": torch.full((len(streams),), bool(reset)),
        }
