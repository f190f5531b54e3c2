import atexit
import socket
from collections.abc import Callable

import pytest
import torch

from lightning_ortho._lightning import pl


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def free_port() -> int:
    """A free TCP port for a DDP rendezvous (Lightning caches MASTER_PORT; a fresh one per run avoids reuse)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class CleanDistributedExit(pl.Callback):
    """In each ddp_spawn worker, destroy the process group when the worker exits. Otherwise a worker that finishes
    while rank zero still saves the weights it hands back sometimes aborts in gloo's teardown ("terminate called
    without an active exception", SIGABRT) after a successful fit."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def make_tiny_trainer(root, **kwargs) -> pl.Trainer:
    """A quiet CPU Trainer for tests: no logger, checkpoints, progress bar or model summary; logs under ``root``.
    Keyword arguments override the defaults (``strategy="ddp_spawn", devices=2``, ``callbacks=[...]``, ...)."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    if kwargs.get("strategy") == "ddp_spawn":
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), CleanDistributedExit()]
    return pl.Trainer(**{**defaults, **kwargs})


@pytest.fixture
def tiny_trainer(tmp_path) -> Callable[..., pl.Trainer]:
    """``tiny_trainer(**overrides) -> pl.Trainer``: :func:`make_tiny_trainer` rooted in the test's ``tmp_path``."""
    return lambda **kwargs: make_tiny_trainer(kwargs.pop("default_root_dir", tmp_path), **kwargs)
