"""Exact RTRL for cells whose state Jacobian is diagonal (element-wise recurrences, the linear recurrent unit).

When ``dh'/dh = diag(a)`` and each parameter entry enters one unit ``k(p)``, the influence ``dh_t/dtheta``
(``H x P`` in Williams & Zipser's RTRL) has one nonzero per column, and RTRL keeps exactly that entry (Menick et al.
2021, SnAp-1, exact for diagonal recurrences; Zucchet et al. 2023 for the linear recurrent unit):

    e_t[p] = a_t[k(p)] e_{t-1}[p] + dh_t[k(p)]/dtheta_p      (immediate derivative),      e_0 = 0
    dL_t/dtheta_p = Re(conj(g_t[k(p)]) e_t[p])                with g_t = dL_t/dh_t

``O(P)`` memory and time per stream and step instead of RTRL's ``O(H P)`` and ``O(H^2 P)``. A complex state
(``cell.complex_state``) must be complex-linear in ``h`` (then ``a`` is a complex multiplier), and ``g`` is
PyTorch's gradient of a real loss with respect to a complex tensor, ``dL/dRe h + i dL/dIm h``.

The traces are exact only while ``dh'/dh`` stays diagonal, through every optimizer step: a cell declares that it
does with the class attribute ``diagonal_recurrence = True`` (:data:`DIAGONAL_RECURRENCE`; see :class:`DiagonalRTRL`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call, jacfwd, jacrev, jvp, vjp, vmap

from lightning_ortho._native.lru import FusedLRU
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator, _sum_dtype
from lightning_ortho.online.health import new_record
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization
from lightning_ortho.online.state import OnlineState

_COMPLEX_DTYPES = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}
_REAL_DTYPES = {value: key for key, value in _COMPLEX_DTYPES.items()}

#: The class attribute (``True``) with which a cell declares that its state Jacobian ``dh'/dh`` is diagonal for
#: every value of its parameters (an element-wise recurrence by construction, as ``LinearRecurrentUnit``'s).
DIAGONAL_RECURRENCE = "diagonal_recurrence"

#: The size of the random move of the parameters at which the structure is probed again, relative to each
#: parameter's root mean square (1 for a zero parameter): of the order of a large optimizer step.
_MOVE = 0.1


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype whose real and imaginary parts are ``dtype`` (``float64`` -> ``complex128``).

    Raises:
        ValueError: ``dtype`` has no complex counterpart (``bfloat16``, integers).
    """
    if dtype not in _COMPLEX_DTYPES:
        raise ValueError(f"a complex state needs float16/32/64 parameters, got {dtype}; convert the cell (.double()).")
    return _COMPLEX_DTYPES[dtype]


def real_part_of_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``Re(a * b)`` without forming the imaginary part (``a * b`` for real tensors)."""
    if a.is_complex() and b.is_complex():
        return a.real * b.real - a.imag * b.imag
    return (a * b).real if (a.is_complex() or b.is_complex()) else a * b


class DiagonalTraces:
    """The per-stream traces of :class:`DiagonalRTRL` for one cell: closed forms (``cell.diagonal_traces(layout)``,
    e.g. :class:`~lightning_ortho.online.lru.LRUTraces`) or the ``torch.func`` path (:class:`ElementwiseTraces`).

    ``initial(h0)`` gives the zero traces ``{name: (B, ...)}``; ``advance(x, h, traces)`` returns ``(h', traces')``;
    ``gradient(traces, grad_h, per_stream)`` returns the flat estimate ``(B, P)`` or ``(P,)`` in the layout's
    order (parameters outside the recurrence get zeros)."""

    complex_state = False

    def lru_kernels(self) -> bool:
        """Whether the C kernels of :mod:`lightning_ortho._native.lru` compute these traces' step and estimate (only
        the linear recurrent unit's own closed form says yes)."""
        return False

    def initial(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def advance(
        self, x: torch.Tensor, h: torch.Tensor, traces: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def gradient(self, traces: dict[str, torch.Tensor], grad_h: torch.Tensor, per_stream: bool) -> torch.Tensor:
        raise NotImplementedError


def _probe_points(cell: nn.Module, complex_state: bool, count: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` random one-stream points ``(x (1, I), h (1, H))`` (fixed seed) in the parameters' dtype and device."""
    sizes = {name: getattr(cell, name, None) for name in ("input_size", "hidden_size")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes.values()):
        raise ValueError(
            f"DiagonalRTRL: {type(cell).__name__} must declare integer input_size and hidden_size (got {sizes}): the"
            " structure of its Jacobians is read at random inputs of those sizes."
        )
    reference = next(cell.parameters())
    generator = torch.Generator().manual_seed(0)
    points = []
    for _ in range(count):
        x = torch.randn(1, sizes["input_size"], generator=generator, dtype=torch.float64)
        h = torch.randn(1, sizes["hidden_size"], generator=generator, dtype=torch.float64)
        if complex_state:
            h = torch.complex(h, torch.randn(1, sizes["hidden_size"], generator=generator, dtype=torch.float64))
        kind = complex_dtype(reference.dtype) if complex_state else reference.dtype
        points.append((x.to(reference.device, reference.dtype), h.to(reference.device, kind)))
    return points


def _parameters(cell: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in cell.named_parameters()}


def declares_diagonal_recurrence(cell: nn.Module) -> bool:
    """Whether ``cell`` declares (``diagonal_recurrence = True``) that ``dh'/dh`` is diagonal for every value of its
    parameters."""
    return getattr(cell, DIAGONAL_RECURRENCE, False) is True


def moved_parameters(cell: nn.Module) -> dict[str, torch.Tensor]:
    """The detached parameters after a random move (a fixed generator), ``p + 0.1 rms(p) n`` with ``n ~ N(0, 1)``
    (``rms(p)`` taken as 1 for a zero ``p``): a point that training may reach, where an entry that is zero now
    (an off-diagonal weight, say) is not. Floating and complex parameters move; others are kept."""
    generator = torch.Generator().manual_seed(1)
    moved = {}
    for name, p in _parameters(cell).items():
        if not (p.is_floating_point() or p.is_complex()) or not p.numel():
            moved[name] = p
            continue
        wide = p.to(torch.complex128 if p.is_complex() else torch.float64)
        scale = float(torch.linalg.vector_norm(wide)) / p.numel() ** 0.5
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        moved[name] = p + (_MOVE * (scale or 1.0) * noise).to(p.device, p.real.dtype)
    return moved


def _has_values(cell: nn.Module) -> bool:
    """False for a cell on the meta device (shape inference, deferred initialisation): nothing to probe."""
    return not any(p.is_meta for p in cell.parameters())


def _as_real(y: torch.Tensor) -> torch.Tensor:
    """``y`` ``(..., H)`` real, or ``[Re y, Im y]`` stacked on a last dim of 2 when complex."""
    return torch.stack([y.real, y.imag], dim=-1) if y.is_complex() else y


def check_declared_diagonal_recurrence(cell: nn.Module) -> None:
    """Raise ``ValueError`` unless ``cell`` declares ``diagonal_recurrence = True`` (:data:`DIAGONAL_RECURRENCE`)."""
    if declares_diagonal_recurrence(cell):
        return
    name = type(cell).__name__
    raise ValueError(
        f"DiagonalRTRL: {name} does not declare a diagonal recurrence. DiagonalRTRL is exact only while dh'/dh"
        " stays diagonal through training, which a cell promises with the class attribute diagonal_recurrence ="
        " True (LinearRecurrentUnit does); a recurrence that is diagonal only at the current weights (a TanhRNNCell"
        " whose weight_hh is diagonal) becomes dense at the first optimizer step, and every later estimate would be"
        f" wrong. Train {name} with RTRL (exact), UORO or TruncatedBPTT; if its recurrence is element-wise for"
        " every value of its parameters (e.g. h' = tanh(w * h + U x) with a vector w), set diagonal_recurrence ="
        f" True on the class {name}."
    )


def _state_jacobian_blocks(
    cell: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, h: torch.Tensor, complex_state: bool
) -> list[torch.Tensor]:
    """``dh'/dh`` ``(H, H)`` at ``(x (1, I), h (1, H))`` with ``params`` (``torch.func.jacfwd``); for a complex state
    the four real blocks ``[dRe h'/dRe h, dIm h'/dRe h, dRe h'/dIm h, dIm h'/dIm h]``."""
    if complex_state:

        def step(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
            return _as_real(functional_call(cell, params, (x, torch.complex(re, im)[None]))[0])

        by_re, by_im = jacfwd(step, argnums=(0, 1))(h[0].real, h[0].imag)  # (H, 2, H) each
        return [by_re[:, 0], by_re[:, 1], by_im[:, 0], by_im[:, 1]]
    return [jacfwd(lambda hh: functional_call(cell, params, (x, hh[None]))[0])(h[0])]


def check_diagonal_state_jacobian(cell: nn.Module, complex_state: bool) -> None:
    """Raise ``ValueError`` unless ``dh'/dh`` of ``cell`` is diagonal at two random points (``torch.func.jacfwd``;
    off-diagonal entries must be exactly zero) and, for a complex state, complex-linear (the Cauchy-Riemann
    equations ``dRe h'/dRe h = dIm h'/dIm h``, ``dIm h'/dRe h = -dRe h'/dIm h`` on the diagonal), at the current
    parameters and at a random move of them (:func:`moved_parameters`, where a Jacobian with NaN/inf entries says
    nothing and is skipped): a declared diagonal recurrence must stay one under training. Nothing is read on the
    meta device (no values)."""
    if not _has_values(cell):
        return
    name = type(cell).__name__
    for moved, params in ((False, _parameters(cell)), (True, moved_parameters(cell))):
        for x, h in _probe_points(cell, complex_state):
            blocks = _state_jacobian_blocks(cell, params, x, h, complex_state)
            if moved and not all(bool(torch.isfinite(block).all()) for block in blocks):
                continue
            _check_diagonal_blocks(blocks, h, name, complex_state, moved)


def _check_diagonal_blocks(
    blocks: list[torch.Tensor], h: torch.Tensor, name: str, complex_state: bool, moved: bool
) -> None:
    """The diagonality (and complex linearity) of the blocks of :func:`_state_jacobian_blocks`; the message says
    whether they failed at the current parameters or only after a move (``moved``)."""
    for block in blocks:
        off = block - torch.diag_embed(torch.diagonal(block))
        if not bool((off != 0).any()):
            continue
        if moved:
            raise ValueError(
                f"DiagonalRTRL: the state Jacobian dh'/dh of {name} is diagonal at its current parameters but not"
                f" after a small random move of them (as an optimizer step makes): {name} declares"
                " diagonal_recurrence = True, but its recurrence is diagonal only at these values (e.g. a matrix"
                " weight whose off-diagonal entries are zero now), so training would make it dense and every later"
                " estimate wrong. Use RTRL (exact), UORO or TruncatedBPTT, or build the recurrence so that every"
                " value of the parameters keeps it diagonal (e.g. a vector w in w * h instead of a matrix)."
            )
        raise ValueError(
            f"DiagonalRTRL: the state Jacobian dh'/dh of {name} is not diagonal (unit i reads other units j != i):"
            " its influence does not stay on one unit. Use RTRL (exact, O(H^2 P) per step), UORO or TruncatedBPTT"
            " for such cells."
        )
    if complex_state:
        tol = dict(rtol=100 * torch.finfo(h.real.dtype).eps, atol=100 * torch.finfo(h.real.dtype).eps)
        rr, ir, ri, ii = (torch.diagonal(b) for b in blocks)
        if not (torch.allclose(rr, ii, **tol) and torch.allclose(ir, -ri, **tol)):
            where = " after a small random move of its parameters" if moved else ""
            raise ValueError(
                f"DiagonalRTRL: {name}'s step is not complex-linear in its complex state h{where} (each unit's 2x2"
                " real Jacobian is no complex multiplier), so one complex trace per entry cannot hold the influence."
                " Use a real state (real and imaginary parts as units) with RTRL instead."
            )


class ElementwiseTraces(DiagonalTraces):
    """The ``torch.func`` path: one trace per parameter entry, ``e`` ``(B, P)`` (complex for a complex state).

    The unit ``k(p)`` that entry ``p`` enters is read once from the immediate Jacobian ``dh'/dtheta`` (``jacrev``)
    at two random points, at the current parameters and at a random move of them (:func:`moved_parameters`: an
    entry whose derivative is zero only at the current values, behind a zero weight say, is found too); an entry
    that touches no unit there (a parameter outside the recurrence, like an output layer) keeps a zero trace. Each
    step costs one ``jvp`` (``h'`` and ``a = diag(dh'/dh)`` as ``J 1``) and one per-stream ``vjp`` with cotangent
    ones (two for a complex state: real and imaginary parts), which is ``dh'[k(p)]/dtheta_p`` because each column
    has one nonzero.

    Raises:
        ValueError: a parameter entry enters more than one unit (a shared scalar, say): DiagonalRTRL keeps one
            trace per entry; use RTRL.
    """

    def __init__(self, cell: nn.Module, layout: ParameterLayout, complex_state: bool) -> None:
        self.cell, self.layout, self.complex_state = cell, layout, complex_state
        readable = _has_values(cell)  # on the meta device only the shapes are made (nothing to read)
        touched = None
        points = [(False, _parameters(cell))] + ([(True, moved_parameters(cell))] if readable else [])
        for moved, params in points:
            for x, h in _probe_points(cell, complex_state):
                jac = jacrev(lambda p, x=x, h=h: _as_real(functional_call(cell, p, (x, h))[0]))(params)
                flat = layout.flatten(jac, lead=2 if complex_state else 1)  # (H, [2,] P)
                if moved and not bool(torch.isfinite(flat).all()):
                    continue  # a move out of the cell's domain says nothing
                nonzero = (flat != 0).any(dim=1) if complex_state else flat != 0
                touched = nonzero if touched is None else touched | nonzero
        counts = touched.sum(0)
        if readable and bool((counts > 1).any()):
            index = int(torch.nonzero(counts > 1)[0])
            name = next(n for n in reversed(layout.names) if layout.offsets[n] <= index)
            raise ValueError(
                f"DiagonalRTRL: an entry of {type(cell).__name__}.{name} enters {int(counts[index])} units (e.g. a"
                " shared scalar); DiagonalRTRL keeps one trace per parameter entry and unit. Give each unit its own"
                " entry, or use RTRL."
            )
        self.units = touched.to(torch.uint8).argmax(0)  # (P,) the unit each entry enters (0 where none)
        self.enters = counts == 1  # (P,)

    def initial(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"influence": h0.new_zeros(h0.shape[0], self.layout.size)}

    def advance(
        self, x: torch.Tensor, h: torch.Tensor, traces: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cell, params = self.cell, _parameters(self.cell)
        h_new, decay = jvp(lambda hh: functional_call(cell, params, (x, hh)), (h,), (torch.ones_like(h),))
        hidden = h.shape[1]
        ones = torch.ones(hidden, dtype=x.dtype, device=x.device)
        zeros = torch.zeros_like(ones)
        cotangents = [torch.stack([ones, zeros], -1), torch.stack([zeros, ones], -1)] if self.complex_state else [ones]

        def one(xb: torch.Tensor, hb: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            _, pull = vjp(lambda p: _as_real(functional_call(cell, p, (xb[None], hb[None]))[0]), params)
            return [pull(c)[0] for c in cotangents]

        parts = [self.layout.flatten(g, lead=1) for g in vmap(one)(x, h)]  # (B, P) each
        source = torch.complex(parts[0], parts[1]) if self.complex_state else parts[0]
        source = source * self.enters.to(source.real.dtype)
        influence = decay[:, self.units] * traces["influence"] + source
        return h_new, {"influence": influence}

    def gradient(self, traces: dict[str, torch.Tensor], grad_h: torch.Tensor, per_stream: bool) -> torch.Tensor:
        flat = real_part_of_product(grad_h.conj()[:, self.units], traces["influence"])
        return flat if per_stream else flat.sum(0)


class ComplexOnlineState(OnlineState):
    """An :class:`~lightning_ortho.online.OnlineState` whose ``h`` and traces may be complex.

    ``state_dict`` keeps the complex tensors; ``load_state_dict`` runs every check of ``OnlineState`` on their real
    views (``torch.view_as_real``: the same shapes plus a last dim of 2), so a complex state resumes bit-exactly and
    a saved state with NaN/inf, another shape or another estimator is refused with the same ``ValueError``."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_h = state.get("h") if isinstance(state, dict) else None
        if isinstance(saved_h, torch.Tensor) and saved_h.is_complex() != self.h.is_complex():
            kinds = ("complex", "real") if saved_h.is_complex() else ("real", "complex")
            raise ValueError(
                f"OnlineState.load_state_dict: the saved hidden states h are {kinds[0]}, this state's are {kinds[1]}:"
                " the state was saved with another cell; make the state to load into with initial_state of the"
                " estimator that saved it."
            )
        saved = state
        if isinstance(state, dict) and isinstance(state.get("tensors"), dict):
            saved = dict(state, tensors={k: _real_view(v) for k, v in state["tensors"].items()})
            saved["h"] = _real_view(state.get("h"))
        h, tensors = self.h, self.tensors
        complex_entries = {k for k, v in tensors.items() if v.is_complex()}
        self.h, self.tensors = _real_view(h), {k: _real_view(v) for k, v in tensors.items()}
        try:
            super().load_state_dict(saved)
        except BaseException:
            self.h, self.tensors = h, tensors
            raise
        if h.is_complex():
            self.h = torch.view_as_complex(self.h.contiguous())
        self.tensors = {
            k: torch.view_as_complex(v.contiguous()) if k in complex_entries else v for k, v in self.tensors.items()
        }


def _passes_check(tensor: Any, name: str, dims: int, like: torch.Tensor, same_shape: bool) -> bool:
    """Whether :meth:`DiagonalRTRL._check` accepts ``tensor`` against a complex state ``like``, read in a few Python
    comparisons (the check itself compares real views, a few microseconds a call): ``x`` real of ``like``'s real
    dtype, anything else of ``like``'s complex dtype; ``dims`` dims, ``like``'s first dim (its shape with
    ``same_shape``) and device. False sends the tensor to the check, which says what is wrong."""
    if not isinstance(tensor, torch.Tensor):
        return False
    want = _REAL_DTYPES.get(like.dtype) if name == "x" else (like.dtype if like.is_complex() else None)
    if want is None or tensor.dtype is not want or tensor.dim() != dims:
        return False
    same = tensor.shape == like.shape if same_shape else tensor.shape[0] == like.shape[0]
    return same and tensor.device == like.device


def _real_view(value: Any) -> Any:
    return torch.view_as_real(value) if isinstance(value, torch.Tensor) and value.is_complex() else value


class DiagonalRTRL(OnlineGradientEstimator):
    """Exact RTRL for a cell with diagonal ``dh'/dh`` in ``O(P)`` per stream (see the module docstring).

    The traces come from the cell's closed form when it offers one (``cell.diagonal_traces(layout)``:
    :class:`~lightning_ortho.online.LinearRecurrentUnit`) and ``closed_form``, else from ``torch.func``
    (:class:`ElementwiseTraces`). A cell with ``complex_state = True`` steps a complex ``h`` ``(B, H)``
    (``complex128`` for ``float64`` parameters): ``initial_state`` and ``reset`` take a complex ``h0`` or a real one
    of the parameters' dtype (converted), ``step`` returns complex states, and ``gradient`` takes ``grad_h`` complex
    in PyTorch's convention (``dL/dRe h + i dL/dIm h``, what autograd returns for a real loss) and returns real
    gradients of the (real) parameters; parameters that do not enter ``h`` (the LRU's ``C`` and ``D``) get zeros.

    Only cells whose recurrence is diagonal *by construction* are accepted: the cell's class declares it with
    ``diagonal_recurrence = True`` (:class:`~lightning_ortho.online.LinearRecurrentUnit` does; so can an
    element-wise cell ``h' = tanh(w * h + U x)`` with a vector ``w``). The structure must be a property of the
    model, which every optimizer step keeps, not of today's weights: a ``TanhRNNCell`` whose ``weight_hh`` happens
    to be diagonal gets off-diagonal gradients, is dense after one step, and the traces (which drop the off-diagonal
    influence) would then be silently wrong. The alternatives serve users worse: masking the off-diagonal gradients
    would train another model than the one given (its optimizer, weight decay or other losses still move those
    entries), and checking the weights before each use costs a Jacobian and a host synchronisation per step. The
    declaration is verified here, once: ``dh'/dh`` must be diagonal at random inputs at the current parameters and
    after a random move of them (:func:`moved_parameters`), which catches a declaration on a cell that is diagonal
    only at its current values. On the meta device (shape inference) nothing is probed: build the estimator again
    for the materialised cell (:meth:`initial_state` refuses states with values otherwise).

    Args:
        cell: a cell ``cell(x, h) -> h_new`` that declares ``diagonal_recurrence = True`` (its state Jacobian
            ``dh'/dh`` is diagonal for every value of its parameters) and whose parameters all live in it (see
            :class:`~lightning_ortho.online.OnlineGradientEstimator`).
        closed_form: take the traces from the cell's closed form (``cell.diagonal_traces``) when it has one;
            ``False`` forces the generic ``torch.func`` path.

    Raises:
        ValueError: ``cell`` does not declare ``diagonal_recurrence = True``; its state Jacobian is not diagonal at
            random points at its current parameters or after a random move of them (checked once here with
            ``torch.func``); a complex step is not complex-linear in ``h``; or (``torch.func`` path) a parameter
            entry enters more than one unit.
    """

    name = "diagonal_rtrl"
    complex_states = True

    @classmethod
    def cell_problem(cls, cell: nn.Module, **options: Any) -> str | None:
        """As :meth:`OnlineGradientEstimator.cell_problem` (a complex state is taken), and the cell must declare a
        diagonal recurrence (:func:`check_declared_diagonal_recurrence`) whose state Jacobian is diagonal at its
        current parameters and after a random move of them (:func:`check_diagonal_state_jacobian`)."""
        problem = super().cell_problem(cell, **options)
        if problem is None:
            try:
                check_declared_diagonal_recurrence(cell)
                check_diagonal_state_jacobian(cell, bool(getattr(cell, "complex_state", False)))
            except ValueError as error:
                problem = str(error)
        return problem

    def __init__(self, cell: nn.Module, *, closed_form: bool = True) -> None:
        super().__init__(cell, closed_form=closed_form)
        self.complex_state = bool(getattr(cell, "complex_state", False))  # the cell was checked by cell_problem
        self._probed = _has_values(cell)  # False: built on the meta device, where nothing was read
        fast = getattr(cell, "diagonal_traces", None) if closed_form else None
        traces = fast(self.layout) if fast is not None else None
        self.traces = traces if traces is not None else ElementwiseTraces(cell, self.layout, self.complex_state)
        #: the fused step and estimate (one C call each: :meth:`_fused_step`) on a plain linear recurrent unit, else
        #: ``None``
        self._fused = FusedLRU(cell, Advance) if _fusable_lru(cell, self.traces, self.layout) else None

    # -- complex states ------------------------------------------------------------------------------------------
    def initial_state(self, h0: torch.Tensor) -> OnlineState:
        """As :meth:`OnlineGradientEstimator.initial_state`, with zero traces; for a cell with
        ``complex_state = True``, ``h0`` may be complex (of the complex dtype of the parameters: ``complex64`` for
        float32, ``complex128`` for float64) or real of the parameters' dtype (converted), and the state is a
        complex ``(B, H)`` one that saves and loads bit-exactly.

        Args:
            h0: ``(B, H)`` initial states of the ``B`` streams.

        Returns:
            The state before the first step.

        Raises:
            ValueError: ``h0`` is not ``(B, H)`` with ``B >= 1`` and the cell's ``H``, is not of the state's dtype,
                or holds NaN/inf; ``h0`` has values but the estimator was built on the meta device (nothing about
                the cell was checked there).
        """
        if not self._probed and isinstance(h0, torch.Tensor) and not h0.is_meta:
            raise ValueError(
                f"DiagonalRTRL: this estimator was built for {type(self.cell).__name__} on the meta device, where"
                " the structure of its recurrence could not be read (no values), and h0 is on"
                f" {h0.device}; build DiagonalRTRL again from the materialised cell (after cell.to_empty(device=...)"
                " and its initialisation)."
            )
        if not self.complex_state:
            return super().initial_state(h0)
        h0 = self._complex_h0(h0)
        self._check(h0, "h0", dims=2)
        streams, hidden = h0.shape
        if streams < 1 or (self.hidden_size is not None and hidden != self.hidden_size):
            raise ValueError(
                f"DiagonalRTRL.initial_state: h0 must have shape (streams >= 1, {self.hidden_size}), got"
                f" {tuple(h0.shape)}; e.g. h0 = torch.zeros(streams, cell.hidden_size, dtype=cell.state_dtype())."
            )
        self._check_finite(h0, "h0")
        want = self._state_dtype()
        if h0.dtype != want:
            raise ValueError(
                f"DiagonalRTRL: h0 is {h0.dtype} but the cell's {next(self.cell.parameters()).dtype} parameters step a"
                f" {want} state; convert one of them (e.g. cell.double() and complex128 states for references)."
            )
        return ComplexOnlineState(h0, self._initial_tensors(h0), None, kind=self.name, health=new_record(h0.device))

    def reset(self, state: OnlineState, mask: torch.Tensor, h0: torch.Tensor | None = None) -> OnlineState:
        """As :meth:`OnlineGradientEstimator.reset`: the streams where ``mask`` is true restart from ``h0`` with
        zero traces. For a complex state ``h0`` may also be complex (a real one is converted).

        Args:
            state: the current state.
            mask: ``(B,)`` bool, the streams to restart.
            h0: ``(B, H)``, ``(1, H)`` or ``(H,)`` restart states; zeros when ``None``.

        Returns:
            The new state (the other streams are untouched).

        Raises:
            ValueError: ``mask`` is not a bool ``(B,)`` tensor, or ``h0`` has the wrong shape or holds NaN/inf.
        """
        if not (self.complex_state and isinstance(h0, torch.Tensor) and h0.is_complex()):
            return super().reset(state, mask, h0)  # a real h0 is converted to the complex state there
        self._check_finite(h0, "h0", where="DiagonalRTRL.reset")
        new = super().reset(state, mask, h0.real)  # checks mask and the shape, resets the traces
        start = h0.to(state.h).expand_as(state.h)
        return new.replace(h=torch.where(mask[:, None], start, new.h))

    def _state_dtype(self) -> torch.dtype:
        return complex_dtype(next(self.cell.parameters()).dtype)

    def _complex_h0(self, h0: Any) -> Any:
        """A real floating ``h0`` of the parameters' dtype becomes complex; anything else goes to the checks."""
        if isinstance(h0, torch.Tensor) and h0.is_floating_point() and h0.dtype == next(self.cell.parameters()).dtype:
            return h0.to(self._state_dtype())
        return h0

    def _check(
        self,
        tensor: torch.Tensor,
        name: str,
        *,
        dims: int,
        like: torch.Tensor | None = None,
        same_shape: bool = False,
    ) -> None:
        if not self.complex_state:
            return super()._check(tensor, name, dims=dims, like=like, same_shape=same_shape)
        if like is not None and _passes_check(tensor, name, dims, like, same_shape):
            return None  # what the checks below accept, read without making views of the real parts
        real_like = None if like is None else like.real
        if name == "x":  # real inputs, of the real dtype of the complex state
            return super()._check(tensor, name, dims=dims, like=real_like, same_shape=same_shape)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_complex():
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(
                f"DiagonalRTRL: {name} must be a complex tensor (the state of {type(self.cell).__name__} is complex),"
                f" got {got}; grad_h is dL/dRe h + i dL/dIm h, what torch.autograd.grad returns for a complex h."
            )
        return super()._check(tensor.real, name, dims=dims, like=real_like, same_shape=same_shape)

    def _watched_tensors(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: _real_view(v) for k, v in tensors.items()}

    # -- the estimator ---------------------------------------------------------------------------------------------
    def _fused_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """For a plain linear recurrent unit, the step and all its traces in one C call
        (:meth:`~lightning_ortho._native.lru.FusedLRU.step`, which also sums ``x``, ``h'`` and the new traces for
        the NaN/inf verdict) where the tensors allow it (see :meth:`OnlineGradientEstimator._fused_step`); else
        ``None``: :meth:`_advance_step`."""
        fused = self._fused
        return None if fused is None else fused.step(x, state.h, state.tensors)

    def _fused_gradient(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[dict[str, torch.Tensor], float] | None:
        """The summed estimate by parameter in one C call where :meth:`_fused_step` may fuse
        (:meth:`~lightning_ortho._native.lru.FusedLRU.gradient`; its verdict: the sum of ``grad_h`` and the
        estimate); else ``None``: :meth:`_gradient_summed`."""
        fused = self._fused
        return None if fused is None else fused.gradient(state.h, state.tensors, grad_h)

    def _advance_step(self, x: torch.Tensor, state: OnlineState) -> Advance:
        """The traces' own step (closed form or ``torch.func``), no linearisation (see
        :meth:`OnlineGradientEstimator._advance_step`); the fused step is :meth:`_fused_step`."""
        h_new, tensors = self.traces.advance(x, state.h, state.tensors)
        if h_new.shape != state.h.shape or h_new.dtype != state.h.dtype:
            raise ValueError(
                f"DiagonalRTRL.step: the cell returned {h_new.dtype} {tuple(h_new.shape)} from h of {state.h.dtype}"
                f" {tuple(state.h.shape)}; h0 must have one column per unit of the cell (its hidden size)."
            )
        return Advance(h_new, tensors)

    def _finite_estimate(self, grad_h: torch.Tensor, flat: torch.Tensor) -> bool:
        # One sum of grad_h and the estimate (false on an overflowed sum too: the caller confirms entry by entry).
        dtype = _sum_dtype(flat.dtype)
        return bool(torch.isfinite(_real_view(grad_h.resolve_conj()).sum(dtype=dtype) + flat.sum(dtype=dtype)))

    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.traces.initial(h0)

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        return self.traces.advance(x, state.h, state.tensors)[1]

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        return self.traces.gradient(state.tensors, grad_h, per_stream=True)

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        return self.traces.gradient(state.tensors, grad_h, per_stream=False)


def _fusable_lru(cell: nn.Module, traces: DiagonalTraces, layout: ParameterLayout) -> bool:
    """Whether the C kernels of :mod:`lightning_ortho._native.lru` compute ``traces``' step and estimate: the traces
    say so (:meth:`DiagonalTraces.lru_kernels`: the closed-form traces of a
    :class:`~lightning_ortho.online.lru.LinearRecurrentUnit`, exactly :class:`~lightning_ortho.online.lru.LRUTraces`,
    which the cell offers only when it steps as the class does, on its eight plain parameters). Decided once, at
    construction."""
    return traces.lru_kernels()
