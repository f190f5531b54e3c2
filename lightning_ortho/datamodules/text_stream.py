"""Character-level language modelling on a text read as parallel streams, for online recurrent training."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lightning_ortho._lightning import rank_zero_warn
from lightning_ortho.datamodules.images import DatasetNotFoundError
from lightning_ortho.datamodules.streams import StreamDataModule, check_positive_int


def default_corpus() -> str:
    """The embedded default text: the help topics of the standard library's ``pydoc_data.topics`` (the text of
    ``help("topics")``), the dict's values joined in sorted key order (about 465,000 characters on Python 3.11;
    the text differs between Python versions)."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def read_corpus(path: str | None) -> str:
    """The UTF-8 text at ``path``, or :func:`default_corpus` when ``path`` is ``None``.

    Raises:
        DatasetNotFoundError: ``path`` is not a file (a ``FileNotFoundError``); the message names it.
        ValueError: the file is not valid UTF-8.
    """
    if path is None:
        return default_corpus()
    file = Path(path).expanduser()
    if not file.is_file():
        raise DatasetNotFoundError(
            f"CharacterStreamDataModule: no text file at {str(file)!r}. Give `path` (--data.path) as a UTF-8 text "
            "file, or leave it unset to use the embedded default corpus (the standard library's pydoc_data topics)."
        )
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"CharacterStreamDataModule: {str(file)!r} is not UTF-8 text ({error}).") from error


class CharacterStreamDataModule(StreamDataModule):
    """Next-character prediction on a text split into ``B`` contiguous pieces, one per stream.

    The corpus is :func:`default_corpus` (shipped with Python, no download) or the UTF-8 file at ``path``. Its
    first ``1 - val_fraction`` (90%) is training text, the rest validation text. The vocabulary is the sorted set of
    the characters of the whole corpus (``vocab``; ``input_size = output_size = len(vocab)``).

    Standard language-model streaming: the training text is cut into ``B = streams`` contiguous pieces of
    ``P = len(train_text) // streams`` characters (the remainder is dropped); stream ``j`` reads piece ``j``,
    input ``piece[t]``, target ``piece[t + 1]``, ``P - 1`` steps, in chunks of ``T`` steps. The last chunk of a
    piece is padded (zero input, target 0, ``mask`` false); the stream then starts its piece again with ``reset``
    true. The validation text is cut into ``val_streams`` pieces likewise; test and predict read the same
    pieces (the corpus has no third part).

    * ``x``: float32 one-hot ``(b, T, len(vocab))``; ``y``: int64 ``(b, T)`` next-character indices;
      ``loss = "cross_entropy"``: nats per character; **bits per character = loss / ln 2**.
    * ``chunks_per_epoch=None`` is one pass over the training pieces (``ceil((P - 1) / T)`` chunks);
      ``val_chunks=None`` is one pass over the validation pieces.
    * ``state_dict()`` also holds ``vocab`` and the corpus' SHA-256: resuming with another vocabulary (a model's
      input and output sizes would not match) is refused; with another text of the same vocabulary, a warning.

    The text is read in order: ``seed`` changes nothing (it is accepted for a uniform interface).

    Args:
        path: a UTF-8 text file; ``None`` for the embedded default.
        val_fraction: the share of the corpus (its end) held out for validation, in (0, 1).
        streams: ``B``, the parallel training streams over all processes (divisible by the world size; see
            :class:`~lightning_ortho.datamodules.StreamDataModule`).
        chunk_length: ``T``, time steps per chunk.
        chunks_per_epoch: chunks per training epoch; ``None``: one pass over the training pieces.
        val_streams: validation streams over all processes (divisible by the world size).
        val_chunks: chunks per validation pass; ``None``: one pass over the validation pieces.
        seed: changes nothing (the text is read in order; accepted for a uniform interface).
        num_workers: must be 0 (chunks must stay in order; see :class:`~lightning_ortho.datamodules.StreamDataModule`).

    Raises:
        DatasetNotFoundError: ``path`` is not a file (a ``FileNotFoundError``).
        ValueError: a size is invalid, ``val_fraction`` is outside (0, 1), or a split is too short for its
            streams (fewer than 2 characters per piece; the message says what to reduce).
    """

    loss = "cross_entropy"

    def __init__(
        self,
        path: str | None = None,
        streams: int = 32,
        chunk_length: int = 100,
        chunks_per_epoch: int | None = None,
        val_streams: int = 8,
        val_chunks: int | None = None,
        val_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        owner = type(self).__name__
        if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
            raise ValueError(
                f"{owner}: val_fraction must be in (0, 1) (0.1 holds out the last 10%), got {val_fraction!r}."
            )
        streams = check_positive_int(owner, "streams", streams, "It is the number of parallel streams B.")
        chunk_length = check_positive_int(owner, "chunk_length", chunk_length, "It is the chunk length T.")
        val_streams = check_positive_int(owner, "val_streams", val_streams)
        self.path, self.val_fraction = path, float(val_fraction)
        self.text = read_corpus(path)
        self.vocab = "".join(sorted(set(self.text)))
        self.corpus_sha256 = hashlib.sha256(self.text.encode("utf-8")).hexdigest()
        ids = self.encode(self.text)
        boundary = int(len(ids) * (1 - self.val_fraction))
        self._pieces = {
            "train": _pieces(owner, ids[:boundary], streams, "training", "streams"),
            "val": _pieces(owner, ids[boundary:], val_streams, "validation", "val_streams"),
        }
        self._pieces["test"] = self._pieces["val"]  # the text has two parts: test and predict read the held-out one
        self._cycle = {split: math.ceil((pieces.shape[1] - 1) / chunk_length) for split, pieces in self._pieces.items()}
        super().__init__(
            streams,
            chunk_length,
            self._cycle["train"] if chunks_per_epoch is None else chunks_per_epoch,
            val_streams,
            self._cycle["val"] if val_chunks is None else val_chunks,
            seed,
            num_workers,
        )
        self.input_size = self.output_size = len(self.vocab)
        self.save_hyperparameters()

    def encode(self, text: str) -> torch.Tensor:
        """Indices into ``vocab`` of the characters of ``text``, int64 ``(len(text),)``.

        Raises:
            ValueError: ``text`` has a character outside the vocabulary.
        """
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        table = np.frombuffer(self.vocab.encode("utf-32-le"), dtype=np.uint32)
        index = np.searchsorted(table, codes).clip(max=len(table) - 1)
        if not np.array_equal(table[index], codes):
            unknown = sorted({chr(c) for c in codes[table[index] != codes]})
            raise ValueError(f"{type(self).__name__}: characters outside the vocabulary: {unknown!r}.")
        return torch.from_numpy(index.astype(np.int64))

    def decode(self, ids: torch.Tensor) -> str:
        """The text of a sequence of vocabulary indices (inverse of :meth:`encode`)."""
        return "".join(self.vocab[i] for i in torch.as_tensor(ids).flatten().tolist())

    def piece(self, split: str, stream: int) -> torch.Tensor:
        """The contiguous piece of text (as vocabulary indices, int64 ``(P,)``) that stream ``stream`` reads."""
        return self._pieces[split][stream]

    def chunks_per_cycle(self, split: str) -> int:
        """Chunks in one pass over a piece: ``ceil((P - 1) / T)``; the stream restarts after them."""
        return self._cycle[split]

    def make_chunk(self, split: str, streams: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
        """Chunk ``chunk`` of the given streams' pieces, as
        :meth:`StreamDataModule.make_chunk <lightning_ortho.datamodules.StreamDataModule.make_chunk>`; a stream
        reads its piece over and over, one pass every :meth:`chunks_per_cycle` chunks.

        ``x`` float32 one-hot ``(b, T, len(vocab))`` characters; ``y`` int64 ``(b, T)`` the next characters;
        ``mask`` false on the padding after a piece's last character (where ``x`` is zero and ``y`` is 0);
        ``reset`` true at the first chunk of every pass.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"`` (the validation pieces).
            streams: int64 ``(b,)`` global stream indices.
            chunk: the chunk index.
        """
        pieces, T = self._pieces[split][streams], self.chunk_length
        within = chunk % self._cycle[split]
        position = within * T + torch.arange(T)
        valid = position < pieces.shape[1] - 1
        position = position.clamp(max=pieces.shape[1] - 2)
        x = F.one_hot(pieces[:, position], len(self.vocab)).float() * valid[:, None]
        return {
            "x": x,
            "y": pieces[:, position + 1] * valid,
            "mask": valid.expand(len(streams), T).clone(),
            "reset": torch.full((len(streams),), within == 0),
        }

    def state_dict(self) -> dict[str, Any]:
        """``{"next_chunk", "vocab", "corpus_sha256"}``."""
        return {**super().state_dict(), "vocab": self.vocab, "corpus_sha256": self.corpus_sha256}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the stream; check that the checkpoint was trained on this vocabulary (and text).

        Raises:
            ValueError: the checkpoint's vocabulary differs (its model has other input/output sizes or meanings).
        """
        saved = state_dict.get("vocab")
        if saved is not None and saved != self.vocab:
            missing, extra = sorted(set(saved) - set(self.vocab)), sorted(set(self.vocab) - set(saved))
            raise ValueError(
                f"{type(self).__name__}: the checkpoint was trained on a vocabulary of {len(saved)} characters, this "
                f"corpus has {len(self.vocab)} (missing here: {missing!r}; new here: {extra!r}). Resume with the "
                "checkpoint's corpus: the same `path` (the embedded default differs between Python versions)."
            )
        if state_dict.get("corpus_sha256", self.corpus_sha256) != self.corpus_sha256:
            rank_zero_warn(
                f"{type(self).__name__}: the checkpoint was trained on another text with the same vocabulary; the "
                "stream resumes at the saved chunk index in this text."
            )
        super().load_state_dict(state_dict)


def _pieces(owner: str, ids: torch.Tensor, count: int, name: str, argument: str) -> torch.Tensor:
    """``ids`` cut into ``count`` contiguous pieces of equal length, ``(count, len(ids) // count)``."""
    length = len(ids) // count
    if length < 2:
        raise ValueError(
            f"{owner}: the {name} text ({len(ids)} characters) is too short for {argument}={count}: each stream needs "
            f"at least 2 characters. Reduce {argument} or give a longer text."
        )
    return ids[: count * length].reshape(count, length)
