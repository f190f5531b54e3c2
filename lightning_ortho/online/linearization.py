"""One step of a recurrent cell and its exact Jacobian products, per stream.

Notation of Cooijmans & Martens 2019: ``h_t = F(h_{t-1}, x_t; theta_t)``; ``J^{h_t}_{h_{t-1}}`` is the state Jacobian,
``J^{h_t}_{theta_t}`` the immediate parameter Jacobian, ``z_t`` a cut vertex (the preactivation). A batch holds
``B`` independent streams, so every product is per stream: parameter-side results are ``(B, P)`` with
``P`` the number of parameters laid out by :class:`ParameterLayout`.

:class:`StepLinearization` computes every product exactly with ``torch.func`` (``jvp`` for forward mode,
``vjp``/``jacrev`` under ``vmap`` for per-stream reverse mode) through ``functional_call``, never with finite
differences. :class:`TanhStepLinearization` is the closed form for :class:`~lightning_ortho.online.TanhRNNCell`.

Every path that relies on more than ``forward`` checks first that the cell's ``forward`` is what it relies on, or
takes the generic products of ``forward``, or refuses:

* a closed form of a known class (``TanhRNNCell.linearize``, ``ModReLURNNCell.linearize``, the LRU's traces) applies
  when :func:`steps_as` holds: the class or a subclass that overrides none of the step's methods, with the plain
  parameters (a structural test of the class, free at every step);
* a cell's declared factorisation (``forward = activation o preactivation``, ``z = W a``, an element-wise
  activation), which UORO's ``projection="preactivation"``/``"none"``, KF-RTRL, RFLO's factored trace and the
  oracle use, is checked by :func:`factorisation_problem`: once per cell, at random points and random parameters
  (so the verdict is the class's, not that of the current weights, which an optimizer moves), and cached for the
  cell's class and parameter names.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap


class ParameterLayout:
    """Where each named parameter of a cell sits in a flat vector of length ``size``.

    The order is ``cell.named_parameters()``. :meth:`flatten` takes ``{name: (*lead, *shape)}`` to
    ``(*lead, P)``; :meth:`unflatten` goes back.

    Args:
        cell: the recurrent cell whose parameters are laid out.
    """

    def __init__(self, cell: nn.Module) -> None:
        params = dict(cell.named_parameters())
        if not params:
            raise ValueError(f"{type(cell).__name__} has no parameters: there is no gradient to estimate.")
        self.names = tuple(params)
        self.shapes = tuple(tuple(p.shape) for p in params.values())
        self.numels = tuple(p.numel() for p in params.values())
        self.size = sum(self.numels)
        self.offsets = {n: sum(self.numels[:i]) for i, n in enumerate(self.names)}
        # (name, shape, contiguous strides, offset) of every parameter, for views
        self._views = tuple(
            (n, s, torch.empty(s, device="meta").stride(), self.offsets[n])
            for n, s in zip(self.names, self.shapes, strict=True)
        )

    def block(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        """The view of ``flat`` ``(B, P)`` holding parameter ``name``, shaped ``(B, *shape)`` (writes go through)."""
        start = self.offsets[name]
        index = self.names.index(name)
        return flat[:, start : start + self.numels[index]].view(flat.shape[0], *self.shapes[index])

    def flatten(self, tensors: dict[str, torch.Tensor], lead: int) -> torch.Tensor:
        """Concatenate one tensor per parameter into a flat vector in layout order: ``{name: (*lead, *shape)}``
        -> ``(*lead, P)``.

        Args:
            tensors: a tensor for every name of :attr:`names`, each with the same ``lead`` leading dims followed
                by the parameter's shape (extra entries are ignored).
            lead: how many leading dims to keep (``1`` for per-stream ``(B, *shape)``, ``2`` for ``(B, H, *shape)``
                Jacobians).

        Returns:
            ``(*lead, P)`` with ``P = size``; parameter ``name`` at ``offsets[name]``.

        Raises:
            KeyError: a parameter's name is missing from ``tensors``.
        """
        parts = [tensors[n].reshape(tuple(tensors[n].shape[:lead]) + (-1,)) for n in self.names]
        return torch.cat(parts, dim=-1)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a flat vector back into the parameters: ``(..., P)`` -> ``{name: (..., *shape)}``, in layout
        order (the inverse of :meth:`flatten`).

        Args:
            flat: ``(..., P)`` with ``P = size``.

        Returns:
            One tensor per parameter, shaped ``(*flat.shape[:-1], *shape)`` (views of ``flat`` where the
                reshape allows).

        Raises:
            RuntimeError: the last dim of ``flat`` is not ``size``.
        """
        lead = tuple(flat.shape[:-1])
        chunks = flat.split_with_sizes(self.numels, -1)
        return {n: c.reshape(lead + s) for n, c, s in zip(self.names, chunks, self.shapes, strict=True)}

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """:meth:`unflatten` of a contiguous ``(P,)`` or ``(B, P)`` tensor outside autograd and ``torch.func``, as
        one strided view per parameter (a third of the calls; an estimate returned at every step). Anything else
        goes to :meth:`unflatten` (so does a traced ``flat``: ``torch.compile`` makes the views itself)."""
        if flat.dim() > 2 or flat.requires_grad or not flat.is_contiguous() or torch.compiler.is_compiling():
            return self.unflatten(flat)
        base = flat.storage_offset()
        if flat.dim() == 1:
            return {n: flat.as_strided(s, st, base + o) for n, s, st, o in self._views}
        rows, row = flat.shape[0], flat.stride(0)
        return {n: flat.as_strided((rows, *s), (row, *st), base + o) for n, s, st, o in self._views}


class _Method(nn.Module):
    """Calls ``cell.<name>`` as ``forward``, so ``functional_call`` can run any method of the cell."""

    def __init__(self, cell: nn.Module, name: str) -> None:
        super().__init__()
        self.cell, self.name = cell, name

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return getattr(self.cell, self.name)(*args)


def activation_reads_parameters(
    cell: nn.Module, z: torch.Tensor, values: dict[str, torch.Tensor] | None = None
) -> bool:
    """Whether ``cell.activation`` depends on any parameter of the cell (evaluated at ``z`` ``(1, Z)``, with the
    cell's parameters or, where given, ``values`` of its parameters and buffers by name)."""
    if values is None:
        values = dict(cell.named_parameters())
    names = {k for k, _ in cell.named_parameters()}
    leaves = {f"cell.{k}": v.detach().clone().requires_grad_(k in names) for k, v in values.items()}
    with torch.enable_grad():
        out = functional_call(_Method(cell, "activation"), leaves, (z,))
        if not out.requires_grad:
            return False
        grads = torch.autograd.grad(out.sum(), [v for v in leaves.values() if v.requires_grad], allow_unused=True)
    return any(g is not None for g in grads)


def steps_as(
    cell: nn.Module,
    base: type,
    layout: ParameterLayout,
    names: tuple[str, ...] = ("weight_hh", "weight_ih", "bias"),
    methods: tuple[str, ...] = ("forward", "preactivation", "activation"),
) -> bool:
    """Whether ``cell`` steps exactly as ``base`` does, so that ``base``'s closed-form Jacobian products apply: an
    instance of ``base`` or of a subclass that overrides none of ``methods``, whose parameters are the plain
    ``names`` (a parametrisation renames them, e.g. ``parametrizations.weight_hh.original``). A subclass that
    changes the step gets the generic ``torch.func`` products instead of closed forms that would be wrong."""
    if not isinstance(cell, base) or layout.names != names:
        return False
    kind = type(cell)
    return all(getattr(kind, name) is getattr(base, name) for name in methods)


#: The parts of a cell's declared factorisation that a path can rely on (:func:`factorisation_problem`).
FACTORISATION_PARTS = ("step", "linear", "complete", "elementwise")


def factorisation_problem(
    cell: nn.Module,
    parts: tuple[str, ...],
    layout: ParameterLayout | None = None,
    sizes: tuple[int, int] | None = None,
) -> str | None:
    """Why ``cell``'s declared factorisation is not its step, for the ``parts`` a path relies on; ``None`` when they
    all hold. The one check that every path using a cell's factorisation makes (see the module docstring).

    The parts:

    * ``"step"``: ``forward(x, h) = activation(preactivation(x, h))`` (the cut vertex ``z``);
    * ``"linear"``: ``"step"`` and ``preactivation(x, h) = W a`` with ``a = preactivation_input(x, h)`` ``(B, n_a)``
      and ``W`` ``(Z, n_a)`` the parameters named in ``preactivation_weights`` side by side (a vector is one column);
    * ``"complete"``: ``"linear"`` with every parameter of the cell in ``W``;
    * ``"elementwise"``: ``"step"`` and ``activation`` maps ``(1, Z)`` to ``(1, Z)`` unit by unit (its Jacobian is
      diagonal, off-diagonal entries exactly zero) and reads no parameter.

    The equalities are tested at two random points (inputs ``N(0, 1)``, states ``N(0, 1/4)``, a fixed generator) with
    the parameters moved by ``N(0, (0.1 s)^2)`` (``s`` their RMS, ``1`` for an all-zero or meta tensor), so that a
    parameter that happens to be zero now (a zero-initialised gain) hides nothing; in float64 on the CPU when the
    cell runs there, else in its own dtype and device, to ``1e4`` rounding steps of the dtype; a cell that declares
    no ``input_size``/``hidden_size`` (and no ``sizes``) cannot be probed and is reported so. The verdict of each
    part is cached for the cell while its class and parameter names stay (a parametrisation changes both): later
    calls cost a dictionary lookup, so paths may call this at every step.

    Args:
        cell: the recurrent cell.
        parts: names from :data:`FACTORISATION_PARTS`.
        layout: the cell's :class:`ParameterLayout` (built here when ``None``).
        sizes: ``(input_size, hidden_size)`` for the random points when the cell does not declare them.

    Returns:
        ``None``, or one sentence that names the cell and what does not hold (no advice: the caller says what to
            do).

    Raises:
        ValueError: an unknown part.
    """
    unknown = [p for p in parts if p not in FACTORISATION_PARTS]
    if unknown:
        raise ValueError(f"factorisation_problem: unknown parts {unknown}; choose from {FACTORISATION_PARTS}.")
    record = _factorisation_record(cell, layout)
    wanted = {"step", *parts} | ({"linear"} if "complete" in parts else set())
    for part in _CHECK_ORDER:  # the cheap structural checks of W before the probes of the step
        if part not in wanted:
            continue
        if part not in record.verdicts:
            record.verdicts[part] = _CHECKS[part](record, cell, sizes)
        if record.verdicts[part] is not None:
            return record.verdicts[part]
    return None


def weight_columns(cell: nn.Module, layout: ParameterLayout | None = None) -> list[tuple[str, int, bool]]:
    """``[(name, columns, is_vector)]`` of ``W`` in ``preactivation_weights`` order, for a cell whose ``"linear"``
    part holds (:func:`factorisation_problem`); ``W`` has :func:`weight_rows` rows.

    Raises:
        ValueError: the ``"linear"`` part does not hold (the message says why).
    """
    problem = factorisation_problem(cell, ("linear",), layout)
    if problem is not None:
        raise ValueError(problem)
    return list(_factorisation_record(cell, layout).columns)


def flatten_weight(
    layout: ParameterLayout, columns: Sequence[tuple[str, int, bool]], weight: torch.Tensor, lead: int
) -> torch.Tensor:
    """A ``W``-shaped ``(*lead, Z, n_a)`` (e.g. an estimate of ``dL/dW``) -> the layout's flat ``(*lead, P)``: each
    column block of ``W`` to its parameter, in the order of ``columns`` (:func:`weight_columns`), a one-column block
    of a vector parameter as ``(*lead, Z)``. ``columns`` must cover every parameter of ``layout`` (a ``"complete"``
    factorisation); the blocks are views of ``weight``, copied once by :meth:`ParameterLayout.flatten`.

    Raises:
        KeyError: a parameter of ``layout`` has no block in ``columns``.
    """
    parts, start = {}, 0
    for name, width, is_vector in columns:
        block = weight[..., start : start + width]
        parts[name] = block[..., 0] if is_vector else block
        start += width
    return layout.flatten(parts, lead=lead)


def weight_rows(cell: nn.Module, layout: ParameterLayout | None = None) -> int:
    """``Z``, the rows of ``W`` (and entries of ``z``) of a cell whose ``"linear"`` part holds.

    Raises:
        ValueError: the ``"linear"`` part does not hold (the message says why).
    """
    weight_columns(cell, layout)
    return _factorisation_record(cell, layout).rows


class _FactorisationRecord:
    """What :func:`factorisation_problem` found for one cell, valid while its class and parameter names stay."""

    def __init__(self, kind: type, names: tuple[str, ...]) -> None:
        self.kind, self.names = kind, names
        self.verdicts: dict[str, str | None] = {}
        self.columns: tuple[tuple[str, int, bool], ...] = ()
        self.rows = 0
        self.post_parameters: bool | None = None


_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _factorisation_record(cell: nn.Module, layout: ParameterLayout | None) -> _FactorisationRecord:
    names = layout.names if layout is not None else tuple(n for n, _ in cell.named_parameters())
    record = _RECORDS.get(cell)
    if record is None or record.kind is not type(cell) or record.names != names:
        record = _RECORDS[cell] = _FactorisationRecord(type(cell), names)
    return record


def _owner(kind: type, name: str) -> str:
    """The class of ``kind``'s MRO that defines attribute ``name`` (for messages)."""
    return next((c.__name__ for c in kind.__mro__ if name in c.__dict__), "?")


def _probe_points(cell: nn.Module, sizes: tuple[int, int] | None, count: int = 2):
    """``count`` random ``(values, x (1, I), h (1, H))`` in float64 on the CPU: the parameters moved as
    :func:`factorisation_problem` says, and the buffers, for ``functional_call``; ``None`` without the sizes."""
    inputs = sizes[0] if sizes is not None else getattr(cell, "input_size", None)
    hidden = sizes[1] if sizes is not None else getattr(cell, "hidden_size", None)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (inputs, hidden)):
        return None
    generator = torch.Generator().manual_seed(0)
    draw = lambda *shape: torch.randn(shape, generator=generator, dtype=torch.float64)  # noqa: E731  (0-d too)
    points = []
    for _ in range(count):
        values = {}
        for name, p in cell.named_parameters():
            readable = p.device.type != "meta" and p.is_floating_point()
            base = p.detach().double().cpu() if readable else torch.zeros(p.shape, dtype=torch.float64)
            scale = base.square().mean().sqrt().item() if base.numel() else 0.0
            values[name] = base + 0.1 * (scale or 1.0) * draw(*p.shape)
        for name, b in cell.named_buffers():
            if b.device.type == "meta":
                values[name] = torch.zeros(b.shape, dtype=torch.float64 if b.is_floating_point() else b.dtype)
            else:
                values[name] = b.detach().double().cpu() if b.is_floating_point() else b.detach().cpu()
        points.append((values, draw(1, inputs), 0.5 * draw(1, hidden)))
    return points


def _on_cell(cell: nn.Module, values: dict[str, torch.Tensor], *args: torch.Tensor):
    """``values`` and ``args`` in the dtype and device of the cell's first parameter (a cell that cannot run in
    float64 on the CPU)."""
    first = next(cell.parameters())
    move = lambda t: t.to(first.device, first.dtype) if t.is_floating_point() else t.to(first.device)  # noqa: E731
    return {k: move(v) for k, v in values.items()}, tuple(move(a) for a in args)


def _call(cell: nn.Module, method: str, values: dict[str, torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    if method == "forward":
        return functional_call(cell, values, args)
    return functional_call(_Method(cell, method), {f"cell.{k}": v for k, v in values.items()}, args)


def _evaluate(cell: nn.Module, sizes, compute) -> list | str:
    """``compute(values, x, h)`` at each random point (float64 on the CPU, else the cell's dtype and device), or a
    sentence saying why the cell could not be probed."""
    points = _probe_points(cell, sizes)
    if points is None:
        return (
            f"{type(cell).__name__} declares no input_size/hidden_size, so its factorisation cannot be checked at"
            " random points (give the cell int attributes input_size and hidden_size)"
        )
    results = []
    for values, x, h in points:
        try:
            results.append(compute(values, x, h))
        except RuntimeError:  # fixed tensors of the cell's own dtype or device: probe there
            values, (x, h) = _on_cell(cell, values, x, h)
            try:
                results.append(compute(values, x, h))
            except (RuntimeError, ValueError, TypeError) as error:
                return (
                    f"{type(cell).__name__} could not be run at a random point to check its factorisation"
                    f" ({type(error).__name__}: {error})"
                )
    return results


def _differ(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """The largest gap between ``a`` and ``b`` when it exceeds ``1e4`` rounding steps of their dtype relative to
    their size (NaN where both are NaN counts as equal), else ``None``; ``inf`` for different shapes."""
    if a.shape != b.shape:
        return math.inf
    both_nan = torch.isnan(a) & torch.isnan(b)
    gap = torch.where(both_nan, torch.zeros_like(a), a - b).abs().max().item() if a.numel() else 0.0
    size = max(a.abs().nan_to_num().max().item() if a.numel() else 0.0, 1.0)
    dtype = a.real.dtype if a.is_complex() else a.dtype
    return None if gap <= 1e4 * torch.finfo(dtype).eps * size else (gap if gap == gap else math.inf)


def _check_step(record: _FactorisationRecord, cell: nn.Module, sizes) -> str | None:
    kind = type(cell)
    missing = [m for m in ("preactivation", "activation") if not callable(getattr(cell, m, None))]
    if missing:
        return f"{kind.__name__} has no {' and no '.join(f'{m}()' for m in missing)}"

    def compute(values, x, h):
        z = _call(cell, "preactivation", values, x, h)
        return _differ(_call(cell, "forward", values, x, h), _call(cell, "activation", values, z))

    found = _evaluate(cell, sizes, compute)
    if isinstance(found, str):
        return found
    gaps = [g for g in found if g is not None]
    if gaps:
        return (
            f"{kind.__name__}.forward(x, h) is not activation(preactivation(x, h)) (they differ by up to"
            f" {max(gaps):.3g} at random points; forward comes from {_owner(kind, 'forward')}, preactivation from"
            f" {_owner(kind, 'preactivation')}, activation from {_owner(kind, 'activation')})"
        )
    return None


def _check_linear(record: _FactorisationRecord, cell: nn.Module, sizes) -> str | None:
    kind = type(cell).__name__
    names = getattr(cell, "preactivation_weights", None)
    methods = ("preactivation", "activation", "preactivation_input")
    missing = [f"{m}()" for m in methods if not callable(getattr(cell, m, None))]
    if names is None:
        missing.append("preactivation_weights")
    if missing:
        return f"{kind} has no z = W a factorisation: it lacks {', '.join(missing)}"
    names = tuple(names)
    params = dict(cell.named_parameters())
    unknown = [n for n in names if n not in params]
    if unknown:
        return (
            f"{kind}.preactivation_weights names {unknown}, which are not parameters of the cell (they are"
            f" {list(params)}; a parametrisation renames a weight, e.g. parametrizations.weight_hh.original, and W is"
            " then a function of the parameters, not one)"
        )
    shapes = {n: tuple(params[n].shape) for n in names}
    rows = {s[0] for s in shapes.values() if len(s) in (1, 2)}
    matrices = all(len(s) in (1, 2) for s in shapes.values())
    if not names or len(rows) != 1 or len(set(names)) != len(names) or not matrices:
        return (
            f"the parameters of W = {list(names)} of {kind} must be (Z, k) matrices or (Z,) vectors with one Z, got"
            f" {shapes}"
        )
    columns = tuple((n, 1 if len(s) == 1 else s[1], len(s) == 1) for n, s in shapes.items())
    width = sum(c for _, c, _ in columns)

    def compute(values, x, h):
        a = _call(cell, "preactivation_input", values, x, h)
        if a.shape != (1, width):
            return ("shape", tuple(a.shape))
        weight = torch.cat([values[n][:, None] if vector else values[n] for n, _, vector in columns], dim=1)
        return ("gap", _differ(_call(cell, "preactivation", values, x, h), a @ weight.to(a.dtype).T))

    found = _evaluate(cell, sizes, compute)
    if isinstance(found, str):
        return found
    for what, value in found:
        if what == "shape":
            return (
                f"{kind}.preactivation_input returned shape {value} for one stream, but its preactivation_weights"
                f" {list(names)} have {width} columns side by side: W a needs (1, {width})"
            )
    gaps = [value for _, value in found if value is not None]
    if gaps:
        return (
            f"{kind}.preactivation(x, h) is not W a with W = {list(names)} side by side and a ="
            f" preactivation_input(x, h) (they differ by up to {max(gaps):.3g} at random points)"
        )
    record.columns, record.rows = columns, rows.pop()
    return None


def _check_complete(record: _FactorisationRecord, cell: nn.Module, sizes) -> str | None:
    names = set(getattr(cell, "preactivation_weights", ()))
    outside = [n for n, _ in cell.named_parameters() if n not in names]
    if outside:
        return (
            f"{type(cell).__name__} has parameters outside W = {list(getattr(cell, 'preactivation_weights', ()))}:"
            f" {outside} (they act outside the preactivation)"
        )
    return None


def _check_elementwise(record: _FactorisationRecord, cell: nn.Module, sizes) -> str | None:
    kind = type(cell).__name__
    first = next(cell.parameters())
    found = _evaluate(cell, sizes, lambda values, x, h: _call(cell, "preactivation", values, x, h).shape[1])
    if isinstance(found, str):
        return found
    rows = found[0]
    # Off-diagonal entries exactly zero: a structural test, made in the parameters' dtype and device; on the meta
    # device (no values) in float64 on the CPU at the random parameters of a probe point.
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(2, rows, generator=generator, dtype=torch.float64)
    values = None
    if first.device.type == "meta":
        values = _probe_points(cell, sizes, count=1)[0][0]
        activation = lambda z: _call(cell, "activation", values, z)  # noqa: E731
    else:
        points, activation = points.to(first.device, first.dtype), cell.activation
    try:
        if activation_reads_parameters(cell, points[:1], values):
            return f"{kind}.activation reads parameters"
        jacobians = vmap(jacrev(lambda z: activation(z[None])[0]))(points)
    except (RuntimeError, ValueError, TypeError) as error:
        return f"{kind}.activation cannot be differentiated by torch.func ({type(error).__name__}: {error})"
    if jacobians.shape != (2, rows, rows):
        return f"{kind}.activation maps (1, {rows}) to (1, {jacobians.shape[1]}), not unit by unit"
    off_diagonal = jacobians * (1 - torch.eye(rows, dtype=jacobians.dtype, device=jacobians.device))
    if bool((off_diagonal != 0).any()):
        return f"{kind}.activation is not element-wise (its Jacobian has off-diagonal entries)"
    return None


_CHECKS = {"step": _check_step, "linear": _check_linear, "complete": _check_complete, "elementwise": _check_elementwise}
_CHECK_ORDER = ("linear", "complete", "step", "elementwise")


def post_activation_parameters(cell: nn.Module, z: torch.Tensor, layout: ParameterLayout | None = None) -> bool:
    """:func:`activation_reads_parameters` at ``z`` ``(1, Z)``, decided once and cached with the factorisation's
    verdicts (for the cell's class and parameter names)."""
    record = _factorisation_record(cell, layout)
    if record.post_parameters is None:
        record.post_parameters = activation_reads_parameters(cell, z)
    return record.post_parameters


def _cell_parameters(cell: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in cell.named_parameters()}


class StepLinearization:
    """The step ``h_new = cell(x, h)`` at fixed parameters, with its exact Jacobian products (generic path).

    Args:
        cell: the recurrent cell (see :mod:`lightning_ortho.online.cells`).
        x: ``(B, I)`` inputs of this step.
        h: ``(B, H)`` previous states.
        layout: the cell's :class:`ParameterLayout` (built once by the estimator).

    Attributes:
        h_new: ``(B, H)``, the new states.

    Methods take and return per-stream tensors; ``P`` is ``layout.size``.
    """

    def __init__(self, cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout) -> None:
        self.cell, self.x, self.h, self.layout = cell, x, h, layout
        self.params = _cell_parameters(cell)
        self.h_new = self._call("forward", self.params, x, h)

    # -- plumbing -------------------------------------------------------------------------------------------
    def _call(self, method: str, params: dict[str, torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        if method == "forward":
            return functional_call(self.cell, params, args)
        wrapped = {f"cell.{k}": v for k, v in params.items()}
        return functional_call(_Method(self.cell, method), wrapped, args)

    def _per_stream_vjp(self, method: str, args: tuple[torch.Tensor, ...], cotangent: torch.Tensor) -> torch.Tensor:
        """``(B, P)``: row ``b`` is ``cotangent_b^T d method(args_b) / d theta`` (one sample at a time under vmap)."""

        def one(cot: torch.Tensor, *sample: torch.Tensor) -> dict[str, torch.Tensor]:
            _, pull = vjp(lambda p: self._call(method, p, *(a[None] for a in sample))[0], self.params)
            return pull(cot)[0]

        grads = vmap(one)(cotangent, *args)
        return self.layout.flatten(grads, lead=1)

    # -- state side -------------------------------------------------------------------------------------------
    def state_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        """``J^{h_new}_{h} v`` for ``v`` ``(B, H)`` -> ``(B, H)``."""
        return jvp(lambda hh: self._call("forward", self.params, self.x, hh), (self.h,), (tangent,))[1]

    def state_jvp_columns(self, tangents: torch.Tensor) -> torch.Tensor:
        """``J^{h_new}_{h} V`` for ``V`` ``(B, H, K)`` -> ``(B, H, K)`` (one forward-mode product per column)."""
        return vmap(self.state_jvp, in_dims=2, out_dims=2)(tangents)

    # -- parameter side ---------------------------------------------------------------------------------------
    def parameter_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        """``c_b^T J^{h_new}_{theta}`` per stream: ``c`` ``(B, H)`` -> ``(B, P)``."""
        return self._per_stream_vjp("forward", (self.x, self.h), cotangent)

    def parameter_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        """``J^{h_new}_{theta} n_b`` per stream: ``n`` ``(B, P)`` -> ``(B, H)``."""

        def one(n: torch.Tensor, xb: torch.Tensor, hb: torch.Tensor) -> torch.Tensor:
            fn = lambda p: self._call("forward", p, xb[None], hb[None])[0]  # noqa: E731
            return jvp(fn, (self.params,), (self.layout.unflatten(n),))[1]

        return vmap(one)(tangent, self.x, self.h)

    def parameter_jacobian(self) -> torch.Tensor:
        """The immediate Jacobian ``J^{h_new}_{theta}`` per stream, ``(B, H, P)`` (RTRL's source term)."""

        def one(xb: torch.Tensor, hb: torch.Tensor) -> dict[str, torch.Tensor]:
            return jacrev(lambda p: self._call("forward", p, xb[None], hb[None])[0])(self.params)

        return self.layout.flatten(vmap(one)(self.x, self.h), lead=2)

    # -- preactivation cut vertex ---------------------------------------------------------------------------
    def require_preactivation(self) -> None:
        """Check that the cell offers the preactivation cut vertex (UORO's ``projection="preactivation"``): its
        ``forward`` is ``activation(preactivation(x, h))`` (:func:`factorisation_problem`, checked once per cell and
        cached: a dictionary lookup at later steps).

        Raises:
            ValueError: the cell lacks ``preactivation(x, h)`` or ``activation(z)``, or its ``forward`` is not
                their composition (the products at ``z`` would be another step's).
        """
        if not (hasattr(self.cell, "preactivation") and hasattr(self.cell, "activation")):
            raise ValueError(
                f"{type(self.cell).__name__} has no preactivation(x, h) and activation(z): projection='preactivation'"
                " needs both (forward = activation(preactivation(x, h))); use projection='state' or 'parameter'."
            )
        problem = factorisation_problem(self.cell, ("step",), self.layout, (self.x.shape[1], self.h.shape[1]))
        if problem is not None:
            raise ValueError(
                f"{problem}: the products at the preactivation (projection='preactivation', 'none', KF-RTRL) would be"
                " another step's; use the products of forward (projection='state' or 'parameter')."
            )

    @property
    def preactivation(self) -> torch.Tensor:
        """``z = cell.preactivation(x, h)``, ``(B, Z)``."""
        if not hasattr(self, "_z"):
            self.require_preactivation()
            self._z = self._call("preactivation", self.params, self.x, self.h)
        return self._z

    def activation_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        """``J^{h_new}_{z} v`` for ``v`` ``(B, Z)`` -> ``(B, H)``."""
        return jvp(lambda z: self._call("activation", self.params, z), (self.preactivation,), (tangent,))[1]

    def activation_jacobian(self) -> torch.Tensor:
        """``J^{h_new}_{z}`` per stream, ``(B, H, Z)``."""
        eye = torch.eye(self.preactivation.shape[1], dtype=self.h.dtype, device=self.h.device)
        columns = eye.expand(self.h.shape[0], -1, -1)
        return vmap(self.activation_jvp, in_dims=2, out_dims=2)(columns)

    def preactivation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        """``c_b^T J^{z}_{theta}`` per stream: ``c`` ``(B, Z)`` -> ``(B, P)``."""
        return self._per_stream_vjp("preactivation", (self.x, self.h), cotangent)

    def post_activation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        """``c_b^T J^{h_new}_{theta}`` at fixed ``z`` (parameters used after the preactivation): ``(B, H) -> (B, P)``."""
        return self._per_stream_vjp("activation", (self.preactivation,), cotangent)

    # -- fused forms for UORO's update (closed forms override them to skip materialising c^T J) ---------------
    def vjp_norm(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        """``||c_b^T J||`` per stream ``(B,)`` for ``kind`` in ``"parameter" | "preactivation" | "post_activation"``."""
        return torch.linalg.vector_norm(self._cached_vjp(kind, cotangent), dim=1)

    def vjp_accumulate(self, kind: str, out: torch.Tensor, cotangent: torch.Tensor, scale: torch.Tensor) -> None:
        """``out += scale_b c_b^T J`` in place, ``out`` ``(B, P)``, ``scale`` ``(B,)``."""
        out.addcmul_(self._cached_vjp(kind, cotangent), scale[:, None])

    def _cached_vjp(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        # The generic path computes c^T J once for both the norm and the accumulation of the same c.
        cached = getattr(self, "_last_vjp", None)
        if cached is not None and cached[0] == kind and cached[1] is cotangent:
            return cached[2]
        value = getattr(self, f"{kind}_vjp")(cotangent)
        self._last_vjp = (kind, cotangent, value)
        return value

    def has_post_activation_parameters(self) -> bool:
        """Whether ``activation`` reads any parameter (decided once per cell and cached for its class and parameter
        names: :func:`post_activation_parameters`)."""
        return post_activation_parameters(self.cell, self.preactivation[:1].detach(), self.layout)


class TanhStepLinearization(StepLinearization):
    """Closed-form products of ``h' = tanh(W_h h + W_x x + b)`` (Cooijmans & Martens's vanilla RNN): with
    ``d = 1 - h'^2``, ``J^{h'}_h v = d * (W_h v)``, ``c^T J^{h'}_theta = (c * d) [h; x; 1]^T`` (outer products per
    stream), ``J^{h'}_z = diag(d)``. No ``torch.func`` transform, one matrix product per call."""

    def __init__(self, cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None):
        self.cell, self.x, self.h = cell, x, h
        self.layout = layout if layout is not None else ParameterLayout(cell)
        self.params = _cell_parameters(cell)
        self._z = torch.addmm(self.params["bias"], h, self.params["weight_hh"].T) + x @ self.params["weight_ih"].T
        self.h_new = torch.tanh(self._z)
        self.slope = 1 - self.h_new.square()

    def _outer(self, g: torch.Tensor) -> torch.Tensor:
        """``(B, H)`` -> ``(B, P)``: per stream ``[vec(g h^T), vec(g x^T), g]`` in the layout's order."""
        parts = {
            "weight_hh": g[:, :, None] * self.h[:, None, :],
            "weight_ih": g[:, :, None] * self.x[:, None, :],
            "bias": g,
        }
        return self.layout.flatten(parts, lead=1)

    def state_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return self.slope * (tangent @ self.params["weight_hh"].T)

    def _factor(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        """``g`` of ``c^T J = g [h; x; 1]^T``: ``c * d`` for the parameters, ``c`` for the preactivation."""
        if kind == "parameter":
            return cotangent * self.slope
        if kind == "preactivation":
            return cotangent
        raise ValueError(f"TanhRNNCell has no {kind} parameters.")

    def vjp_norm(self, kind: str, cotangent: torch.Tensor) -> torch.Tensor:
        if kind == "post_activation":
            return cotangent.new_zeros(cotangent.shape[0])
        # ||g a^T||_F = ||g|| ||a|| with a = [h; x; 1]
        inputs = (self.h.square().sum(1) + self.x.square().sum(1) + 1).sqrt()
        return torch.linalg.vector_norm(self._factor(kind, cotangent), dim=1) * inputs

    def vjp_accumulate(self, kind: str, out: torch.Tensor, cotangent: torch.Tensor, scale: torch.Tensor) -> None:
        if kind == "post_activation":
            return
        g = self._factor(kind, cotangent) * scale[:, None]
        self.layout.block(out, "weight_hh").addcmul_(g[:, :, None], self.h[:, None, :])
        self.layout.block(out, "weight_ih").addcmul_(g[:, :, None], self.x[:, None, :])
        self.layout.block(out, "bias").add_(g)

    def state_jvp_columns(self, tangents: torch.Tensor) -> torch.Tensor:
        return self.slope[:, :, None] * torch.matmul(self.params["weight_hh"], tangents)

    def parameter_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._outer(cotangent * self.slope)

    def parameter_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        p = self.layout.unflatten(tangent)
        dz = (
            torch.einsum("bij,bj->bi", p["weight_hh"], self.h)
            + torch.einsum("bij,bj->bi", p["weight_ih"], self.x)
            + p["bias"]
        )
        return self.slope * dz

    def parameter_jacobian(self) -> torch.Tensor:
        batch, hidden = self.h.shape
        eye = torch.eye(hidden, dtype=self.h.dtype, device=self.h.device)
        scaled = eye[None] * self.slope[:, :, None]  # (B, H, H): d_i delta_ij
        parts = {
            "weight_hh": scaled[:, :, :, None] * self.h[:, None, None, :],
            "weight_ih": scaled[:, :, :, None] * self.x[:, None, None, :],
            "bias": scaled,
        }
        return self.layout.flatten(parts, lead=2)

    def activation_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return self.slope * tangent

    def activation_jacobian(self) -> torch.Tensor:
        return torch.diag_embed(self.slope)

    def preactivation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return self._outer(cotangent)

    def post_activation_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return cotangent.new_zeros(cotangent.shape[0], self.layout.size)

    def has_post_activation_parameters(self) -> bool:
        return False


class LinearStepLinearization(StepLinearization):
    """Closed-form products of ``h' = A h + theta c`` (:class:`~lightning_ortho.online.InfluenceBalancingCell`):
    ``J^{h'}_h v = A v``, ``J^{h'}_theta = c`` (one scalar parameter), no preactivation."""

    def __init__(self, cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout | None = None):
        self.cell, self.x, self.h = cell, x, h
        self.layout = layout if layout is not None else ParameterLayout(cell)
        self.params = _cell_parameters(cell)
        self.transition, self.signs = cell.transition.to(h.dtype), cell.signs.to(h.dtype)
        self.h_new = h @ self.transition.T + self.params["theta"] * self.signs

    def state_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return tangent @ self.transition.T

    def state_jvp_columns(self, tangents: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.transition, tangents)

    def parameter_vjp(self, cotangent: torch.Tensor) -> torch.Tensor:
        return cotangent @ self.signs[:, None]

    def parameter_jvp(self, tangent: torch.Tensor) -> torch.Tensor:
        return tangent * self.signs

    def parameter_jacobian(self) -> torch.Tensor:
        return self.signs[None, :, None].expand(self.h.shape[0], -1, 1)

    def require_preactivation(self) -> None:
        raise ValueError("InfluenceBalancingCell has no preactivation(x, h): use projection='state' or 'parameter'.")

    @property
    def preactivation(self) -> torch.Tensor:
        self.require_preactivation()
        raise AssertionError  # unreachable


#: Closed forms of cell classes that do not carry a ``linearize`` method (``nn``'s OrthogonalRNNCell: ``nn`` never
#: imports ``online``), keyed by the exact class (a subclass may change the step: it takes the generic path). Each
#: returns its linearisation, or ``None`` for an instance it does not cover. Filled by :func:`register_closed_form`
#: from the modules that implement them, which ``lightning_ortho.online`` imports.
_CLOSED_FORMS: dict[type, Callable[..., StepLinearization | None]] = {}


def register_closed_form(cell_type: type, linearization: Callable[..., StepLinearization | None]) -> None:
    """Make :func:`linearize` use ``linearization(cell, x, h, layout)`` for cells of exactly ``cell_type``."""
    _CLOSED_FORMS[cell_type] = linearization


def linearize(cell: nn.Module, x: torch.Tensor, h: torch.Tensor, layout: ParameterLayout, *, closed_form: bool = True):
    """The cell's closed-form :class:`StepLinearization` when it offers one (a ``linearize`` method, or a form
    registered for its class) and ``closed_form``, else the generic one.

    Args:
        cell: the recurrent cell.
        x: ``(B, I)`` inputs of this step.
        h: ``(B, H)`` previous states.
        layout: the cell's :class:`ParameterLayout`.
        closed_form: use the closed form when there is one; ``False`` forces the generic path.
    """
    if closed_form:
        fast: Callable | None = getattr(cell, "linearize", None)
        if fast is not None:
            return fast(x, h, layout)
        registered = _CLOSED_FORMS.get(type(cell))
        lin = None if registered is None else registered(cell, x, h, layout)
        if lin is not None:
            return lin
    return StepLinearization(cell, x, h, layout)
