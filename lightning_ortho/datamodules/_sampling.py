"""Samplers whose order depends only on (seed, epoch), so a resumed run sees the same batches."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochSeededRandomSampler(Sampler[int]):
    """A random permutation per epoch drawn from ``seed + epoch`` alone, not from the global RNG.

    Lightning calls ``set_epoch`` at the start of every epoch (as for ``DistributedSampler``), so a run that
    is stopped, checkpointed and resumed shuffles exactly like one that was never interrupted.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        yield from torch.randperm(self.size, generator=generator).tolist()

    def __len__(self) -> int:
        return self.size
