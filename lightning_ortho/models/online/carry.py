"""What online training carries from one chunk to the next, and how it survives a checkpoint."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_ortho._lightning import rank_zero_warn
from lightning_ortho.online import OnlineState


class OnlineCarry:
    """The training state of :class:`~lightning_ortho.models.OnlineRNNModule` that lives between ``training_step``
    calls (not in parameters or the optimizer).

    Attributes:
        state: this process's estimator state (hidden states, influence approximation, noise generator), or
            ``None`` before the first chunk.
        next_chunk: the index of the chunk expected next (``None`` before the first chunk).
        window_steps: time steps accumulated since the last parameter update.
        pending: the update window's gradient so far, ``{parameter name: tensor}`` (``None``: nothing yet).

    Under DDP every process carries its own ``state`` and ``pending`` (its own streams); :meth:`checkpoint`
    gathers all of them, so the one file rank 0 writes resumes every process.
    """

    def __init__(self) -> None:
        self.state: OnlineState | None = None
        self.next_chunk: int | None = None
        self.window_steps = 0
        self.pending: dict[str, torch.Tensor] | None = None
        self._loaded: dict[str, Any] | None = None  # a checkpoint's carry not yet applied (see restore)

    def checkpoint(self, rank: int, world_size: int) -> dict[str, Any]:
        """A checkpoint entry: the shared counters and every process's ``state`` and ``pending`` (on the CPU).

        A collective under DDP (``all_gather_object``): every process must call it, as Lightning does when it
        saves a checkpoint.
        """
        if self._loaded is not None:  # loaded but not trained on since: save it as it was loaded
            return self._loaded
        mine = _to_cpu(
            {
                "state": None if self.state is None else self.state.state_dict(),
                "pending": self.pending,
            }
        )
        per_rank: list[Any] = [mine]
        if world_size > 1 and dist.is_available() and dist.is_initialized():
            per_rank = [None] * world_size
            dist.all_gather_object(per_rank, mine)
        return {
            "world_size": world_size,
            "next_chunk": self.next_chunk,
            "window_steps": self.window_steps,
            "ranks": per_rank,
        }

    def load(self, entry: dict[str, Any]) -> None:
        """Take a :meth:`checkpoint` entry; the per-process parts are applied by :meth:`restore`."""
        self._loaded = entry
        self.next_chunk, self.window_steps = entry["next_chunk"], entry["window_steps"]
        self.state, self.pending = None, None

    def restore(self, rank: int, world_size: int, fresh: Callable[[int], OnlineState], device: torch.device) -> None:
        """Apply a loaded checkpoint for process ``rank`` of ``world_size`` (nothing if none is pending).

        ``fresh(streams)`` makes an initial estimator state of the right type, dtype and device to load into.

        The estimator state's load warnings (e.g. a truncation window cut to a smaller ``k``) are given once, by
        rank zero (every process loads a state of the same shapes).

        Raises:
            ValueError: the checkpoint was saved by another number of processes, or its estimator state does not
                fit this model's estimator (another kind, cell or options: the message says what differs).
        """
        entry, self._loaded = self._loaded, None
        if entry is None:
            return
        if entry["world_size"] != world_size:
            raise ValueError(
                f"OnlineRNNModule: the checkpoint was saved by {entry['world_size']} processes, each with its own"
                f" streams and estimator state; resume it with the same number of processes, not {world_size}."
            )
        mine = entry["ranks"][rank]
        if mine["state"] is not None:
            state = fresh(_saved_streams(mine["state"]))
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    state.load_state_dict(mine["state"])
            except ValueError as error:
                saved = mine["state"].get("kind")
                trained = f" (estimator={saved!r})" if saved is not None else ""
                raise ValueError(
                    f"OnlineRNNModule: the checkpoint's estimator state does not fit this model's estimator"
                    f" (estimator={state.kind!r}): {error} Resume with the estimator, estimator_options and cell the"
                    f" checkpoint was trained with{trained}, or load only its weights and fit without ckpt_path."
                ) from error
            self.state = state
            for warning in caught:
                rank_zero_warn(f"OnlineRNNModule: resuming: {warning.message}", category=warning.category)
        if mine["pending"] is not None:
            self.pending = {name: g.to(device) for name, g in mine["pending"].items()}

    @property
    def restoring(self) -> bool:
        return self._loaded is not None


def _saved_streams(state: Any) -> int:
    """The streams of a saved estimator state: the rows of its ``h``, or of its first layer's for the state of a
    stack of layers (:class:`~lightning_ortho.online.lru_stack.LRUStackState`: ``{"kind", "layers"}``); 1 where
    there is none to read (the load that follows then says what does not fit)."""
    if not isinstance(state, dict):
        return 1
    layers = state.get("layers") if "h" not in state else None
    if isinstance(layers, list | tuple) and layers:
        return _saved_streams(layers[0])
    h = state.get("h")
    return h.shape[0] if isinstance(h, torch.Tensor) and h.dim() >= 1 else 1


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # a stack's layers
        return type(value)(_to_cpu(v) for v in value)
    return value
