"""Data for online recurrent training: chunks of parallel, endless streams, delivered in time order.

Online training (UORO, RTRL, truncated BPTT) carries a recurrent
state from one batch to the next, so a batch is not a set of independent sequences but a *chunk*: the next ``T``
time steps of ``B`` parallel, independent streams. Batch ``k`` continues exactly where batch ``k - 1`` stopped.
Nothing may shuffle, drop or reorder chunks, and every process of a distributed run must carry its own streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_ortho._lightning import pl

#: The splits a stream data module serves. Each has its own streams: validation and test never see training data.
SPLITS = ("train", "val", "test")
_SPLIT_KEYS = {"train": 0, "val": 1, "test": 2}
#: The losses a model may be asked to use (``StreamDataModule.loss``).
LOSSES = ("cross_entropy", "mse")

_WORKERS_REFUSED = (
    "chunks must reach the model in time order and the stream position must be saved in checkpoints; DataLoader "
    "worker processes would each run their own copy of the stream (duplicated or interleaved chunks) and their "
    "position would never reach the data module. Chunks are cheap to make in the main process: use num_workers=0."
)


def check_positive_int(owner: str, name: str, value: object, hint: str = "") -> int:
    """``value`` as an ``int`` when it is a positive integer (``bool`` excluded).

    Raises:
        ValueError: it is not; the message names ``owner`` and ``name`` and adds ``hint``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}.{(' ' + hint) if hint else ''}")
    return int(value)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Steele, Lea & Flood 2014): a bijection of uint64 with full avalanche."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def counter_random(*keys: Any) -> np.ndarray:
    """64 random bits (``uint64``) per element: a fixed function of non-negative integer keys, broadcast together.

    ``counter_random(seed, split, stream[:, None], time[None, :])`` gives every (stream, time) its own random
    number, computed directly from the indices: any chunk of any stream can be made on its own, in any process,
    in one vectorised pass, and the numbers never change with the library versions (pure integer arithmetic, no
    generator state). Keys are hashed one after another with SplitMix64's mixing function.
    """
    with np.errstate(over="ignore"):
        state = np.zeros((), dtype=np.uint64)
        for key in keys:
            state = _mix64(state ^ np.asarray(key, dtype=np.int64).astype(np.uint64))
    return np.asarray(state, dtype=np.uint64)


def split_key(split: str) -> int:
    """The integer that keys a split's random numbers (``train`` 0, ``val`` 1, ``test`` 2).

    Raises:
        ValueError: ``split`` is not ``"train"``, ``"val"`` or ``"test"``.
    """
    if split not in _SPLIT_KEYS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    return _SPLIT_KEYS[split]


def _refuse_worker_processes() -> None:
    if get_worker_info() is not None:
        raise RuntimeError(f"A stream data set was iterated in a DataLoader worker process: {_WORKERS_REFUSED}")


class TrainingChunks(IterableDataset):
    """The training chunks of one process: ``chunks_per_epoch`` chunks from the data module's ``next_chunk`` on.

    Iterating makes chunk ``k = module.next_chunk`` for this process's ``streams``, advances ``next_chunk`` to
    ``k + 1`` and yields the chunk, so the position always names the first chunk not yet handed out. ``len`` is
    ``chunks_per_epoch``: Lightning then knows the epoch length and fetches each chunk only when the model asks for
    it (no prefetching), so the position in a checkpoint is exactly the next chunk the model has not seen.
    """

    def __init__(self, module: StreamDataModule, streams: torch.Tensor) -> None:
        self.module, self.streams = module, streams

    def __len__(self) -> int:
        return self.module.chunks_per_epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        _refuse_worker_processes()
        for _ in range(len(self)):
            chunk = self.module.next_chunk
            batch = self.module.batch("train", chunk, self.streams)
            self.module.next_chunk = chunk + 1
            yield batch


class ValidationChunks(IterableDataset):
    """Chunks ``0 .. val_chunks - 1`` of this process's ``streams`` of ``split`` (``"val"``, or ``"test"``: held-out
    streams of their own), the same on every pass."""

    def __init__(self, module: StreamDataModule, streams: torch.Tensor, split: str = "val") -> None:
        self.module, self.streams, self.split = module, streams, split

    def __len__(self) -> int:
        return self.module.val_chunks

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        _refuse_worker_processes()
        for chunk in range(len(self)):
            yield self.module.batch(self.split, chunk, self.streams)


class StreamLoader(DataLoader):
    """A ``DataLoader(dataset, batch_size=None, num_workers=0)`` over whole chunks, in order.

    ``batch_size=None`` passes each chunk through as it is made (it already is a batch). Lightning never wraps an
    ``IterableDataset`` in a (shuffling, distributed) sampler. The loader is stateful (``state_dict`` /
    ``load_state_dict`` forward to the training position), so Lightning treats it as resumable and restores the
    position also when the loader is passed to ``Trainer.fit`` directly instead of through the data module.
    """

    def __init__(self, dataset: TrainingChunks | ValidationChunks, **lightning_arguments: Any) -> None:
        # Lightning re-creates every predict loader with the loader's attributes (and sampler=None,
        # batch_sampler=None): what it passes here is what this loader fixed, so it is not read.
        super().__init__(dataset, batch_size=None, num_workers=0)

    def state_dict(self) -> dict[str, int]:
        dataset = self.dataset
        return {"next_chunk": dataset.module.next_chunk} if isinstance(dataset, TrainingChunks) else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dataset = self.dataset
        if isinstance(dataset, TrainingChunks) and "next_chunk" in state_dict:
            dataset.module.next_chunk = _checked_position(type(dataset.module).__name__, state_dict["next_chunk"])


def _checked_position(owner: str, value: object) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"{owner}: the saved stream position next_chunk must be a non-negative integer, got {value!r}."
        )
    return int(value)


class StreamDataModule(pl.LightningDataModule):
    """Base of the data modules for online recurrent training: ``B`` endless streams served as ordered chunks.

    **Batches** are dicts (the batch contract every online model relies on), for ``b`` streams of this process
    (``b = B / world_size`` in training) and ``T = chunk_length`` steps:

    * ``"x"``: float32 ``(b, T, input_size)``, the inputs;
    * ``"y"``: the targets: int64 ``(b, T)`` class indices, or float32 ``(b, T, output_size)``: a probability
      distribution over ``output_size`` classes (soft cross-entropy) when ``loss == "cross_entropy"``, real
      targets when ``loss == "mse"``;
    * ``"mask"``: bool ``(b, T)``, the steps where the loss counts;
    * ``"reset"``: bool ``(b,)``, the streams that (re)start at the first step of this chunk: the model resets
      their recurrent state (and estimator state) *before* the chunk;
    * ``"chunk"``: int64 scalar tensor, the index of this chunk in its stream (0, 1, 2, ... continuing across
      epochs in training; 0 .. ``val_chunks - 1`` in every validation pass), so a model can check the order. It
      stays on the CPU when Lightning moves the batch to the model's device (:meth:`transfer_batch_to_device`), so
      reading it waits for nothing queued on an accelerator.

    **Order is enforced**: ``train_dataloader`` is a :class:`StreamLoader` over :class:`TrainingChunks`, an
    ``IterableDataset`` that yields whole chunks in time order; there is no sampler to shuffle and no worker
    process (``num_workers`` must be 0). An epoch is ``chunks_per_epoch`` chunks; the stream goes on across
    epochs, and across ``fit`` calls on the same data module.

    **Determinism**: a chunk is a function of (``seed``, split, stream index, chunk index) only, made on demand.
    ``state_dict()`` is ``{"next_chunk": k}`` (Lightning stores it in checkpoints and restores it on resume), so a
    resumed run continues with exactly the chunks an uninterrupted one would have seen.

    **Distributed training**: with ``world_size`` ``W`` and ``global_rank`` ``r`` (read from the attached
    ``Trainer``; 0 and 1 without one), a process takes the streams ``r::W`` of the ``B = streams`` training streams
    (and of the ``val_streams`` validation streams). Stream ``j`` is the same whichever process carries it, so ``W``
    processes together see exactly the streams one process would see, and DDP's gradient average over the ranks
    equals the single-process average over all ``B`` streams.

    **Validation** uses ``val_streams`` fixed, held-out streams (their own random numbers, or held-out text), in
    the same format; each pass runs chunks ``0 .. val_chunks - 1``, chunk 0 with ``reset`` true everywhere: the
    model runs them from a fresh state and does not learn. **Test** and **predict** read the ``"test"`` split the
    same way: ``val_streams`` streams of ``val_chunks`` chunks with random numbers of their own (a subclass whose
    data has no third part says what it reads instead: the text module reads its validation text).

    Subclasses set ``input_size``, ``output_size`` and ``loss`` (class attributes or instance attributes) and
    implement :meth:`make_chunk`.

    Args:
        streams: ``B``, the number of parallel training streams over all processes (divisible by the world size).
        chunk_length: ``T``, time steps per chunk.
        chunks_per_epoch: chunks per training epoch.
        val_streams: validation streams over all processes (divisible by the world size).
        val_chunks: chunks per validation pass.
        seed: seed of the data (a non-negative integer); the same in every process.
        num_workers: must be 0 (offered only to say why: chunks must stay in order and their position must reach
            the checkpoint; see :class:`TrainingChunks`).

    Raises:
        ValueError: a size is not a positive integer, ``seed`` is negative, or ``num_workers`` is not 0; when the
            loaders are made: ``streams`` or ``val_streams`` is not divisible by the world size.
    """

    input_size: int
    output_size: int
    loss: str

    def __init__(
        self,
        streams: int = 32,
        chunk_length: int = 32,
        chunks_per_epoch: int = 100,
        val_streams: int = 8,
        val_chunks: int = 8,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.streams = check_positive_int(owner, "streams", streams, "It is the number of parallel streams B.")
        self.chunk_length = check_positive_int(owner, "chunk_length", chunk_length, "It is the chunk length T.")
        self.chunks_per_epoch = check_positive_int(owner, "chunks_per_epoch", chunks_per_epoch)
        self.val_streams = check_positive_int(
            owner, "val_streams", val_streams, "To skip validation, set the Trainer's limit_val_batches=0."
        )
        self.val_chunks = check_positive_int(
            owner, "val_chunks", val_chunks, "To skip validation, set the Trainer's limit_val_batches=0."
        )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"{owner}: seed must be a non-negative integer, got {seed!r}.")
        self.seed = int(seed)
        if num_workers != 0:
            raise ValueError(f"{owner}: num_workers must be 0, got {num_workers!r}: {_WORKERS_REFUSED}")
        self.num_workers = 0
        #: The first training chunk not yet handed out (the stream position; saved in checkpoints).
        self.next_chunk = 0

    # ----------------------------------------------------------------------------------------------------------
    # What a subclass provides

    def make_chunk(self, split: str, streams: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
        """Chunk ``chunk`` of the given streams: ``{"x", "y", "mask", "reset"}`` as in the class docstring.

        ``streams`` is an int64 ``(b,)`` tensor of global stream indices (``0 .. streams - 1`` or
        ``0 .. val_streams - 1``); ``split`` is ``"train"``, ``"val"`` or ``"test"``. The result must depend on
        nothing but ``(self.seed, split, stream, chunk)`` and the constructor arguments.

        Raises:
            NotImplementedError: the subclass does not provide it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement make_chunk(split, streams, chunk).")

    # ----------------------------------------------------------------------------------------------------------
    # Chunks, streams and processes

    def num_streams(self, split: str) -> int:
        """Streams of a split over all processes: ``streams`` (train) or ``val_streams`` (val, test).

        Raises:
            ValueError: unknown ``split``.
        """
        split_key(split)
        return self.streams if split == "train" else self.val_streams

    def batch(self, split: str, chunk: int, streams: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Chunk ``chunk`` of a split for the given global stream indices (all of the split's streams by default).

        Returns the batch dict of the class docstring; ``batch(split, k)["x"][r::W]`` is what rank ``r`` of ``W``
        gets for chunk ``k``.

        Raises:
            ValueError: unknown ``split``, a negative ``chunk``, or a stream index outside the split.
        """
        count = self.num_streams(split)
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 0:
            raise ValueError(f"{type(self).__name__}: chunk must be a non-negative integer, got {chunk!r}.")
        streams = torch.arange(count) if streams is None else torch.as_tensor(streams, dtype=torch.long)
        if streams.ndim != 1 or (streams.numel() and (int(streams.min()) < 0 or int(streams.max()) >= count)):
            raise ValueError(
                f"{type(self).__name__}: streams must be a 1-d tensor of indices in 0..{count - 1} for split "
                f"{split!r}, got {streams.tolist()}."
            )
        batch = self.make_chunk(split, streams, int(chunk))
        batch["chunk"] = torch.tensor(int(chunk), dtype=torch.long)
        return batch

    def rank_and_world_size(self) -> tuple[int, int]:
        """``(global_rank, world_size)`` of the attached Trainer, or ``(0, 1)`` without one."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def process_streams(self, split: str) -> torch.Tensor:
        """The global indices ``r::W`` of the streams of ``split`` that this process carries (int64 ``(B / W,)``).

        Raises:
            ValueError: the split's stream count is not divisible by the world size; the message says what to set.
        """
        count = self.num_streams(split)
        rank, world = self.rank_and_world_size()
        if count % world:
            name = "streams" if split == "train" else "val_streams"  # test reads val_streams streams too
            raise ValueError(
                f"{type(self).__name__}: {name}={count} is not divisible by the world size {world}; every process "
                f"must carry the same number of streams. Set {name} to a multiple of {world} "
                f"(e.g. {name}={max(world, count - count % world)})."
            )
        return torch.arange(count)[rank::world]

    # ----------------------------------------------------------------------------------------------------------
    # Lightning hooks

    def train_dataloader(self) -> StreamLoader:
        """Chunks ``next_chunk, next_chunk + 1, ...`` (``chunks_per_epoch`` of them) of this process's streams."""
        return StreamLoader(TrainingChunks(self, self.process_streams("train")))

    def val_dataloader(self) -> StreamLoader:
        """Chunks ``0 .. val_chunks - 1`` of this process's validation streams (the same every pass)."""
        return StreamLoader(ValidationChunks(self, self.process_streams("val")))

    def test_dataloader(self) -> StreamLoader:
        """Chunks ``0 .. val_chunks - 1`` of this process's test streams (``val_streams`` of them, held out)."""
        return StreamLoader(ValidationChunks(self, self.process_streams("test"), "test"))

    def predict_dataloader(self) -> StreamLoader:
        """The test chunks (what ``lightning-ortho predict`` and ``Trainer.predict`` read)."""
        return self.test_dataloader()

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move the batch to ``device`` as Lightning does, but for ``batch["chunk"]``, which stays on the CPU: the
        model reads the index to check the order of the chunks, and a read of an accelerator's tensor would wait for
        all the work queued there (one stall per chunk)."""
        if not isinstance(batch, dict) or "chunk" not in batch:
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        moved = super().transfer_batch_to_device(
            {key: value for key, value in batch.items() if key != "chunk"}, device, dataloader_idx
        )
        return {**moved, "chunk": batch["chunk"]}

    def state_dict(self) -> dict[str, Any]:
        """``{"next_chunk": k}``: the first training chunk not yet handed to the model."""
        return {"next_chunk": self.next_chunk}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training stream at the saved position (a state without ``next_chunk`` changes nothing).

        Raises:
            ValueError: the saved ``next_chunk`` is not a non-negative integer.
        """
        if "next_chunk" in state_dict:
            self.next_chunk = _checked_position(type(self).__name__, state_dict["next_chunk"])
