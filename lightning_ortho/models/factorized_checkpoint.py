"""Load checkpoints of models whose dense layers were compressed into FactorizedLinear after they were built."""

from __future__ import annotations

import posixpath
from typing import Any

from lightning_ortho._lightning import fabric, pl
from lightning_ortho.transforms.factorized_linear import restore_factorized


class RestoresFactorizedLayers:
    """LightningModule mixin: ``on_load_checkpoint`` rebuilds the compressed layers a checkpoint holds.

    :class:`~lightning_ortho.callbacks.TransformCompression` replaces ``nn.Linear`` layers by
    :class:`~lightning_ortho.transforms.FactorizedLinear` during ``fit``, so the checkpoints saved after it hold
    ``codes``, ``mask`` and transform tensors where a freshly built model has ``weight`` and ``bias``. Lightning
    calls ``on_load_checkpoint`` before it loads the weights, in ``Model.load_from_checkpoint(path)`` and in
    ``Trainer.fit / validate / test / predict(..., ckpt_path=path)``; this one replaces those layers first
    (:func:`~lightning_ortho.transforms.factorized_linear.restore_factorized`), so the weights load strictly and the
    model predicts exactly what the saved one did. Put it before ``pl.LightningModule`` in the bases::

        class MyModel(RestoresFactorizedLayers, pl.LightningModule): ...

    A subclass that overrides ``on_load_checkpoint`` must call ``super().on_load_checkpoint(checkpoint)``. Without
    the mixin, the Trainer routes still work while ``TransformCompression`` is among the Trainer's callbacks (it
    registers the same rebuild on the model in ``setup``); ``load_from_checkpoint`` runs no callbacks.
    """

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        restore_factorized(self, checkpoint.get("state_dict", {}))  # type: ignore[arg-type]
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]


def save_compressed_checkpoint(trainer: pl.Trainer, name: str = "compressed") -> str:
    """Save the trainer's model as ``<name>.ckpt`` next to its checkpoints and return the path.

    The folder is the ``dirpath`` of ``trainer.checkpoint_callback`` (else ``trainer.log_dir``); an existing file is
    never overwritten: ``<name>-v1.ckpt``, ``<name>-v2.ckpt`` ... as ``ModelCheckpoint`` does. Call it on every
    process: rank zero picks the name and broadcasts it, and ``Trainer.save_checkpoint`` writes on rank zero and
    waits for all (DDP-safe).
    """
    folder = str(getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.log_dir or trainer.default_root_dir)
    path = None
    if trainer.is_global_zero:
        filesystem, version = fabric.utilities.cloud_io.get_filesystem(folder), 0
        path = posixpath.join(folder, f"{name}.ckpt")
        while filesystem.exists(path):
            version += 1
            path = posixpath.join(folder, f"{name}-v{version}.ckpt")
    path = trainer.strategy.broadcast(path)
    trainer.save_checkpoint(path)
    return path
