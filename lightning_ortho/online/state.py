"""The checkpointable state of an online gradient estimator."""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch

#: The fields :meth:`OnlineState.replace` changes.
_FIELDS = frozenset(("h", "tensors", "generator", "step", "health"))
_compiling = torch.compiler.is_compiling


class OnlineState:
    """What an estimator carries from one step to the next, for ``B`` independent streams.

    Attributes:
        h: ``(B, H)`` the current hidden states.
        tensors: the estimator's influence approximation, every entry with the streams on dim 0 (UORO's
            ``h_tilde`` ``(B, H)`` and ``w_tilde`` ``(B, P)``, RTRL's ``influence`` ``(B, H, P)``, truncated
            BPTT's window of inputs and states). A step may update an entry in place and hand the same tensor to
            the state it returns (UORO's ``w_tilde``): continue from the returned state; copies come from
            :meth:`state_dict`.
        generator: the estimator's own ``torch.Generator`` (UORO's noise) or ``None``; its state is part of
            :meth:`state_dict`, so a run that stops and resumes draws the same noise.
        step: the number of steps taken since :meth:`~lightning_ortho.online.OnlineGradientEstimator.initial_state`.
        kind: the name of the estimator that made the state (``"rtrl"``, ``"tbptt"``, ``"uoro"``) or ``None``.
        varying_dims: ``{entry: dims}``, the dims of a ``tensors`` entry whose size changes from step to step
            (truncated BPTT's window); every other dim of every entry keeps its size.
        windows: ``{entry: (dim, length)}``, entries that are sliding windows of the last ``length`` steps along
            ``dim`` (oldest first): after ``step`` steps they hold ``min(step, length)`` (truncated BPTT's ``k``).
        health: the record of the first NaN/inf that a step or a gradient found without stopping to read it
            (``int64`` ``(3,)`` on the state's device, :mod:`lightning_ortho.online.health`), or ``None`` (a
            state made by hand). Shared by the states a run makes from one another (like the generator) and
            updated in place; part of :meth:`state_dict`.

    ``state_dict()`` holds tensors, one int and the kind, so ``torch.save`` and Lightning checkpoints store it;
    ``load_state_dict`` checks that it fits and restores it in place, bit-exactly.
    """

    def __init__(
        self,
        h: torch.Tensor,
        tensors: dict[str, torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
        step: int = 0,
        kind: str | None = None,
        varying_dims: dict[str, tuple[int, ...]] | None = None,
        windows: dict[str, tuple[int, int]] | None = None,
        health: torch.Tensor | None = None,
    ) -> None:
        self.h = h
        self.health = health
        self.tensors = dict(tensors or {})
        self.generator = generator
        self.step = step
        self.kind = kind
        self.varying_dims = varying_dims or {}
        self.windows = windows or {}

    @property
    def batch_size(self) -> int:
        """``B``, the number of streams (rows of :attr:`h`)."""
        return self.h.shape[0]

    def replace(self, **changes: Any) -> OnlineState:
        """A new state with some fields changed (``h``, ``tensors``, ``generator``, ``step``, ``health``); it shares
        the generator (one noise stream per estimator run), the health record, ``kind``, ``varying_dims`` and
        ``windows``. Called at every step: it copies the attributes instead of running ``__init__`` again (a
        subclass keeps its own attributes too).

        Raises:
            TypeError: a field that a state does not have.
        """
        # a comprehension, not `changes.keys() - _FIELDS`: Dynamo before torch 2.14 cannot trace a keys view's `-`
        unknown = [key for key in changes if key not in _FIELDS]
        if unknown:
            raise TypeError(f"OnlineState.replace: unknown fields {sorted(unknown)}; a state has {sorted(_FIELDS)}.")
        new = self._copy()
        if "tensors" in changes:
            changes["tensors"] = dict(changes["tensors"] or {})
        for name, value in changes.items():
            setattr(new, name, value)
        return new

    #: Every attribute of a state: what :meth:`_copy` takes while compiling (a subclass that adds one extends it).
    _attributes = ("h", "health", "tensors", "generator", "step", "kind", "varying_dims", "windows")

    def _copy(self) -> OnlineState:
        """A shallow copy: a new state of this class with every attribute of this one."""
        new = object.__new__(type(self))
        if _compiling():
            # Dynamo before torch 2.14 traces neither `__dict__.update` nor `vars(self).items()`; named attributes
            for name in self._attributes:
                setattr(new, name, getattr(self, name))
        else:
            new.__dict__.update(self.__dict__)
        return new

    def _advanced(self, h: torch.Tensor, tensors: dict[str, torch.Tensor], step: int) -> OnlineState:
        """:meth:`replace` of ``h``, ``tensors`` (taken as they are: a new dict of the step's) and ``step``, without
        its keyword checks: a step at one stream is a few microseconds, and this is one of its calls."""
        if _compiling():
            new = self._copy()
            new.h, new.tensors, new.step = h, tensors, step
            return new
        new = object.__new__(type(self))  # _copy written out: a third of this call's cost
        attributes = new.__dict__
        attributes.update(self.__dict__)
        attributes["h"], attributes["tensors"], attributes["step"] = h, tensors, step
        return new

    def state_dict(self) -> dict[str, Any]:
        """A detached copy of the state, for ``torch.save`` and checkpoints (restore it with :meth:`load_state_dict`).

        Returns:
            ``{"h", "tensors", "generator", "step", "kind", "health"}``: clones of ``h`` and of every ``tensors``
                entry, the generator's ``get_state()`` (``None`` without one), ``step`` as a 0-d int64 tensor,
                ``kind`` and a clone of the health record (``None`` without one).
                ``varying_dims`` and ``windows`` are not saved: they come from the estimator that makes the state to
                load into.
        """
        return {
            "h": self.h.detach().clone(),
            "tensors": {k: v.detach().clone() for k, v in self.tensors.items()},
            "generator": None if self.generator is None else self.generator.get_state(),
            "step": torch.tensor(self.step),
            "kind": self.kind,
            "health": None if self.health is None else self.health.detach().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (onto this state's device; floating entries in this state's dtypes).

        The saved state must fit this one: the same streams and hidden size, a noise generator in both or neither
        (with a state that this generator takes) and, when an estimator made this state (``kind`` is set), the
        same estimator kind (if the saved state records it) and the same influence entries with the same shapes
        (but for ``varying_dims``) and kinds of dtype. Make the state to load into with ``initial_state`` of an
        estimator like the one that saved it, with ``h0`` of the saved streams. On any error the state is left
        as it was.

        Adapted, with a ``UserWarning``: a window (``windows``) longer than this state's keeps its last
        ``length`` steps, which is what an estimator with the shorter window would hold after the same steps; a
        window shorter than ``min(step, length)`` (saved with a shorter window) is loaded as is and fills up in
        the next steps. An empty window (a state saved before its first step) loads whatever its other sizes. A
        window that no estimator saves (empty after ``step >= 1`` steps, or holding more than ``step`` steps) loads
        as it is, warned that the state was made by hand or is damaged. ``step`` may be an int, a NumPy integer or
        a one-element integer tensor.

        Raises:
            ValueError: ``state`` is not a :meth:`state_dict` (the message names the entry that is not), it does
                not fit this state (the message says what differs), or its ``h`` or an influence entry holds
                NaN/inf (a state saved from a diverged run cannot continue).
        """
        h, tensors, step, notes = self._checked(state)
        device = self.h.device
        dtypes = {k: v.dtype for k, v in self.tensors.items() if v.is_floating_point()}
        self.h = h.to(device, self.h.dtype)
        # Copies: an estimator may update its entries in place (UORO's w_tilde), which must not reach ``state``.
        self.tensors = {
            k: v.to(device, dtypes.get(k, v.dtype) if v.is_floating_point() else v.dtype, copy=True)
            for k, v in tensors.items()
        }
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self.step = step
        if self.health is not None:  # in place: the states made from this one share the record
            saved = state.get("health")
            if saved is None:  # saved without one (before records existed, or made by hand): nothing recorded
                self.health.zero_()
            else:
                self.health.copy_(saved)
        for note in notes:
            warnings.warn(f"OnlineState.load_state_dict: {note}", UserWarning, stacklevel=2)

    def _checked(self, state: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], int, list[str]]:
        """``(h, tensors, step, warnings)`` of a saved state that fits this one (see :meth:`load_state_dict`),
        without changing this state; raise ``ValueError`` naming what does not fit."""
        where = "OnlineState.load_state_dict"
        needed = {"h", "tensors", "generator", "step"}
        if not isinstance(state, dict) or not needed <= set(state):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{where}: expected a state_dict() with keys {sorted(needed)}, got {got}.")
        redo = "make the state to load into with initial_state of the estimator that saved it"
        saved_kind = state.get("kind")
        if saved_kind is not None and not isinstance(saved_kind, str):
            raise ValueError(f"{where}: the saved 'kind' must be an estimator's name or None, got {saved_kind!r}.")
        if saved_kind is not None and self.kind is not None and saved_kind != self.kind:
            raise ValueError(
                f"{where}: the saved state belongs to a {saved_kind!r} estimator, this one to a {self.kind!r}"
                f" estimator; their influence approximations differ. Restore it into the state of a {saved_kind!r}"
                f" estimator ({redo})."
            )
        h = state["h"]
        if not isinstance(h, torch.Tensor) or h.shape != self.h.shape or not h.is_floating_point():
            got = f"{h.dtype} {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__
            start = f", with h0 of shape {tuple(h.shape)} on a cell of that hidden size" if got[0] == "t" else ""
            raise ValueError(
                f"{where}: the saved hidden states h are {got}, this state's are {self.h.dtype}"
                f" {tuple(self.h.shape)} (streams, hidden size); {redo}{start}."
            )
        step = _saved_step(state["step"], where)
        tensors = state["tensors"]
        if not isinstance(tensors, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
        ):
            got = {k: type(v).__name__ for k, v in tensors.items()} if isinstance(tensors, dict) else tensors
            raise ValueError(
                f"{where}: the saved 'tensors' must map entry names to tensors (the influence approximation), got"
                f" {type(tensors).__name__} {got!r:.200}; {redo}."
            )
        tensors = dict(tensors)
        if self.kind is not None:  # a state made by hand has no estimator to say what it holds
            self._check_entries(tensors, where, redo)
        notes = self._fit_windows(tensors, step, where) if self.kind is not None else []
        for name, value in [("h (the hidden states)", h), *((f"entry {k!r}", v) for k, v in tensors.items())]:
            # (a meta tensor has no values to check: shape inference)
            if value.is_floating_point() and not value.is_meta and not bool(torch.isfinite(value).all()):
                raise ValueError(
                    f"{where}: the saved {name} holds NaN/inf values: the state was saved from a run that had"
                    " diverged (or the file is damaged) and cannot continue; resume from an earlier checkpoint, or"
                    " start the streams afresh (initial_state)."
                )
        health = state.get("health")
        if health is not None and (
            not isinstance(health, torch.Tensor) or health.shape != (3,) or health.dtype != torch.int64
        ):
            got = f"{health.dtype} {tuple(health.shape)}" if isinstance(health, torch.Tensor) else repr(health)
            raise ValueError(
                f"{where}: the saved 'health' must be None or the int64 (3,) record of the first NaN/inf, got {got};"
                f" {redo}."
            )
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError(f"{where}: the saved state and this one disagree on having a noise generator; {redo}.")
        if self.generator is not None:
            try:  # on a scratch generator: this state is left as it was if the saved one does not fit
                torch.Generator(device=self.generator.device).set_state(state["generator"])
            except (RuntimeError, TypeError, ValueError) as error:
                raise ValueError(
                    f"{where}: the saved generator state does not fit this state's {self.generator.device} noise"
                    f" generator ({error}); it must be Generator.get_state() of such a generator: {redo}."
                ) from error
        return h, tensors, step, notes

    def _check_entries(self, saved: dict[str, torch.Tensor], where: str, redo: str) -> None:
        """The saved entries against this state's: names, shapes (but for ``varying_dims``) and kinds of dtype.
        An entry that is empty along one of its varying dims (a window saved before its first step) is replaced
        in ``saved`` by this state's empty entry."""
        mine = self.tensors
        if set(saved) != set(mine):
            raise ValueError(
                f"{where}: the saved state holds the entries {sorted(saved)}, this one {sorted(mine)}"
                f" (missing {sorted(set(mine) - set(saved))}, unexpected {sorted(set(saved) - set(mine))}); the"
                f" estimators differ: {redo}."
            )
        for key, value in list(saved.items()):
            want, varying = mine[key], self.varying_dims.get(key, ())
            same_kind = value.is_floating_point() == want.is_floating_point() and (
                value.is_floating_point() or value.dtype == want.dtype
            )
            empty = value.dim() == want.dim() and value.shape[:1] == want.shape[:1]
            if same_kind and empty and any(value.shape[d] == 0 for d in varying):
                shape = [0 if d in varying else n for d, n in enumerate(want.shape)]
                saved[key] = want.new_zeros(shape)  # an empty window: its other sizes carry no information
                continue
            same_shape = value.dim() == want.dim() and all(
                a == b or d in varying for d, (a, b) in enumerate(zip(value.shape, want.shape, strict=True))
            )
            if not (same_shape and same_kind):
                dims = ["*" if d in varying else str(n) for d, n in enumerate(want.shape)]
                pattern = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
                raise ValueError(
                    f"{where}: the saved entry {key!r} is {value.dtype} {tuple(value.shape)}, this state needs"
                    f" {want.dtype} {pattern} (* varies); the cell or the estimator's options differ: {redo}."
                )

    def _fit_windows(self, saved: dict[str, torch.Tensor], step: int, where: str) -> list[str]:
        """Cut a saved window longer than this state's to its last ``length`` steps (in ``saved``); the warnings
        to give. Raise if the saved window entries disagree on their length."""
        windows = {k: v for k, v in self.windows.items() if k in saved}
        if not windows:
            return []
        sizes = {k: saved[k].shape[dim] for k, (dim, _) in windows.items()}
        size, length = max(sizes.values()), min(n for _, n in windows.values())
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"{where}: the saved window entries hold {sizes} steps; a window holds the same number of steps in"
                " every entry: the state is damaged or made by hand."
            )
        if size == 0 and step > 0:
            # No estimator saves this: after s >= 1 steps a window of k >= 1 steps holds min(s, k) >= 1 of them.
            return [
                f"the saved window is empty after {step} steps, which no window is (after s >= 1 steps a window of k"
                " steps holds min(s, k) >= 1 of them): the state was made by hand or is damaged. Loaded as it is:"
                f" the window fills up over the next {length} steps, whose gradients go back fewer than {length}"
                " steps."
            ]
        notes = []
        if size > step:
            notes.append(
                f"the saved window holds {size} steps after only {step} steps, more than were taken: the state was"
                " made by hand or is damaged (or its 'step' is wrong). Loaded as it is."
            )
        if size > length:
            for key, (dim, _) in windows.items():
                saved[key] = saved[key].narrow(dim, size - length, length)
            return [
                *notes,
                f"the saved window holds the last {size} steps, this state's estimator keeps {length} (e.g."
                f" TruncatedBPTT(k={length}) resuming a state of k={size}): loaded its last {length} steps, as that"
                " estimator would hold them; gradients now go back that many steps.",
            ]
        if size < min(step, length):
            return [
                f"the saved window holds {size} steps after {step} steps: it was saved with a window of {size} steps"
                f" (e.g. TruncatedBPTT(k={size})), this state's estimator keeps {length}; the window fills up over"
                f" the next {length - size} steps, whose gradients go back fewer than {length} steps."
            ]
        return notes


def _saved_step(value: Any, where: str) -> int:
    """The saved step count as an int: a non-negative integer given as an int, a NumPy integer or a one-element
    integer tensor of any integer dtype (:meth:`OnlineState.state_dict` saves a 0-d int64 tensor). A bool, a float
    (even ``3.0``) or anything else is a ``ValueError``: a step count is never fractional, and a bool is no count."""
    is_bool = isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool)
    try:
        count = None if is_bool else operator.index(value)  # int, NumPy integers, integer tensors of one element
    except TypeError:
        count = None
    if count is None or count < 0:
        kind = f"{value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value)
        kind = kind if isinstance(kind, str) else kind.__name__
        raise ValueError(
            f"{where}: the saved 'step' must be a non-negative integer (the steps taken: an int, a NumPy integer or a"
            f" one-element integer tensor), got {value!r} ({kind}); it is the number of steps the state has taken"
            " since initial_state, as state_dict() saves it."
        )
    return count
