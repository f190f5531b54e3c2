"""The "Add" task of Marschall, Cho & Savin (2020) as endless streams, for online recurrent training."""

from __future__ import annotations

import math

import torch

from lightning_ortho.datamodules.streams import StreamDataModule, check_positive_int, counter_random, split_key


def _binary_entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log(p) + (1 - p) * math.log(1 - p))


class AddingTaskDataModule(StreamDataModule):
    """The "Add" task of Marschall, Cho & Savin (2020, "A unified framework of online learning algorithms for
    training recurrent neural networks", JMLR 21), after Pitis (2016): one endless stream of random bits per stream.

    Input ``x_t ~ Bernoulli(0.5)`` i.i.d., float32 ``(b, T, 1)``. Target: the probability

        ``y_t = 0.5 + 0.5 x_{t - t1} - 0.25 x_{t - t2}``

    given as the 2-way distribution ``(y_t, 1 - y_t)``: float32 ``(b, T, 2)``, trained with soft cross-entropy
    ``-sum_k y_k log softmax(o_t)_k`` (``loss = "cross_entropy"``, ``output_size = 2``). ``mask`` is false for
    the first ``max(t1, t2)`` steps of a stream (their lagged inputs lie before its start); a stream never restarts
    after its first chunk. The bit at step ``t`` of stream ``j`` is a fixed function of ``(seed, split, j, t)``.

    Defaults ``t1 = 5, t2 = 9`` (not confirmed from the paper's text, which was not available here; the authors'
    code, ``omarschall/vanilla-rtrl`` ``gen_data.py``, takes both lags as arguments). Unlike that code, which also
    feeds the redundant complement ``1 - x_t``, the input here is the single bit.

    **Loss floors** (per masked step, nats; :meth:`loss_floors`, closed form):

    * ``constant``: the best prediction that ignores the inputs, ``h(E y) = h(0.625) = 0.6616``;
    * ``lag_t1_only``: the best prediction from ``x_{t - t1}`` alone, ``E h(E[y | x_{t-t1}]) =
      (h(0.375) + h(0.875)) / 2 = 0.5192``;
    * ``target_entropy``: the perfect prediction (both lags), ``E h(y_t) = (h(0.5) + h(1) + 2 h(0.25)) / 4 =
      0.4545``; the cross-entropy can never go below it.

    (``h`` is the binary entropy in nats; values for ``t1 != t2``.) Cross-entropy against a fixed target is linear
    in the target, so each floor is the entropy of the best prediction given that information.

    Args:
        t1: the first lag, in time steps (a positive integer).
        t2: the second lag, in time steps (a positive integer).
        streams: ``B``, the parallel training streams over all processes (divisible by the world size; see
            :class:`~lightning_ortho.datamodules.StreamDataModule`).
        chunk_length: ``T``, time steps per chunk.
        chunks_per_epoch: chunks per training epoch.
        val_streams: validation streams over all processes (divisible by the world size).
        val_chunks: chunks per validation pass.
        seed: seed of the data (a non-negative integer), the same in every process.
        num_workers: must be 0 (chunks must stay in order; see :class:`~lightning_ortho.datamodules.StreamDataModule`).

    Raises:
        ValueError: a lag is not a positive integer, or a base argument is invalid.
    """

    input_size = 1
    output_size = 2
    loss = "cross_entropy"

    def __init__(
        self,
        t1: int = 5,
        t2: int = 9,
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
        self.t1 = check_positive_int(owner, "t1", t1, "It is the first lag, in time steps.")
        self.t2 = check_positive_int(owner, "t2", t2, "It is the second lag, in time steps.")
        self.save_hyperparameters()

    @property
    def warmup(self) -> int:
        """``max(t1, t2)``: the steps at the start of a stream whose targets are masked."""
        return max(self.t1, self.t2)

    def target(self, x_t1: torch.Tensor, x_t2: torch.Tensor) -> torch.Tensor:
        """``0.5 + 0.5 x_{t-t1} - 0.25 x_{t-t2}``: the probability of the first class (shape of the inputs)."""
        return 0.5 + 0.5 * x_t1 - 0.25 * x_t2

    def loss_floors(self) -> dict[str, float]:
        """The cross-entropy floors of the task in nats per masked step (see the class docstring).

        Returns:
            ``{"constant": ..., "lag_t1_only": ..., "target_entropy": ...}``; divide by ``ln 2`` for bits.
        """
        # (x_{t-t1}, x_{t-t2}): four equally likely pairs, or two when the lags coincide.
        pairs = [(a, b) for a in (0, 1) for b in (0, 1) if self.t1 != self.t2 or a == b]
        targets = [float(self.target(torch.tensor(float(a)), torch.tensor(float(b)))) for a, b in pairs]
        by_t1 = {a: [y for (a_, _), y in zip(pairs, targets, strict=True) if a_ == a] for a in (0, 1)}
        return {
            "constant": _binary_entropy(sum(targets) / len(targets)),
            "lag_t1_only": sum(_binary_entropy(sum(ys) / len(ys)) for ys in by_t1.values()) / 2,
            "target_entropy": sum(_binary_entropy(y) for y in targets) / len(targets),
        }

    def bits(self, split: str, streams: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """The input bits of steps ``start .. stop - 1`` of the given streams, float32 ``(b, stop - start)``;
        steps before 0 (before a stream begins) are 0."""
        time = torch.arange(start, stop)
        raw = counter_random(self.seed, split_key(split), streams.numpy()[:, None], time.clamp(min=0).numpy())
        bits = torch.from_numpy((raw >> 63).astype("float32")).reshape(len(streams), len(time))
        return bits * (time >= 0)

    def make_chunk(self, split: str, streams: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
        """Steps ``chunk * T .. (chunk + 1) T - 1`` of the given streams, as
        :meth:`StreamDataModule.make_chunk <lightning_ortho.datamodules.StreamDataModule.make_chunk>`.

        ``x`` float32 ``(b, T, 1)`` the bits; ``y`` float32 ``(b, T, 2)`` the distribution ``(y_t, 1 - y_t)``;
        ``mask`` false on the first ``max(t1, t2)`` steps of each stream; ``reset`` true at chunk 0 only.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"`` (each has bits of its own).
            streams: int64 ``(b,)`` global stream indices.
            chunk: the chunk index.
        """
        T, first = self.chunk_length, chunk * self.chunk_length
        history = self.bits(split, streams, first - self.warmup, first + T)  # (b, warmup + T)
        w = self.warmup
        x = history[:, w:]
        probability = self.target(history[:, w - self.t1 : w - self.t1 + T], history[:, w - self.t2 : w - self.t2 + T])
        time = first + torch.arange(T)
        return {
            "x": x.unsqueeze(-1),
            "y": torch.stack([probability, 1 - probability], dim=-1),
            "mask": (time >= w).expand(len(streams), T).clone(),
            "reset": torch.full((len(streams),), chunk == 0),
        }
