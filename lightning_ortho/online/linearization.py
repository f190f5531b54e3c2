"""One step of a recurrent cell and its exact Jacobian products, per stream.

Notation of Cooijmans & Martens 2019: ``h_t = F(h_{t-1}, x_t; theta_t)``; ``J^{h_t}_{h_{t-1}}`` is the state Jacobian,
``J^{h_t}_{theta_t}`` the immediate parameter Jacobian, ``z_t`` a cut vertex (the preactivation). A batch holds
``B`` independent streams, so every product is per stream: parameter-side results are ``(B, P)`` with
``P`` the number of parameters laid out by :class:`ParameterLayout`.

:class:`StepLinearization` computes every product exactly with ``torch.func`` (``jvp`` for forward mode,
``vjp``/``jacrev`` under ``vmap`` for per-stream reverse mode) through ``functional_call``, never with finite
differences. :class:`TanhStepLinearization` is the closed form for :class:`~lightning_ortho.online.TanhRNNCell`.
"""

from __future__ import annotations

from collections.abc import Callable

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
        goes to :meth:`unflatten`."""
        if flat.dim() > 2 or flat.requires_grad or not flat.is_contiguous():
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


def activation_reads_parameters(cell: nn.Module, z: torch.Tensor) -> bool:
    """Whether ``cell.activation`` depends on any parameter of the cell (evaluated at ``z`` ``(1, Z)``)."""
    leaves = {f"cell.{k}": p.detach().clone().requires_grad_(True) for k, p in cell.named_parameters()}
    with torch.enable_grad():
        out = functional_call(_Method(cell, "activation"), leaves, (z,))
        if not out.requires_grad:
            return False
        grads = torch.autograd.grad(out.sum(), list(leaves.values()), allow_unused=True)
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
        """Check that the cell offers the preactivation cut vertex (UORO's ``projection="preactivation"``).

        Raises:
            ValueError: the cell lacks ``preactivation(x, h)`` or ``activation(z)`` (it needs both, with
                ``forward = activation(preactivation(x, h))``).
        """
        if not (hasattr(self.cell, "preactivation") and hasattr(self.cell, "activation")):
            raise ValueError(
                f"{type(self.cell).__name__} has no preactivation(x, h) and activation(z): projection='preactivation'"
                " needs both (forward = activation(preactivation(x, h))); use projection='state' or 'parameter'."
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
        """Whether ``activation`` reads any parameter (decided once per cell type and cached on the cell)."""
        cached = getattr(self.cell, "_online_post_parameters", None)
        if cached is None:
            cached = activation_reads_parameters(self.cell, self.preactivation[:1].detach())
            object.__setattr__(self.cell, "_online_post_parameters", cached)
        return cached


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
