"""The CPU thread count of online training: one thread for small cells.

An online estimator runs a few tiny operations per time step (``(B, H) x (H, H)`` products and ``(B, P)``
updates at ``H = 32``). On a thread pool each of them pays for waking the other threads, which costs far more than
the operation, above all on a machine whose cores are busy: there every estimator (UORO, truncated BPTT, RTRL) runs
several times faster on one thread than on a pool of two for small cells, by less as ``H`` grows. Switching the
count to one for the call and back costs next to nothing against a step, so every estimator call takes it
(:attr:`lightning_ortho.online.OnlineGradientEstimator.num_threads`) and
:class:`~lightning_ortho.models.OnlineRNNModule` sets it for its whole run.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

#: ``"auto"`` runs on one thread up to this hidden size (on the CPU), where one thread is still the faster, and leaves
#: torch's count above it.
AUTO_MAX_HIDDEN = 256

ThreadSetting = int | Literal["auto"] | None

# The count torch had when this package was imported, and whether the environment fixed it: "auto" leaves a count
# that the user chose (torch.set_num_threads to another count afterwards, or OMP_NUM_THREADS / MKL_NUM_THREADS).
_START_COUNT = torch.get_num_threads()
_ENVIRONMENT_CHOSE = any(os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))


def check_num_threads(value: object, owner: str) -> ThreadSetting:
    """``value`` if it is a valid ``num_threads``: a positive ``int``, ``"auto"`` or ``None``.

    Raises:
        ValueError: it is not; the message (naming ``owner``) lists the choices.
    """
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value  # type: ignore[return-value]
    raise ValueError(
        f"{owner}: num_threads must be 'auto' (one thread for hidden sizes up to {AUTO_MAX_HIDDEN} on the CPU), a"
        f" positive integer, or None (leave torch's thread count), got {value!r}."
    )


def resolve_num_threads(setting: ThreadSetting, hidden_size: int, device: torch.device) -> int | None:
    """The thread count a run uses, or ``None`` to leave torch's: ``"auto"`` gives 1 for ``hidden_size <=
    AUTO_MAX_HIDDEN`` on the CPU and ``None`` otherwise (on a GPU the CPU only launches kernels)."""
    if setting == "auto":
        return 1 if device.type == "cpu" and hidden_size <= AUTO_MAX_HIDDEN else None
    return setting  # type: ignore[return-value]


def call_thread_count(setting: ThreadSetting, hidden_size: int, device: torch.device) -> int | None:
    """The thread count for one estimator call, or ``None`` to run it on torch's current count: as
    :func:`resolve_num_threads`, except that ``"auto"`` also leaves a count the user chose (set by
    ``torch.set_num_threads`` to another count than at import, or by ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``),
    and ``None`` when the count is already the one wanted."""
    current = torch.get_num_threads()
    if setting == "auto":
        if current == 1 or _ENVIRONMENT_CHOSE or current != _START_COUNT:
            return None
        return 1 if device.type == "cpu" and hidden_size <= AUTO_MAX_HIDDEN else None
    return None if setting is None or setting == current else setting
