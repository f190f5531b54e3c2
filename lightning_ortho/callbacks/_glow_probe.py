"""A small probe batch for the Glow callbacks: the first inputs the model's Glow sees in a validation epoch."""

from __future__ import annotations

import torch
from torch.utils.hooks import RemovableHandle

from lightning_ortho._lightning import Callback, pl, rank_zero_warn
from lightning_ortho.flows import Glow


def find_glow(pl_module: pl.LightningModule, callback: str) -> Glow:
    """The first (outermost) :class:`~lightning_ortho.flows.Glow` among ``pl_module.modules()``.

    Raises:
        ValueError: the module contains no Glow.
    """
    for module in pl_module.modules():
        if isinstance(module, Glow):
            return module
    raise ValueError(
        f"{callback}: {type(pl_module).__name__} contains no lightning_ortho.flows.Glow. Attach this callback to a "
        "model that has one as a submodule (e.g. lightning_ortho.models.GlowModule), or remove it."
    )


class ValidationProbe:
    """Keeps the first ``num_images`` inputs ``(n, C, S, S)`` of the Glow's forward in each validation epoch.

    A forward hook on the Glow, armed by :meth:`arm` (at the start of a validation epoch) and disarmed by the
    first call it sees, so it costs one slice and copy per epoch. Each process keeps its own probe.
    """

    def __init__(self, num_images: int) -> None:
        self.num_images = num_images
        self.images: torch.Tensor | None = None
        self._armed = False
        self._handle: RemovableHandle | None = None
        self._warned = False

    def attach(self, glow: Glow) -> None:
        self.detach()
        self._handle = glow.register_forward_hook(self._capture)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle, self.images, self._armed = None, None, False

    def arm(self) -> None:
        self.images, self._armed = None, True

    def take(self, callback: str) -> torch.Tensor | None:
        """The probe of this epoch, or ``None`` with a warning (once) when the Glow's forward was not called."""
        if self.images is None and not self._warned:
            self._warned = True
            rank_zero_warn(
                f"{callback}: the Glow was not called as a module during validation, so there is no probe and "
                "nothing is checked. Call it as `glow(y)` or `glow.bits_per_dim(x)` (not `glow.encode`), so the "
                "forward hook sees the batch."
            )
        return self.images

    def _capture(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        if self._armed and args and isinstance(args[0], torch.Tensor):
            self.images, self._armed = args[0][: self.num_images].detach().clone(), False


class GlowProbeCallback(Callback):
    """Base of the Glow callbacks: finds the model's Glow at setup and keeps a :class:`ValidationProbe` of the
    first ``num_images`` inputs it sees in each validation epoch (``num_images = 0``: no probe)."""

    def __init__(self, num_images: int) -> None:
        self._probe = ValidationProbe(num_images)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._glow = find_glow(pl_module, type(self).__name__)
        if self._probe.num_images:
            self._probe.attach(self._glow)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._probe.detach()

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._probe.arm()
