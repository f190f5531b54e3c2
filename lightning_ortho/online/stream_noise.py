"""Noise drawn per stream, identical however the streams are split between processes: what the randomised
estimators (UORO, KF-RTRL) share, and the one place where they draw it (:meth:`StreamNoise._draw_bits`).

A state holds ``stream_ids`` ``(B,)`` and ``total_streams``: its streams are rows ``stream_ids`` of
``total_streams``. Every step draws the noise of all ``total_streams`` from the state's generator and keeps these
rows, so processes that each hold some of the streams (DDP) draw exactly what one process holding all of them would.
Which rows those are is decided when the state is made (:meth:`StreamNoise.initial_state`), so a step reads nothing
on the host.

**Under torch.compile.** A ``torch.Generator`` cannot enter a compiled graph, so while compiling
(``torch.compiler.is_compiling()``) the noise is drawn from the default generator of the state's device (no
``generator=`` argument). :meth:`StreamNoise.noise_scope` makes that the state's own noise: around the compiled
calls it moves the state generator's state into the default generator, and back afterwards (restoring the default
generator's own state)::

    step = torch.compile(estimator.step, fullgraph=True)
    with estimator.noise_scope(state):
        for x in xs:
            h, state = step(x, state)

Inside the scope every draw, compiled or eager, comes from the default generator, which then holds the state's
stream; so the numbers are those of the eager run without the scope, and a checkpoint taken after the scope resumes
exactly. (Inductor draws its own random numbers unless ``torch._inductor.config.fallback_random = True``; the
``aot_eager`` backend and CUDA graphs of eager kernels call the generator as eager does.) Compiled calls outside
a scope draw from the default generator as it stands: random, but not the state's stream.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

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
    a ``torch.Generator`` or ``None``): :meth:`initial_state` records the state's streams and decides which rows of
    a draw over all streams are the state's, :meth:`_new_generator` starts the state's generator, :meth:`_draw_bits`
    draws the noise (the only draws of the estimators; :meth:`_draw` makes its bits signs and cuts the state's rows),
    :meth:`noise_scope` lets compiled calls draw the state's noise (see the module docstring)."""

    generator: int | torch.Generator | None
    #: ``(stream_ids, total_streams tensor, total as an int, rows to keep or None for all)`` of the last state made
    #: or read: a step on that state's streams reads nothing on the host.
    _rows_cache: tuple | None = None
    #: The generator of the state inside :meth:`noise_scope`, whose draws come from the default generator.
    _scoped: torch.Generator | None = None
    #: ``(-1, 2)`` in the dtype and device of the last draw (:meth:`_sign_constants`).
    _sign_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def initial_state(
        self, h0: torch.Tensor, *, stream_ids: torch.Tensor | None = None, total_streams: int | None = None
    ) -> OnlineState:
        """The state before the first step, for streams ``stream_ids`` ``(B,)`` of ``total_streams`` (default:
        all ``B`` streams, in order); see the module docstring. Which rows of a draw are the state's is decided
        here (one host read when ``stream_ids`` is given), so the steps read nothing on the host.

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
        every = total == batch and (
            stream_ids is None or (not ids.is_meta and bool((ids == torch.arange(batch, device=ids.device)).all()))
        )
        ids = ids.to(h0.device)
        total_tensor = torch.tensor(total, device=h0.device)
        state.tensors["stream_ids"] = ids
        state.tensors["total_streams"] = total_tensor
        if not ids.is_meta:
            self._rows_cache = (ids, total_tensor, total, None if every else ids)
        return state

    @contextlib.contextmanager
    def noise_scope(self, state: OnlineState) -> Iterator[None]:
        """Draw ``state``'s noise from the default generator of its device inside the block, so that compiled
        calls (which cannot take a ``torch.Generator``) draw the numbers an eager run draws (see the module
        docstring).

        On entry the default generator takes the state of ``state.generator``; on exit ``state.generator`` takes
        the default generator's state (the draws made inside), and the default generator gets its own state back.
        Every state made from ``state`` shares its generator, so the scope covers the states the block steps to.

        Raises:
            ValueError: ``state`` has no generator (it was not made by this estimator's ``initial_state``).
        """
        generator = getattr(state, "generator", None)
        if not isinstance(generator, torch.Generator):
            raise ValueError(
                f"{type(self).__name__}.noise_scope: the state has no noise generator; give a state made by"
                f" {type(self).__name__}.initial_state."
            )
        default = _default_generator(generator.device)
        if default is None:  # the meta device: no values, no numbers to keep
            yield
            return
        saved, outer = default.get_state(), self._scoped
        default.set_state(generator.get_state())
        self._scoped = generator
        try:
            yield
        finally:
            self._scoped = outer
            generator.set_state(default.get_state())
            default.set_state(saved)

    def _generator_of(self, state: OnlineState) -> torch.Generator | None:
        """The generator to draw ``state``'s noise from: ``None`` (the device's default generator) while compiling
        or inside :meth:`noise_scope`, else the state's own."""
        if torch.compiler.is_compiling():
            return None
        generator = state.generator
        return None if generator is self._scoped and generator is not None else generator

    def _draw(
        self, state: OnlineState, like: torch.Tensor, normal: int | None, signs: tuple[int, ...]
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(nu, signs)``: standard normal noise ``(B, normal)`` (``None`` when ``normal`` is ``None``: nothing
        drawn), then independent fair signs ``(B, *signs)`` in ``{-1, +1}``, in ``like``'s dtype and device: the
        draw of :meth:`_draw_bits`, its bits made signs and cut to the state's rows (:meth:`_signs_of`)."""
        return self._signs_of(*self._draw_bits(state, like, normal, signs), like)

    def _draw_bits(
        self,
        state: OnlineState,
        like: torch.Tensor,
        normal: int | None,
        signs: tuple[int, ...],
        into: tuple[torch.Tensor, torch.Tensor] | None = None,
        streams: tuple[int, torch.Tensor | None] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """``(nu, bits, rows)``: every draw of the randomised estimators, as drawn, for all ``total_streams``: one
        ``randn`` ``(total, normal)`` (``nu``; ``None`` when ``normal`` is ``None``: nothing drawn), then one
        ``randint`` of bits in ``{0, 1}`` ``(total, *signs)`` (in the float dtype, which draws the integers an int64
        ``randint`` draws), in ``like``'s dtype and device, from the state's generator, or the default one while
        compiling and inside :meth:`noise_scope`; ``rows`` the state's rows of them (``None``: all, in order). A
        caller that reads the sign ``2 b - 1`` and the rows itself (a fused kernel) skips :meth:`_signs_of`.

        ``into``: ``(nu, bits)`` tensors of those shapes, ``like``'s dtype and device, contiguous, to draw into
        (``normal_`` and ``random_(0, 2)``: what ``randn`` and ``randint`` run on the tensors they allocate, so the
        same numbers from the same generator state, without the allocations); ``streams``: what :meth:`_rows`
        gives for ``state`` where the caller has taken it."""
        total, rows = self._rows(state) if streams is None else streams
        generator = self._generator_of(state)
        nu = None
        if into is not None:
            nu, bits = into
            if normal is not None:
                nu.normal_(generator=generator)
            bits.random_(0, 2, generator=generator)
            return nu, bits, rows
        device, dtype = like.device, like.dtype
        if generator is None:
            if normal is not None:
                nu = torch.randn(total, normal, device=device, dtype=dtype)
            bits = torch.randint(0, 2, (total, *signs), device=device, dtype=dtype)
        else:
            if normal is not None:
                nu = torch.randn(total, normal, generator=generator, device=device, dtype=dtype)
            bits = torch.randint(0, 2, (total, *signs), generator=generator, device=device, dtype=dtype)
        return nu, bits, rows

    def _signs_of(
        self, nu: torch.Tensor | None, bits: torch.Tensor, rows: torch.Tensor | None, like: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(nu, tau)`` of a draw of :meth:`_draw_bits`: ``tau = 2 bits - 1`` (exact), both cut to ``rows``."""
        minus_one, two = self._sign_constants(like)
        tau = torch.addcmul(minus_one, bits, two)  # 2 b - 1, exact; one call
        if rows is not None:
            nu, tau = (None if nu is None else nu[rows]), tau[rows]
        return nu, tau

    def _sign_constants(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(-1, 2)`` as 0-d tensors of ``like``'s dtype and device, kept per dtype and device outside compiled
        regions: a tensor operand costs a fraction of a Python number's conversion at every call."""
        if torch.compiler.is_compiling():
            return like.new_full((), -1.0), like.new_full((), 2.0)
        found = self._sign_cache
        if found is None or found[0].dtype is not like.dtype or found[0].device != like.device:
            found = self._sign_cache = tuple(like.new_tensor([-1.0, 2.0]).unbind())
        return found

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
        order. Decided when the state is made (:meth:`initial_state`) and kept while its ``stream_ids`` tensor is
        the same; a state whose entries were replaced (a loaded checkpoint) is read once (a host synchronisation,
        in eager: make states outside compiled regions). On the meta device (shape inference, no values to read) a
        draw is one row per stream of the state: the shapes of the noise are those of any split."""
        ids, total_tensor = state.tensors["stream_ids"], state.tensors["total_streams"]
        if total_tensor.is_meta or ids.is_meta:
            return ids.shape[0], None
        cached = self._rows_cache
        if cached is None or cached[0] is not ids or cached[1] is not total_tensor:
            total = int(total_tensor)
            every = ids.shape[0] == total and bool((ids == torch.arange(total, device=ids.device)).all())
            cached = self._rows_cache = (ids, total_tensor, total, None if every else ids)
        return cached[2], cached[3]


def _default_generator(device: torch.device) -> torch.Generator | None:
    """The default generator of ``device`` (the one a draw without ``generator=`` uses), ``None`` for meta."""
    if device.type == "meta":
        return None
    if device.type == "cpu":
        return torch.default_generator
    module = torch.get_device_module(device.type)
    index = device.index if device.index is not None else module.current_device()
    return module.default_generators[index]
