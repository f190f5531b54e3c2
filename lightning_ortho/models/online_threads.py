"""The CPU thread count of :class:`~lightning_ortho.models.OnlineRNNModule`'s runs: one thread for small cells.

Online training runs a few tiny operations per time step (``(b, H) x (H, H)`` products at ``H = 32``). On a
thread pool each of them pays for waking the other threads, which costs far more than the product itself, above
all on a machine whose cores are busy: the adding task's update took 26 ms with torch's default threads against
2 ms on one thread on a loaded 2-core machine. UORO measured there on 32 streams, milliseconds per step, 1 / 2
threads: H = 32 0.28 / 0.93, 128 1.1 / 17, 256 3.0 / 5.9, 512 18 / 65; RTRL H = 32 6.6 / 25.
"""

from __future__ import annotations

from typing import Literal

import torch

from lightning_ortho._lightning import Callback, pl

#: ``"auto"`` runs on one thread up to this hidden size (on the CPU) and leaves torch's count above it.
AUTO_MAX_HIDDEN = 256

ThreadSetting = int | Literal["auto"] | None


def check_num_threads(value: object) -> ThreadSetting:
    """``value`` if it is a valid ``num_threads``: a positive ``int``, ``"auto"`` or ``None``.

    Raises:
        ValueError: it is not; the message lists the choices.
    """
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value  # type: ignore[return-value]
    raise ValueError(
        "OnlineRNNModule: num_threads must be 'auto' (one thread for hidden sizes up to"
        f" {AUTO_MAX_HIDDEN} on the CPU), a positive integer, or None (leave torch's thread count), got {value!r}."
    )


def resolve_num_threads(setting: ThreadSetting, hidden_size: int, device: torch.device) -> int | None:
    """The thread count a run uses, or ``None`` to leave torch's: ``"auto"`` gives 1 for ``hidden_size <=
    AUTO_MAX_HIDDEN`` on the CPU and ``None`` otherwise (on a GPU the CPU only launches kernels)."""
    if setting == "auto":
        return 1 if device.type == "cpu" and hidden_size <= AUTO_MAX_HIDDEN else None
    return setting  # type: ignore[return-value]


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
