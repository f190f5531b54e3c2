"""Noise drawn per stream, identical however the streams are split between processes: what the randomised
estimators (UORO, KF-RTRL) share.

A state holds ``stream_ids`` ``(B,)`` and ``total_streams``: its streams are rows ``stream_ids`` of
``total_streams``. Every step draws the noise of all ``total_streams`` from the state's generator and keeps these
rows, so processes that each hold some of the streams (DDP) draw exactly what one process holding all of them would.
"""

from __future__ import annotations

import math

import torch

from lightning_ortho.online.state import OnlineState


def check_generator(generator: object, owner: str) -> int | torch.Generator | None:
    """``generator`` if it is a seed (``int``, not ``bool``), a ``torch.Generator`` or ``None``.

    Raises:
        ValueError: anything else; the message names ``owner``.
    """
    if isinstance(generator, bool) or (generator is not None and not isinstance(generator, (int, torch.Generator))):
        raise ValueError(f"{owner}: generator must be a seed (int), a torch.Generator or None, got {generator!r}.")
    return generator


def check_eps(eps: object, owner: str) -> float:
    """``eps`` as a float if it is a positive finite number (``int`` or ``float``, not ``bool``): the constant that
    the randomised estimators add to both norms of each rescaling ratio ``sqrt((n + eps) / (d + eps))``. ``0``
    leaves ``0 / 0`` at the first step (every norm is zero there); ``inf`` makes every ratio ``inf / inf``.

    Raises:
        ValueError: anything else; the message names ``owner``, the argument and the value.
    """
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(
            f"{owner}: eps must be a positive finite number (it is added to the norms of each rescaling ratio, which"
            f" are all zero at the first step), got eps={eps!r}; e.g. the default 1e-7."
        )
    return float(eps)


class StreamNoise:
    """Mixin for an :class:`~lightning_ortho.online.OnlineGradientEstimator` with a ``generator`` attribute (a seed,
    a ``torch.Generator`` or ``None``): :meth:`initial_state` records the state's streams, :meth:`_new_generator`
    starts the state's generator, :meth:`_rows` tells which rows of a draw over all streams are the state's."""

    generator: int | torch.Generator | None
    _rows_cache: tuple | None = None

    def initial_state(
        self, h0: torch.Tensor, *, stream_ids: torch.Tensor | None = None, total_streams: int | None = None
    ) -> OnlineState:
        """The state before the first step, for streams ``stream_ids`` ``(B,)`` of ``total_streams`` (default:
        all ``B`` streams, in order); see the module docstring.

        Raises:
            ValueError: see :meth:`OnlineGradientEstimator.initial_state`; ``stream_ids`` not ``B`` indices in
                ``[0, total_streams)``.
        """
        state = super().initial_state(h0)  # type: ignore[misc]
        batch = h0.shape[0]
        total = int(total_streams) if total_streams is not None else batch
        ids = torch.arange(batch) if stream_ids is None else stream_ids
        ids = torch.as_tensor(ids, dtype=torch.long)
        # the range is read where the ids have values (not on the meta device of shape inference)
        if ids.shape != (batch,) or (not ids.is_meta and (ids.min() < 0 or ids.max() >= total)):
            raise ValueError(
                f"{type(self).__name__}: stream_ids must be {batch} indices in [0, total_streams={total}), got"
                f" {ids.tolist()}."
            )
        ids = ids.to(h0.device)
        state.tensors["stream_ids"] = ids
        state.tensors["total_streams"] = torch.tensor(total, device=h0.device)
        return state

    def _overflow_cause(self, inputs: dict[str, torch.Tensor], step: int) -> str:
        """The cause of an overflowed influence approximation (error path only): an ``eps`` that rounds to zero in
        the dtype of the step (every rescaling ratio is then ``0 / 0`` at the first step), else the base class's."""
        x, eps = inputs.get("x"), getattr(self, "eps", None)
        rescaled = getattr(self, "gir", True)  # UORO's fixed rescaling has no ratios of norms
        if rescaled and isinstance(x, torch.Tensor) and isinstance(eps, float) and not torch.tensor(eps, dtype=x.dtype):
            dtype = str(x.dtype).removeprefix("torch.")
            return (
                f": eps={eps!r} rounds to zero in {dtype}, so the rescaling ratios sqrt((n + eps) / (d + eps)) are"
                f" 0 / 0 where the norms are zero (the first step); give an eps that {dtype} holds (at least"
                f" {torch.finfo(x.dtype).tiny:.3g}, e.g. the default 1e-7)."
            )
        return super()._overflow_cause(inputs, step)  # type: ignore[misc]

    def _new_generator(self, h0: torch.Tensor) -> torch.Generator:
        """The generator a new state starts with: the one given, or a new one from the seed (a seed drawn from
        torch's global generator when ``None``, so ``seed_everything`` fixes it). The meta device has no generator
        of its own: its states get a CPU one, which draws meta tensors of the right shapes."""
        if isinstance(self.generator, torch.Generator):
            return self.generator
        seed = self.generator if self.generator is not None else int(torch.randint(0, 2**62, ()).item())
        return torch.Generator(device="cpu" if h0.is_meta else h0.device).manual_seed(seed)

    def _rows(self, state: OnlineState) -> tuple[int, torch.Tensor | None]:
        """``(total_streams, rows)``: ``rows`` the state's ``stream_ids``, or ``None`` when they are all streams in
        order. Read once per state (a host synchronisation) and kept while its ``stream_ids`` tensor is the same.
        On the meta device (shape inference, no values to read) a draw is one row per stream of the state: the
        shapes of the noise are those of any split."""
        ids, total_tensor = state.tensors["stream_ids"], state.tensors["total_streams"]
        if total_tensor.is_meta or ids.is_meta:
            return ids.shape[0], None
        cached = self._rows_cache
        if cached is None or cached[0] is not ids or cached[1] is not total_tensor:
            total = int(total_tensor)
            every = ids.shape[0] == total and bool((ids == torch.arange(total, device=ids.device)).all())
            cached = self._rows_cache = (ids, total_tensor, total, None if every else ids)
        return cached[2], cached[3]
