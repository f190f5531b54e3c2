"""The interface every online gradient estimator shares, so they can be swapped and compared.

    est = UORO(cell)                        # or RTRL(cell), TruncatedBPTT(cell, k=...)
    state = est.initial_state(h0)           # h0: (B, H)
    h, state = est.step(x_t, state)         # x_t: (B, I) -> h_t: (B, H)
    grads = est.gradient(state, grad_h)     # grad_h = dL_t/dh_t (B, H) -> {name: tensor} like cell.named_parameters()

``gradient`` is the estimate of ``dL_t/dtheta`` through the whole history (RTRL exactly, UORO unbiased,
truncated BPTT through the last ``k`` steps), summed over the streams (``per_stream=True`` keeps them apart:
``(B, *shape)``). Summing ``gradient`` over ``t`` estimates the gradient of ``L = sum_t L_t``.

Which cells an estimator takes is declared in one place, its :meth:`OnlineGradientEstimator.cell_problem`; its
constructor refuses a cell for which that gives a reason, and the refusal names the estimators that can train the
cell (:func:`estimators_for`, which asks every estimator's ``cell_problem``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from lightning_ortho._native.guard import real_cpu
from lightning_ortho.nn import _checks
from lightning_ortho.online.health import GRADIENT, STEP, new_record, read_failure, record_failure
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, linearize
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.threads import ThreadSetting, call_thread_count, check_num_threads


class Advance(NamedTuple):
    """What a step computes (:meth:`OnlineGradientEstimator._advance_step`), before its checks.

    Attributes:
        h_new: ``(B, H)`` the new state.
        tensors: the new influence entries.
        commit: ``None``, or a function that writes in place what the step updates in place (called after the
            NaN/inf checks, so that an error raised at once leaves the state passed in as it was).
        verdict: ``None``, or the sum of ``x``, ``h_new`` and every watched influence entry as a Python float,
            where it came for free (a fused C pass): a finite verdict is a finite step (a NaN/inf entry makes the sum
            NaN/inf), so the template reads no tensor; a NaN/inf one sends the step to the template's checks, which
            look entry by entry (finite entries whose sum overflowed raise nothing).
    """

    h_new: torch.Tensor
    tensors: dict[str, torch.Tensor]
    commit: Callable[[], None] | None = None
    verdict: float | None = None


class _StepContext:
    """The context of a step's or a gradient's arithmetic outside ``torch.compile``: autograd off (what
    ``torch.no_grad()`` does, at a tenth of its cost: a step at one stream is a few microseconds) and, when
    ``quiet``, the NaN/inf checks of the layers of :mod:`lightning_ortho.nn` off (:attr:`check_every`)."""

    __slots__ = ("quiet", "grad", "checks")

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __enter__(self) -> None:
        self.grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        if self.quiet:
            self.checks, _checks._FINITE_CHECKS = _checks._FINITE_CHECKS, False

    def __exit__(self, *exc: object) -> None:
        torch._C._set_grad_enabled(self.grad)
        if self.quiet:
            _checks._FINITE_CHECKS = self.checks


class OnlineGradientEstimator:
    """Base class: input checks, resets and the layout of the cell's parameters.

    Args:
        cell: any ``nn.Module`` with ``cell(x, h) -> h_new`` whose parameters all live in it.
        closed_form: use the cell's closed-form Jacobian products when it has them (``cell.linearize``);
            ``False`` forces the generic ``torch.func`` path (tests compare the two).

    Subclasses implement :meth:`_initial_tensors`, :meth:`_advance` and :meth:`_gradient_flat`; an estimator
    whose state entries change size from step to step lists those dims in ``varying_dims`` (checked on load), and
    entries that are windows of the last steps in ``windows`` (a longer saved window is cut on load).

    The cell is checked here against :meth:`cell_problem` with the estimator's default options (a subclass checks
    the options it is given that decide which cells it takes); a refusal raises ``ValueError`` naming the reason
    and the estimators that can train the cell.

    Every input is checked here, once for all estimators: its shape against the state and against the cell's
    ``input_size`` and ``hidden_size`` (where the cell has them), its dtype, and NaN/inf. The shape checks are
    Python comparisons. The NaN/inf checks of a step (``x``, the new state, the influence approximation) and of
    a gradient (``grad_h``, the estimate) read a value on the host, which stalls a GPU and which
    ``torch.compile`` cannot trace: :attr:`check_every` says how often that happens.

    Subclasses write a step as :meth:`_advance_step` (the default linearises the cell and calls :meth:`_advance`);
    the template around it checks the inputs, the result and NaN/inf the same way for every estimator.

    Attributes:
        num_threads: CPU threads for each :meth:`step` and :meth:`gradient` call (``torch.set_num_threads``,
            process-wide, given back when the call returns or raises). ``"auto"`` (the default) runs states of
            ``H <= 256`` on the CPU on one thread, whose tiny operations a thread pool slows down many times on a
            busy machine (:mod:`lightning_ortho.online.threads`), unless the user chose a count
            (``torch.set_num_threads`` after importing this package, ``OMP_NUM_THREADS``); an ``int`` runs the
            calls on that many; ``None`` leaves torch's count.
        check_every: how often the NaN/inf checks read their verdict on the host (see :attr:`check_every`).
    """

    name = "estimator"
    #: Whether the estimator steps a complex state (a cell with ``complex_state = True``); the others refuse one.
    complex_states: bool = False
    #: ``{state entry: dims}`` whose sizes vary from step to step (see :class:`OnlineState`).
    varying_dims: dict[str, tuple[int, ...]] = {}
    #: ``{state entry: (dim, length)}``: sliding windows of the last ``length`` steps (see :class:`OnlineState`).
    windows: dict[str, tuple[int, int]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # an estimator of its own (a subclass that keeps its parent's name is that one)
            _ESTIMATORS.setdefault(cls.name, cls)

    def __init__(self, cell: nn.Module, *, closed_form: bool = True) -> None:
        if not isinstance(cell, nn.Module):
            raise TypeError(f"{type(self).__name__}: cell must be an nn.Module with cell(x, h) -> h_new, got {cell!r}.")
        self.cell = cell
        self.closed_form = closed_form
        self.num_threads = "auto"
        self.check_every = 1
        self.layout = ParameterLayout(cell)
        self._require_cell()
        # The sizes the cell declares (every cell of this package does): x and h0 are checked against them.
        self.input_size = _declared_size(cell, "input_size")
        self.hidden_size = _declared_size(cell, "hidden_size")

    @property
    def num_threads(self) -> ThreadSetting:
        """CPU threads for each :meth:`step` and :meth:`gradient` call: ``"auto"``, a positive ``int`` or ``None``
        (see the class docstring's Attributes). Setting another value raises ``ValueError``."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, value: ThreadSetting) -> None:
        self._num_threads = check_num_threads(value, type(self).__name__)

    @property
    def check_every(self) -> int | None:
        """How often the NaN/inf checks of :meth:`step` and :meth:`gradient` stop to read their verdict.

        * ``1`` (the default): every call; a NaN/inf raises at once, from the call that met it, with its cause
          (one host synchronisation per call, free on a CPU, a stall of the queue on a GPU);
        * ``k > 1``: every call *records* a failure on the state's device without reading it (the state's
          ``health``, :mod:`lightning_ortho.online.health`), and every ``k``-th step reads the record
          (:meth:`check`): the error names the step and the tensor where NaN/inf first appeared, up to ``k - 1``
          steps late;
        * ``None``: record only; the caller reads the record with :meth:`check`, e.g. once per update window, as
          :class:`~lightning_ortho.models.OnlineRNNModule` does.

        Under ``torch.compile`` every call records (a compiled region cannot stop to read a value): call
        :meth:`check` outside it. Setting anything else raises ``ValueError``.
        """
        return self._check_every

    @check_every.setter
    def check_every(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(
                f"{type(self).__name__}: check_every must be a positive int (steps between NaN/inf checks; 1 checks"
                f" every call) or None (the caller checks with .check(state)), got {value!r}."
            )
        self._check_every = value

    def check(self, state: OnlineState) -> None:
        """Raise the error of the first NaN/inf that a call on ``state``'s run recorded (see :attr:`check_every`);
        nothing when none was recorded. One host synchronisation.

        Raises:
            ValueError: the step's input ``x`` or the gradient's ``grad_h`` held NaN/inf (the step is named).
            FloatingPointError: the cell produced NaN/inf states, the influence approximation overflowed, or the
                estimate held NaN/inf (the step and the tensor are named, with the parameters that hold NaN/inf).
        """
        failure = read_failure(getattr(state, "health", None))
        if failure is None:
            return
        step, kind, index = failure
        where = type(self).__name__
        if kind == GRADIENT:
            if index == 0:
                raise ValueError(
                    f"{where}.gradient: grad_h held NaN or inf values at step {step}; check the data and the loss."
                )
            raise FloatingPointError(
                f"{where}.gradient: the estimate held NaN/inf at step {step}{self._nonfinite_parameters()}."
            )
        names = ["x", "h", *self._watched_names(state.tensors)]
        name = names[index] if 0 <= index < len(names) else "?"
        if name == "x":
            raise ValueError(f"{where}.step: x held NaN or inf values at step {step}; check the data and the loss.")
        if name == "h":
            raise FloatingPointError(
                f"{where}.step: the cell produced NaN/inf states at step {step}{self._nonfinite_parameters()}."
            )
        bad = [n for n, p in self.cell.named_parameters() if not torch.isfinite(p).all()]
        cause = (
            self._nonfinite_parameters()
            if bad
            else " (found by a recorded check: check_every=1 names the cause at the step itself); lower the learning"
            " rate, clip gradients, rescale the inputs, reset the streams more often, or run in float64"
        )
        raise FloatingPointError(
            f"{where}.step: its influence approximation {name!r} overflowed at step {step}{cause}."
        )

    # -- which cells ------------------------------------------------------------------------------------------
    @classmethod
    def cell_problem(cls, cell: nn.Module, **options: Any) -> str | None:
        """Why this estimator cannot train ``cell`` with ``options``, or ``None`` when it can.

        The one declaration of the cells an estimator takes: its constructor refuses a cell for which this gives a
        reason, and :func:`estimators_for` asks it (with the default options) to name the estimators that can train
        a refused cell. Cheap where it can be (a check that must probe the cell probes it once: see
        :func:`~lightning_ortho.online.linearization.factorisation_problem`). The base class asks for a parameter
        and, unless :attr:`complex_states`, a real state; subclasses add their needs.

        Args:
            cell: the recurrent cell.
            **options: the estimator's keyword arguments that decide which cells it takes (UORO's ``projection``);
                the defaults where left out.

        Returns:
            ``None``, or a sentence that starts with the estimator's name and says what the cell lacks.
        """
        where, kind = cls.__name__, type(cell).__name__
        if not any(True for _ in cell.parameters()):
            return f"{where}: {kind} has no parameters: there is no gradient to estimate."
        if getattr(cell, "complex_state", False) and not cls.complex_states:
            return (
                f"{where}: the state of {kind} is complex (complex_state = True), and {where} steps real states only."
            )
        return None

    def _require_cell(self, **options: Any) -> None:
        """Raise :func:`cell_refusal` when :meth:`cell_problem` refuses the cell with ``options``."""
        problem = type(self).cell_problem(self.cell, **options)
        if problem is not None:
            raise cell_refusal(problem, self.cell)

    # -- the interface ---------------------------------------------------------------------------------------
    def initial_state(self, h0: torch.Tensor) -> OnlineState:
        """The state before the first step: ``h0`` ``(B, H)`` and a zero influence approximation.

        Raises:
            ValueError: ``h0`` is not a floating ``(B, H)`` tensor with ``B >= 1`` streams and the cell's
                ``H = hidden_size``, is not of the parameters' dtype, or holds NaN/inf.
        """
        self._check(h0, "h0", dims=2)
        streams, hidden = h0.shape
        if streams < 1 or hidden < 1 or (self.hidden_size is not None and hidden != self.hidden_size):
            want = f"(streams >= 1, {self.hidden_size if self.hidden_size is not None else 'H >= 1'})"
            raise ValueError(
                f"{type(self).__name__}.initial_state: h0 must have shape {want}: one row per stream, one column per"
                f" unit of the cell, got {tuple(h0.shape)}; e.g. h0 = torch.zeros(streams, cell.hidden_size)."
            )
        self._check_finite(h0, "h0")
        dtypes = {p.dtype for p in self.cell.parameters()}
        if dtypes != {h0.dtype}:
            names = ", ".join(sorted(str(d) for d in dtypes))
            raise ValueError(
                f"{type(self).__name__}: h0 is {h0.dtype} but the cell's parameters are {names}; convert one of them"
                " (e.g. cell.double() for float64 references)."
            )
        tensors = self._initial_tensors(h0)
        return OnlineState(
            h0,
            tensors,
            self._new_generator(h0),
            kind=self.name,
            varying_dims=self.varying_dims,
            windows=self.windows,
            health=new_record(h0.device),
        )

    def step(self, x: torch.Tensor, state: OnlineState) -> tuple[torch.Tensor, OnlineState]:
        """Advance every stream one step: ``x`` ``(B, I)`` -> ``(h_t (B, H), new state)``, on :attr:`num_threads`.

        Raises:
            ValueError: ``x`` is not ``(B, I)`` with the state's ``B``, dtype and device and the cell's
                ``I = input_size``, or holds NaN/inf; the cell returns another shape than the state's.
            FloatingPointError: the new state or the influence approximation is NaN/inf (the message names the
                parameters that hold NaN/inf, if any).
        """
        fused = self._fused_step(x, state)
        if fused is not None and math.isfinite(fused.verdict):  # the whole step in one call, finite: settled
            step = state.step + 1
            new_state = state._advanced(fused.h_new, fused.tensors, step)
            every = self._check_every
            if every is not None and every > 1 and step % every == 0:
                self.check(new_state)
            return fused.h_new, new_state
        threads = None if torch.compiler.is_compiling() else self._call_threads(state)
        if threads is None:
            return self._step(x, state, fused)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return self._step(x, state, fused)
        finally:
            torch.set_num_threads(previous)

    def _step(
        self, x: torch.Tensor, state: OnlineState, fused: Advance | None = None
    ) -> tuple[torch.Tensor, OnlineState]:
        """:meth:`step` on the current thread count: the one template of every estimator's step.

        Checks ``x`` (Python comparisons), advances (:meth:`_advance_step`, unless ``fused``, the result of
        :meth:`_fused_step`, is given), checks NaN/inf (:meth:`_settle_step`, at once or recorded:
        :attr:`check_every`), then lets the step write what it writes in place (its ``commit``), so that an error
        raised at once leaves the state passed in as it was."""
        self._check_step_input(x, state)
        if fused is None:
            with self._call_context():
                fused = self._advance_step(x, state)
        h_new, tensors, commit, verdict = fused
        if h_new.requires_grad:
            h_new = h_new.detach()
        step = state.step + 1
        new_state = state.replace(h=h_new, tensors=tensors, step=step)
        self._settle_step(x, state, new_state, verdict)
        if commit is not None:
            commit()
        if self._check_due(step):
            self.check(new_state)
        return h_new, new_state

    def _fused_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """The whole step in one fused call, or ``None`` (the default) where none applies: then the template
        checks ``x`` and calls :meth:`_advance_step`.

        Called first, before any check of the template and outside its call context (autograd on, the caller's
        thread count): an implementation runs no PyTorch op that autograd would record, and returns an
        :class:`Advance` only where its own checks imply the template's (``x`` a ``(B, I)`` tensor of the state's
        dtype and device, ``I`` the cell's input size), with a ``verdict`` (a float), no ``commit``, and a
        ``tensors`` dict of its own (the new state takes it as it is). A finite
        verdict settles the step then and there (no other check, no other call: at one stream a step is a few
        microseconds, and every Python call of the template is a measurable part of it); a NaN/inf one goes through
        the template's checks, which name the cause."""
        return None

    def _fused_gradient(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[dict[str, torch.Tensor], float] | None:
        """The summed estimate by parameter (what :meth:`gradient` returns, in the layout's order) and its verdict
        (the sum of ``grad_h`` and of the estimate, a float) in one fused call, or ``None`` (the default) where none applies: then the template checks ``grad_h`` and calls
        :meth:`_gradient_estimate`. The contract of :meth:`_fused_step`: called first, outside the call context,
        returning only where its own checks imply the template's (``grad_h`` of the state's shape, dtype and
        device)."""
        return None

    def _advance_step(self, x: torch.Tensor, state: OnlineState) -> Advance:
        """One step under ``no_grad``: :class:`Advance` ``(h_new, tensors, commit, verdict)``. The default
        linearises the cell (:func:`~lightning_ortho.online.linearization.linearize`) and calls :meth:`_advance`;
        an estimator with a step of its own (a fused step, traces of its own) overrides this, not :meth:`_step`.

        Raises:
            ValueError: the cell returned another shape or dtype than the state's.
        """
        lin = linearize(self.cell, x, state.h, self.layout, closed_form=self.closed_form)
        self._check_step_output(lin.h_new, state)
        return Advance(lin.h_new, self._advance(lin, x, state))

    def _check_step_output(self, h_new: torch.Tensor, state: OnlineState) -> None:
        """The cell's new state must have the shape and dtype of ``state.h`` (Python comparisons)."""
        if h_new.shape != state.h.shape:
            raise ValueError(
                f"{type(self).__name__}.step: the cell returned shape {tuple(h_new.shape)} from h of shape"
                f" {tuple(state.h.shape)}; h0 must have one column per unit of the cell (its hidden size)."
            )
        if h_new.dtype != state.h.dtype:
            raise ValueError(
                f"{type(self).__name__}.step: {type(self.cell).__name__} returned {h_new.dtype} states from h"
                f" of {state.h.dtype}; {type(self).__name__} steps a state of one real dtype. A cell whose state"
                f" is complex declares complex_state = True; {_complex_estimators()} such cells."
            )

    def _recording(self) -> bool:
        """Whether this call records its NaN/inf verdict instead of reading it (:attr:`check_every`)."""
        return self._check_every != 1 or torch.compiler.is_compiling()

    def _call_context(self):
        """The context of the arithmetic of a step or a gradient: autograd off and, when the call records its
        verdict (:meth:`_recording`), the layers of :mod:`lightning_ortho.nn` without their own NaN/inf checks (a
        host read each: the record already covers the cell's output, and a recording step reads nothing). Under
        ``torch.compile``, ``torch.no_grad()`` (the layers check nothing there anyway)."""
        if torch.compiler.is_compiling():
            return torch.no_grad()
        return _StepContext(self._check_every != 1)

    def _check_due(self, step: int) -> bool:
        """Whether the step ``step`` reads the record (``check_every = k > 1`` and ``k`` divides it, outside
        ``torch.compile``)."""
        every = self._check_every
        return every is not None and every > 1 and step % every == 0 and not torch.compiler.is_compiling()

    def _settle_step(
        self, x: torch.Tensor, state: OnlineState, new_state: OnlineState, verdict: float | None = None
    ) -> None:
        """The NaN/inf checks of a step: ``x``, the new state and the watched influence entries.

        A finite ``verdict`` (:attr:`Advance.verdict`, a fused pass's sum of them all) settles the step without
        reading a tensor, checked at once or recorded alike. Otherwise, at once (:attr:`check_every` ``= 1``): one
        host synchronisation for all of them (one sum per entry; on a failure the entries are examined one by one,
        so finite entries whose sum overflowed raise nothing); recorded
        (:func:`~lightning_ortho.online.health.record_failure`, no synchronisation) where the call records.
        Nothing on meta tensors (shape inference)."""
        if verdict is not None and math.isfinite(verdict):
            return
        h_new = new_state.h
        if h_new.is_meta:
            return
        watched = self._watched_values(new_state.tensors)
        if self._recording():
            if verdict is None and _reads_are_free(h_new):  # the sums the at-once check reads, read for nothing
                verdict = _finite_sum([x, h_new, *watched.values()])
                if math.isfinite(verdict):
                    return
            if new_state.health is None:  # a state made by hand: it gets a record of its own
                new_state.health = state.health = new_record(h_new.device)
            record_failure(new_state.health, new_state.step, STEP, [x, h_new, *watched.values()])
            return
        if verdict is None:
            dtype = _sum_dtype(x.dtype)
            finite = torch.isfinite(x.sum(dtype=dtype)) & torch.isfinite(h_new).all()
            for value in watched.values():
                finite = finite & torch.isfinite(value.sum(dtype=_sum_dtype(value.dtype)))
            if bool(finite):
                return
        self._check_finite(x, "x")  # else finite entries whose sum overflowed: the checks below look one by one
        self._check_finite_step(h_new, new_state.tensors, new_state.step, inputs={"x": x, "h": state.h})

    def _watched_values(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The watched entries (:meth:`_watched_tensors`) that hold floating values."""
        return {
            name: value
            for name, value in self._watched_tensors(tensors).items()
            if (value.is_floating_point() or value.is_complex()) and value.numel()
        }

    def _watched_names(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        """The names of :meth:`_watched_values`, in the order a recorded failure indexes them (after ``x`` and
        ``h``)."""
        return list(self._watched_values(tensors))

    def gradient(
        self, state: OnlineState, grad_h: torch.Tensor, *, per_stream: bool = False
    ) -> dict[str, torch.Tensor]:
        """The estimate of ``dL_t/dtheta`` given ``grad_h = dL_t/dh_t`` ``(B, H)`` at the state's step.

        Returns ``{name: tensor}`` with the shapes of ``cell.named_parameters()`` (summed over streams), or
        ``(B, *shape)`` per stream with ``per_stream=True``.

        Raises:
            ValueError: ``grad_h`` is not ``(B, H)`` like the state's ``h``, or holds NaN/inf.
            FloatingPointError: the estimate is NaN/inf (e.g. a parameter holds NaN: the message names it).
        """
        fused = None if per_stream else self._fused_gradient(state, grad_h)
        if fused is not None:
            if math.isfinite(fused[1]):  # one call, finite: settled
                return fused[0]
            fused = (torch.cat([value.reshape(-1) for value in fused[0].values()]), fused[1])  # checked below
        threads = None if torch.compiler.is_compiling() else self._call_threads(state)
        if threads is None:
            return self._gradient(state, grad_h, per_stream, fused)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return self._gradient(state, grad_h, per_stream, fused)
        finally:
            torch.set_num_threads(previous)

    def _gradient(
        self, state: OnlineState, grad_h: torch.Tensor, per_stream: bool, fused: tuple | None = None
    ) -> dict[str, torch.Tensor]:
        """:meth:`gradient` on the current thread count (``fused``: the result of :meth:`_fused_gradient`)."""
        self._check(grad_h, "grad_h", dims=2, like=state.h, same_shape=True)
        if fused is not None:
            flat, verdict = fused
        else:
            with self._call_context():  # a gradient that replays the cell (TruncatedBPTT) calls it
                if per_stream:
                    flat, verdict = self._gradient_flat(state, grad_h), None
                else:
                    flat, verdict = self._gradient_estimate(state, grad_h)
        if verdict is not None and math.isfinite(verdict):  # a fused pass summed grad_h and the estimate: finite
            return self.layout.views(flat)
        if self._recording():  # no synchronisation: read by check() (check_every)
            if verdict is None and _reads_are_free(flat) and math.isfinite(_finite_sum([grad_h, flat])):
                return self.layout.views(flat)
            if state.health is None:  # a state made by hand: it gets a record of its own
                state.health = new_record(flat.device)
            record_failure(state.health, max(state.step, 1), GRADIENT, [grad_h, flat])
            return self.layout.views(flat)
        # One host synchronisation for both the input and the result; the diagnosis runs only when one fails.
        # A meta tensor has no values to check (shape inference): its shapes are all there is.
        if not flat.is_meta and (verdict is not None or not self._finite_estimate(grad_h, flat)):
            self._check_finite(grad_h, "grad_h")
            if not bool(torch.isfinite(flat).all()):  # else finite entries whose sum overflowed: no error
                raise FloatingPointError(
                    f"{type(self).__name__}.gradient: the estimate holds NaN/inf at step {state.step}"
                    f"{self._nonfinite_parameters()}."
                )
        return self.layout.views(flat)

    def reset(self, state: OnlineState, mask: torch.Tensor, h0: torch.Tensor | None = None) -> OnlineState:
        """Restart the streams where ``mask`` ``(B,)`` is true: their state becomes ``h0`` (``(B, H)`` or
        ``(H,)``; zeros when ``None``) and their influence approximation zero; the others are untouched.

        Raises:
            ValueError: ``mask`` is not a boolean ``(B,)`` tensor, or ``h0`` has the wrong shape, is not floating
                point or holds NaN/inf.
        """
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (state.batch_size,):
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(
                f"{type(self).__name__}.reset: mask must be a bool tensor of shape ({state.batch_size},), got {shape}."
            )
        batch, hidden = state.h.shape
        if h0 is not None and (
            not isinstance(h0, torch.Tensor) or tuple(h0.shape) not in ((hidden,), (1, hidden), (batch, hidden))
        ):
            shape = tuple(h0.shape) if isinstance(h0, torch.Tensor) else type(h0).__name__
            raise ValueError(
                f"{type(self).__name__}.reset: h0 must have shape ({batch}, {hidden}) or ({hidden},), got {shape}."
            )
        if h0 is not None:
            if not h0.is_floating_point():
                raise ValueError(
                    f"{type(self).__name__}.reset: h0 must be floating point, got {h0.dtype}; convert it with .float()."
                )
            self._check_finite(h0, "h0", where=f"{type(self).__name__}.reset")
        start = torch.zeros_like(state.h) if h0 is None else h0.to(state.h).expand_as(state.h)
        keep = ~mask
        h = torch.where(keep[:, None], state.h, start)
        tensors = {k: self._reset_tensor(k, v, keep) for k, v in state.tensors.items()}
        return state.replace(h=h, tensors=tensors)

    # -- for subclasses ----------------------------------------------------------------------------------------
    def _call_threads(self, state: OnlineState) -> int | None:
        """The thread count for a call on ``state`` (:attr:`num_threads`), or ``None`` to keep the current one."""
        setting = self._num_threads
        if setting is None or (setting == "auto" and torch.get_num_threads() == 1):
            return None
        h = state.h if isinstance(state, OnlineState) else None
        if not isinstance(h, torch.Tensor) or h.dim() != 2:
            return None  # nothing to decide on: the checks of the call itself say what is wrong
        return call_thread_count(setting, h.shape[1], h.device)

    def _check_step_input(self, x: torch.Tensor, state: OnlineState) -> None:
        """Type, shape, dtype and device of a step's ``x`` (no host synchronisation; NaN/inf is checked apart)."""
        self._check(x, "x", dims=2, like=state.h)
        if self.input_size is not None and x.shape[1] != self.input_size:
            raise ValueError(
                f"{type(self).__name__}.step: x must have shape ({state.batch_size}, {self.input_size}) (streams,"
                f" the cell's input_size), got {tuple(x.shape)}; give each step's inputs as (streams, features)."
            )

    def _finite_estimate(self, grad_h: torch.Tensor, flat: torch.Tensor) -> bool:
        """False when ``grad_h`` or the estimate ``flat`` may hold NaN/inf, read with one host synchronisation
        (false may also be finite entries whose sum overflowed: :meth:`gradient` confirms entry by entry before
        raising)."""
        return bool(torch.isfinite(grad_h).all() & torch.isfinite(flat).all())

    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _watched_tensors(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The state entries whose overflow :meth:`step` checks (all of them; a subclass may skip redundant ones)."""
        return tensors

    def _check_finite_step(
        self,
        h_new: torch.Tensor,
        tensors: dict[str, torch.Tensor],
        step: int,
        inputs: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Raise ``FloatingPointError`` if the new state ``h_new`` or a watched influence tensor holds NaN/inf.

        ``inputs`` (``{"x": x, "h": h}``, the step's input and previous state) serve the diagnosis only: when an
        influence tensor is not finite, the message says whether a row of one of them has a norm that overflows its
        dtype (the randomised estimators divide by such norms), or, at step 1, that the immediate derivatives
        alone overflowed (the influence before them is zero, so the recurrence is not the cause). Nothing is
        checked on meta tensors (no values; shape inference).

        One host synchronisation for all of them. ``h_new`` is checked entry by entry; each influence tensor by
        one sum (a single pass where ``isfinite`` takes several: an inf or NaN entry makes the sum inf or NaN).
        The sum accumulates in at least float32 (:func:`_sum_dtype`), so finite float16 entries never add up
        past float16's 65504; a sum that still overflows its dtype (finite entries near the top of the range)
        is confirmed entry by entry before anything is raised, so finite entries never raise.
        """
        if h_new.is_meta:
            return
        watched = self._watched_values(tensors)
        finite = torch.isfinite(h_new).all()
        for value in watched.values():
            finite = finite & torch.isfinite(value.sum(dtype=_sum_dtype(value.dtype)))
        if bool(finite):
            return
        # The error path: find what is not finite, entry by entry.
        if not torch.isfinite(h_new).all():
            raise FloatingPointError(
                f"{type(self).__name__}.step: the cell produced NaN/inf states at step {step}"
                f"{self._nonfinite_parameters()}."
            )
        for name, value in watched.items():
            if not torch.isfinite(value).all():
                raise FloatingPointError(
                    f"{type(self).__name__}.step: its influence approximation {name!r} overflowed at step {step}"
                    f"{self._overflow_cause(inputs or {}, step)}"
                )

    def _overflow_cause(self, inputs: dict[str, torch.Tensor], step: int) -> str:
        """The end of the message of an overflowed influence approximation (:func:`_overflow_cause`; a subclass may
        name causes of its own first). Error path only."""
        return _overflow_cause(inputs, step)

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        """``(P,)``: the estimate summed over streams (subclasses may skip the per-stream ``(B, P)`` temporary)."""
        return self._gradient_flat(state, grad_h).sum(0)

    def _gradient_estimate(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        """``(estimate (P,), verdict)``: :meth:`_gradient_summed` and ``None``, or, from a fused pass, the sum of
        ``grad_h`` and the estimate as a Python float (a finite verdict settles the gradient's NaN/inf check
        without reading a tensor; see :class:`Advance`)."""
        return self._gradient_summed(state, grad_h), None

    def _new_generator(self, h0: torch.Tensor) -> torch.Generator | None:
        return None

    def _reset_tensor(self, name: str, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Zero a reset stream's entry (streams on dim 0)."""
        return value * keep.view(-1, *([1] * (value.dim() - 1))).to(value.dtype)

    def _nonfinite_parameters(self) -> str:
        """The end of a NaN/inf error message: which parameters hold NaN/inf and what to do (error path only)."""
        bad = [name for name, p in self.cell.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            return (
                f": the cell's parameters {bad} hold NaN/inf (a diverged or underflowed update: lower the learning"
                " rate, clip gradients, or train in a wider dtype; in float16 Adam's eps rounds to zero)"
            )
        return (
            "; the parameters are finite, so the inputs or the state have blown up: lower the learning rate, clip"
            " gradients, or reset the streams more often"
        )

    def _check_finite(self, tensor: torch.Tensor, name: str, where: str | None = None) -> None:
        if tensor.is_meta:  # no values to check (shape inference)
            return
        if not torch.isfinite(tensor).all():
            raise ValueError(
                f"{where or type(self).__name__}: {name} holds NaN or inf values; check the data and the loss."
            )

    def _check(
        self,
        tensor: torch.Tensor,
        name: str,
        *,
        dims: int,
        like: torch.Tensor | None = None,
        same_shape: bool = False,
    ) -> None:
        """Type, shape, dtype and device of an input (no host synchronisation; NaN/inf: :meth:`_check_finite`)."""
        where = type(self).__name__
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{where}: {name} must be a tensor, got {type(tensor).__name__}.")
        if tensor.dim() != dims:
            raise ValueError(f"{where}: {name} must be (streams, features), got shape {tuple(tensor.shape)}.")
        if tensor.is_complex():
            raise ValueError(
                f"{where}: {name} is {tensor.dtype}, but {where} takes real states and inputs only: a cell whose state"
                f" is complex declares complex_state = True, and {_complex_estimators()} such cells."
            )
        if not tensor.is_floating_point():
            raise ValueError(f"{where}: {name} must be floating point, got {tensor.dtype}; convert it with .float().")
        if like is not None:
            if tensor.shape[0] != like.shape[0] or (same_shape and tensor.shape != like.shape):
                want = tuple(like.shape) if same_shape else (like.shape[0], "...")
                raise ValueError(f"{where}: {name} must have shape {want} like the state, got {tuple(tensor.shape)}.")
            if tensor.dtype != like.dtype or tensor.device != like.device:
                raise ValueError(
                    f"{where}: {name} is {tensor.dtype} on {tensor.device} but the state is {like.dtype} on"
                    f" {like.device}; convert one of them (the cell's parameters must match too)."
                )


#: Every estimator class by its ``name``, filled as each is defined (:meth:`OnlineGradientEstimator.__init_subclass__`).
_ESTIMATORS: dict[str, type[OnlineGradientEstimator]] = {}


def estimators_for(cell: nn.Module) -> tuple[type[OnlineGradientEstimator], ...]:
    """The estimators that can train ``cell`` with their default options (their
    :meth:`~OnlineGradientEstimator.cell_problem` gives no reason), in the order of their class names.

    A check that fails to run on ``cell`` (an error other than its verdict) leaves that estimator out: its
    constructor would fail the same way.
    """
    found = []
    for cls in sorted(_ESTIMATORS.values(), key=lambda c: c.__name__):
        try:
            takes = cls.cell_problem(cell) is None
        except Exception:  # advice only: an estimator whose check cannot run on the cell is not named
            takes = False
        if takes:
            found.append(cls)
    return tuple(found)


def trainers_sentence(cell: nn.Module) -> str:
    """The sentence of a refusal that names the estimators that can train ``cell`` (:func:`estimators_for`) with
    their names in :class:`~lightning_ortho.models.OnlineRNNModule`, or says that none can."""
    kind = type(cell).__name__
    found = estimators_for(cell)
    if not found:
        return f"No estimator of lightning_ortho.online can train {kind}."
    classes = ", ".join(c.__name__ for c in found)
    names = " | ".join(repr(c.name) for c in found)
    return f"Estimators that can train {kind}: {classes} (OnlineRNNModule's estimator={names})."


def cell_refusal(problem: str, cell: nn.Module) -> ValueError:
    """The ``ValueError`` an estimator raises when it cannot train ``cell``: ``problem`` (the reason, from
    :meth:`~OnlineGradientEstimator.cell_problem` or the estimator's own check) and :func:`trainers_sentence`."""
    return ValueError(f"{problem} {trainers_sentence(cell)}")


def _complex_estimators() -> str:
    """``"DiagonalRTRL trains"`` (the estimators with ``complex_states``), for messages about complex states."""
    found = sorted(c.__name__ for c in _ESTIMATORS.values() if c.complex_states)
    if not found:
        return "no estimator of lightning_ortho.online trains"
    return f"{', '.join(found)} {'trains' if len(found) == 1 else 'train'}"


def _reads_are_free(tensor: torch.Tensor) -> bool:
    """Whether reading a value of ``tensor`` on the host costs no synchronisation: a real CPU tensor (no device queue
    to wait for) outside ``torch.compile``, transforms and modes (:func:`~lightning_ortho._native.guard.real_cpu`).
    There a recording call reads one sum, as a call that checks at once does, and writes the record only when the
    sum is not finite: a handful of operations instead of the record's dozen."""
    return real_cpu(tensor)


def _finite_sum(tensors: list[torch.Tensor]) -> float:
    """The sum of every entry of ``tensors`` (complex ones by their real view), accumulated in at least float32, as a
    Python float (one host read): NaN/inf when one holds NaN/inf, or when finite entries overflow the sum (the
    caller then looks entry by entry)."""
    total = None
    for t in tensors:
        if t.is_complex():
            t = torch.view_as_real(t)
        part = t.sum(dtype=_sum_dtype(t.dtype))
        total = part if total is None else total + part
    return float(total) if total is not None else 0.0


def _sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to sum a tensor of ``dtype`` in for an overflow check: at least float32 (float16's range ends at
    65504, which a few thousand finite entries of size 30 pass), the dtype itself when it is wider."""
    found = _SUM_DTYPES.get(dtype)
    if found is None:  # remembered: promote_types is a dispatched op, paid at every step otherwise
        found = _SUM_DTYPES[dtype] = torch.promote_types(dtype, torch.float32)
    return found


_SUM_DTYPES: dict[torch.dtype, torch.dtype] = {}


def _overflow_cause(inputs: dict[str, torch.Tensor], step: int) -> str:
    """The end of the message of an overflowed influence approximation: what overflowed and what to do (error path
    only). ``inputs`` ``{"x": x, "h": h}`` are the step's input and previous state ``(B, ...)``."""
    for name, value in inputs.items():
        if value.dim() < 1 or not value.numel() or not torch.isfinite(value).all():
            continue  # NaN/inf entries are refused apart, before the step
        real = torch.view_as_real(value) if value.is_complex() else value
        norms = torch.linalg.vector_norm(real.reshape(real.shape[0], -1), dim=1)  # in the dtype, as the estimators
        if torch.isfinite(norms).all():
            continue
        row = int(torch.nonzero(~torch.isfinite(norms))[0])
        what = "input x" if name == "x" else "state h entering the step"
        dtype = str(real.dtype).removeprefix("torch.")
        return (
            f": the {what} of stream {row} (row {row} of {name}) is too large for {dtype}: its norm overflows (its"
            f" largest entry is {float(real[row].abs().max()):.3g}; the sum of squares passes {dtype}'s largest"
            f" value, {torch.finfo(real.dtype).max:.3g}), and the influence approximation with it. The recurrence is"
            " not the cause: rescale the inputs (e.g. standardise the features to entries of order 1) or run in"
            " float64 (cell.double(), float64 x and h0)."
        )
    if step == 1:
        return (
            ", where it holds only the immediate derivatives dh_1/dtheta (the influence before them is zero, so the"
            " recurrence is not the cause): the inputs x, h0 or the parameters are too large for the dtype. Rescale"
            " the inputs or run in float64 (cell.double(), float64 x and h0)."
        )
    return (
        " (the recurrent Jacobian has been expansive for a long time); lower the learning rate, clip gradients, or"
        " reset the streams more often."
    )


def _declared_size(cell: nn.Module, name: str) -> int | None:
    value = getattr(cell, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
