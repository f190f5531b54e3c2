"""The CPU thread count of :class:`~lightning_ortho.models.OnlineRNNModule`'s runs: one thread for small cells.

Online training runs a few tiny operations per time step (``(b, H) x (H, H)`` products at ``H = 32``). On a
thread pool each of them pays for waking the other threads, which costs far more than the product itself, above
all on a machine whose cores are busy (:mod:`lightning_ortho.online.threads` has the reasons and the rule,
which the estimators apply to their own calls as well). The module sets the count for a whole Trainer stage, so
the readout, the loss and the optimiser run on it too.
"""

from __future__ import annotations

import torch

from lightning_ortho._lightning import Callback, pl
from lightning_ortho.online import threads
from lightning_ortho.online.threads import AUTO_MAX_HIDDEN, ThreadSetting, resolve_num_threads

__all__ = ["AUTO_MAX_HIDDEN", "StageThreads", "ThreadSetting", "check_num_threads", "resolve_num_threads"]


def check_num_threads(value: object) -> ThreadSetting:
    """``value`` if it is a valid ``num_threads``: a positive ``int``, ``"auto"`` or ``None``.

    Raises:
        ValueError: it is not; the message lists the choices.
    """
    return threads.check_num_threads(value, "OnlineRNNModule")


class StageThreads(Callback):
    """Sets ``torch.set_num_threads`` for one Trainer stage (fit, validate, test or predict), from its ``setup``
    to its ``teardown``, and gives the process its previous count back then, or when the stage ends in an
    exception (``on_exception``). :class:`~lightning_ortho.models.OnlineRNNModule` brings it through
    ``configure_callbacks``.

    Args:
        setting: ``num_threads`` of the module (see :func:`resolve_num_threads`).
        hidden_size: the cell's hidden size.
    """

    def __init__(self, setting: ThreadSetting, hidden_size: int) -> None:
        self.setting, self.hidden_size = check_num_threads(setting), hidden_size
        self.previous: int | None = None  # the count to give back; None: nothing changed

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        wanted = resolve_num_threads(self.setting, self.hidden_size, trainer.strategy.root_device)
        if wanted is not None and self.previous is None and wanted != torch.get_num_threads():
            self.previous = torch.get_num_threads()
            torch.set_num_threads(wanted)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.restore()

    def restore(self) -> None:
        """Give the process the thread count it had before :meth:`setup` (nothing if it was not changed)."""
        if self.previous is not None:
            torch.set_num_threads(self.previous)
            self.previous = None
