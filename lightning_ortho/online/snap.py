"""The sparse n-step approximation of RTRL (SnAp-1, SnAp-2): Menick, Elsen, Evci, Osindero, Simonyan & Graves 2021,
"A Practical Sparse Approximation for Real Time Recurrent Learning" (ICLR), Section 3.

RTRL's influence ``M_t = dh_t/dtheta`` kept only on the entries ``(unit k, parameter p)`` that ``p`` reaches
within ``n`` steps of the recurrent core; every other entry is dropped at every step. The pattern is read once
from the structure of the cell's Jacobians (:func:`jacobian_pattern`).
"""

from __future__ import annotations

import numbers
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call, jacrev

from lightning_ortho._native.factored_traces import FactoredTanhTrace
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.uoro_fused import fusable_tanh_cell

__all__ = ["SnAp", "jacobian_pattern", "snap_mask"]

Product = Literal["auto", "sparse", "dense"]
#: ``product="auto"`` takes the sparse product when it multiplies at most this fraction of the ``H^2 P`` terms of
#: RTRL's dense product (a gathered multiply-add costs several times a BLAS one).
_SPARSE_SHARE = 1 / 16


def jacobian_pattern(
    cell: nn.Module, layout: ParameterLayout, input_size: int, hidden_size: int, probes: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """The structural nonzeros of the step's Jacobians: ``(state (H, H), parameter (H, P))`` boolean, CPU.

    ``state[k, j]``: unit ``k`` of ``h_t`` reads unit ``j`` of ``h_{t-1}`` (``dF/dh``); ``parameter[k, p]``:
    parameter ``p`` (in ``layout``'s order) touches unit ``k`` in one step (``dF/dtheta``). An entry is
    structural when it is nonzero at one of ``probes`` random points: inputs ``x ~ N(0, 1)``, states
    ``h ~ N(0, 1/4)``, parameters moved by ``N(0, (0.1 s)^2)`` with ``s`` their RMS (``1`` for an all-zero tensor), so
    that a parameter that happens to be zero (a zero-initialised bias) does not hide what it touches. The Jacobians
    come from ``torch.func.jacrev`` through ``functional_call``, in float64 when the cell runs in it (else in the
    cell's dtype). A cell may instead declare the pattern with a method ``jacobian_pattern()`` returning the
    same pair (see :class:`SnAp`). On the meta device (no values) parameters are probed at ``N(0, 1/100)`` draws
    and buffers at zero, so the pattern, and with it the shapes of the state, are those of the materialised cell.
    """
    generator = torch.Generator().manual_seed(0)
    params = dict(cell.named_parameters())
    buffers = dict(cell.named_buffers())
    first = next(iter(params.values()))
    state = torch.zeros(hidden_size, hidden_size, dtype=torch.bool)
    parameter = torch.zeros(hidden_size, layout.size, dtype=torch.bool)
    draw = lambda *shape: torch.randn(shape, generator=generator, dtype=torch.float64)  # noqa: E731  (0-d too)
    for _ in range(probes):
        moved = {}
        for name, p in params.items():
            if p.is_meta:  # no values (deferred initialisation): the structure shows at random values as well
                moved[name] = 0.1 * draw(*p.shape)
                continue
            scale = p.detach().double().square().mean().sqrt().item() if p.numel() else 0.0
            moved[name] = p.detach().double().cpu() + 0.1 * (scale or 1.0) * draw(*p.shape)
        x, h = draw(1, input_size), 0.5 * draw(1, hidden_size)
        try:  # in float64 on the CPU: a float32 tanh' rounds to exactly zero past |z| ~ 9
            values = {
                **{k: _probe_buffer(b) for k, b in buffers.items()},
                **moved,
            }
            jac_h, jac_p = _jacobians(cell, values, x, h)
        except RuntimeError:  # a cell that cannot run in float64 or on the CPU (fixed tensors of its own)
            values = {**buffers, **{k: v.to(first.device, first.dtype) for k, v in moved.items()}}
            jac_h, jac_p = _jacobians(cell, values, x.to(first.device, first.dtype), h.to(first.device, first.dtype))
        state |= (jac_h != 0).cpu()
        parameter |= (layout.flatten(jac_p, lead=1) != 0).cpu()
    return state, parameter


def _probe_buffer(buffer: torch.Tensor) -> torch.Tensor:
    """A buffer's values on the CPU (floating point in float64); zeros of its shape on the meta device."""
    if buffer.is_meta:
        return torch.zeros(buffer.shape, dtype=torch.float64 if buffer.is_floating_point() else buffer.dtype)
    return buffer.double().cpu() if buffer.is_floating_point() else buffer.cpu()


def _jacobians(cell: nn.Module, values: dict[str, torch.Tensor], x: torch.Tensor, h: torch.Tensor):
    """``(dF/dh (H, H), {name: dF/dparam (H, *shape)})`` at one point ``x`` ``(1, I)``, ``h`` ``(1, H)``."""
    parameters = {k: v for k, v in values.items() if k in dict(cell.named_parameters())}
    rest = {k: v for k, v in values.items() if k not in parameters}
    step = lambda p, hh: functional_call(cell, {**rest, **p}, (x, hh[None]))[0]  # noqa: E731
    return jacrev(step, argnums=1)(parameters, h[0]), jacrev(step, argnums=0)(parameters, h[0])


def snap_mask(state: torch.Tensor, parameter: torch.Tensor, order: int) -> torch.Tensor:
    """The entries SnAp-``order`` keeps, ``(H, P)`` boolean (Menick et al. 2021, Section 3): ``M_1`` = the pattern of
    ``dF/dtheta``; ``M_2 = M_1 OR pattern((dF/dh) (dF/dtheta))``, the units a parameter reaches within two steps."""
    if order == 1:
        return parameter.clone()
    reach = (state.to(torch.float64) @ parameter.to(torch.float64)) > 0
    return parameter | reach


def _greedy_colours(conflicts: torch.Tensor) -> torch.Tensor:
    """A colour per node ``(n,)`` (long) such that no two conflicting nodes share one (``conflicts`` ``(n, n)``
    boolean, symmetric); greedy in node order."""
    colours: list[int] = []
    for node, row in enumerate(conflicts.tolist()):
        taken = {colours[j] for j in range(node) if row[j]}
        colour = 0
        while colour in taken:
            colour += 1
        colours.append(colour)
    return torch.tensor(colours, dtype=torch.long)


def _indicators(colours: torch.Tensor) -> torch.Tensor:
    """``(C, n)``: row ``c`` is one on the nodes of colour ``c``."""
    count = int(colours.max()) + 1 if colours.numel() else 0
    return (colours[None, :] == torch.arange(count)[:, None]).to(torch.float64)


class SnAp(OnlineGradientEstimator):
    """SnAp-n (Menick et al. 2021, Section 3): RTRL with the influence kept on a fixed sparsity pattern ``mask``,

        ``M_t = mask * (J_t M_{t-1} + I_t)``,  ``M_0 = 0``,  ``dL_t/dtheta ~ (dL_t/dh_t) M_t``

    with ``J_t = dh_t/dh_{t-1}`` and ``I_t = dh_t/dtheta`` (the step's :class:`StepLinearization` products) and
    ``mask`` = :func:`snap_mask` of the cell's structure. ``order=1`` keeps the entries where ``I_t`` is
    structurally nonzero (one per parameter for a cell whose parameters each touch one unit: ``O(P)`` memory and
    time, exact when the recurrence is element-wise); ``order=2`` adds the units a parameter reaches through one
    more step of ``J``. For a dense recurrent matrix ``M_2`` is full and SnAp-2 is RTRL; SnAp-2 pays off for
    sparse recurrent weights. The first step from a zero influence is exact for any order (``M_1 = I_1``), and
    SnAp-2 is exact for two steps.

    Memory: the state holds the ``K`` kept values per stream, ``(B, K)`` (RTRL holds ``(B, H, P)``), in the
    order of :attr:`rows`, :attr:`cols` (the kept entries, row-major); shared by all streams, :attr:`plan_size`
    integer indices, ``O(K + N)``. The sparse update costs ``O(B N)`` multiply-adds, ``N`` (:attr:`pairs`) the
    pairs ``(k, p) <- (j, p)`` of kept entries where unit ``k`` reads unit ``j`` (``N = K = P`` for SnAp-1 of a
    cell whose parameters each touch one unit), plus one Jacobian-vector product per colour of ``J``'s columns and
    one vector-Jacobian product per colour of ``I``'s rows, where columns that no row reads together, and rows
    that no parameter touches together, share a colour (the grouping of Curtis, Powell & Reid 1974): ``H`` and
    ``1`` products for a dense tanh RNN. The dense update (``product="dense"``, or ``"auto"`` where the sparse one
    would multiply more than 1/16 of RTRL's ``H^2 P`` terms) runs RTRL's step on the influence scattered into
    ``(B, H, P)`` and gathers the kept entries back: RTRL's cost, the same result. Deriving the pattern holds
    ``(H, P)`` dense Jacobians once.

    Args:
        cell: the recurrent cell. Its pattern is derived with :func:`jacobian_pattern` (which needs the cell's
            ``input_size`` and ``hidden_size``) unless the cell declares it: a method ``jacobian_pattern()``
            returning boolean ``(state (H, H), parameter (H, P))`` (``P`` in ``named_parameters`` order), which
            must hold every entry that can be nonzero (else the estimate is wrong).
        order: 1 or 2, the steps of reach kept.
        product: ``"auto"``, ``"sparse"`` or ``"dense"`` (the same estimate; see above).
        probes: random points whose union of nonzeros is the derived pattern.
        closed_form: use the cell's closed-form Jacobian products when it has them.

    Raises:
        ValueError: ``order`` is not 1 or 2, ``product`` unknown, ``probes < 1``, a declared pattern of the wrong
            shape or dtype, a cell without ``input_size``/``hidden_size`` that declares no pattern, or a complex
            state (:meth:`cell_problem`; the message names the estimators that can train the cell).
    """

    name = "snap"

    @classmethod
    def cell_problem(cls, cell: nn.Module, **options) -> str | None:
        """As :meth:`OnlineGradientEstimator.cell_problem`, and the cell's Jacobian pattern must be known: declared
        (``jacobian_pattern()``) or probed, which needs the cell's ``input_size`` and ``hidden_size``."""
        problem = super().cell_problem(cell, **options)
        if problem is None and getattr(cell, "jacobian_pattern", None) is None:
            sizes = [getattr(cell, n, None) for n in ("input_size", "hidden_size")]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
                problem = (
                    f"SnAp: {type(cell).__name__} declares no input_size/hidden_size, so its Jacobian pattern cannot"
                    " be probed; give the cell those attributes or a jacobian_pattern() method."
                )
        return problem

    def __init__(
        self, cell: nn.Module, *, order: int = 1, product: Product = "auto", probes: int = 3, closed_form: bool = True
    ) -> None:
        if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order not in (1, 2):
            raise ValueError(
                f"SnAp: order must be 1 or 2 (the steps of reach kept in the influence), got {order!r}; use RTRL for"
                " the exact influence."
            )
        if product not in ("auto", "sparse", "dense"):
            raise ValueError(f"SnAp: product must be 'auto', 'sparse' or 'dense', got {product!r}.")
        if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
            raise ValueError(f"SnAp: probes must be a positive integer (random points to probe), got {probes!r}.")
        super().__init__(cell, closed_form=closed_form)
        self.order = int(order)
        state, parameter = self._pattern(cell, probes)
        self.state_pattern, self.parameter_pattern = state, parameter
        kept = snap_mask(state, parameter, order)
        hidden, size = kept.shape
        self.rows, self.cols = kept.nonzero(as_tuple=True)  # (K,) each, row-major
        self.kept = int(self.rows.numel())
        self.full = self.kept == hidden * size
        # N: the pairs ((k, p), (j, p)) of kept entries with state[k, j], i.e. the terms of the sparse product
        used = kept.to(torch.float64)
        self.pairs = int(((state.to(torch.float64) @ used) * used).sum().item())
        dense = self.full or self.pairs > _SPARSE_SHARE * hidden * hidden * size
        self.dense = product == "dense" or (product == "auto" and dense)
        self._plan = self._dense_plan() if self.dense else self._sparse_plan(state, parameter)
        #: integer indices the update and the gradient share across streams (``rows``, ``cols`` and the plan)
        self.plan_size = 2 * self.kept + sum(v.numel() for v in self._plan.values() if not v.is_floating_point())
        self._cache: dict[tuple, dict[str, torch.Tensor]] = {}
        #: the fused step and estimate (one C call each: :meth:`_advance_step`) where the kept entries are a factored
        #: trace of a plain tanh cell, else ``None``
        self._fused = FactoredTanhTrace(cell, flat=True) if self._factored(cell, state, parameter) else None

    # -- structure ------------------------------------------------------------------------------------------
    def _pattern(self, cell: nn.Module, probes: int) -> tuple[torch.Tensor, torch.Tensor]:
        declared = getattr(cell, "jacobian_pattern", None)
        if declared is None:  # the sizes are there: cell_problem
            return jacobian_pattern(cell, self.layout, self.input_size, self.hidden_size, probes)
        state, parameter = declared()
        hidden = self.hidden_size if self.hidden_size is not None else state.shape[0]
        for name, value, shape in (
            ("state", state, (hidden, hidden)),
            ("parameter", parameter, (hidden, self.layout.size)),
        ):
            if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or tuple(value.shape) != shape:
                got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"SnAp: {type(cell).__name__}.jacobian_pattern() must return bool tensors (state (H, H), parameter"
                    f" (H, P)); its {name} pattern is {got}, expected torch.bool {shape}."
                )
        return state.cpu(), parameter.cpu()

    def _factored(self, cell: nn.Module, state: torch.Tensor, parameter: torch.Tensor) -> bool:
        """Whether the kept entries are a factored trace of a plain tanh cell, so that the C kernels of
        :mod:`lightning_ortho._native.factored_traces` compute the step: the cell is a plain
        :class:`~lightning_ortho.online.TanhRNNCell` (:func:`~lightning_ortho.online.uoro_fused.fusable_tanh_cell`),
        the kept entries, row-major, are exactly the row ``[W_h[k, :], W_x[k, :], b_k]`` of every unit ``k`` (as
        for SnAp-1), where the immediate influence ``I_t`` is nonzero, and every unit reads itself (``J[k, k]``,
        the one entry of ``J`` such a pattern reads). Not with ``closed_form=False`` (the generic path that tests
        compare with)."""
        if not self.closed_form or not fusable_tanh_cell(cell, self.layout):
            return False
        hidden, inputs = cell.hidden_size, cell.input_size
        columns = hidden + inputs + 1
        units = torch.arange(hidden)
        offsets = torch.cat(
            [
                units[:, None] * hidden + torch.arange(hidden),  # W_h[k, :]
                hidden * hidden + units[:, None] * inputs + torch.arange(inputs),  # W_x[k, :]
                (hidden * (hidden + inputs) + units)[:, None],  # b_k
            ],
            dim=1,
        )
        return (
            tuple(parameter.shape) == (hidden, hidden * columns)
            and self.kept == hidden * columns
            and torch.equal(self.rows, units.repeat_interleave(columns))
            and torch.equal(self.cols, offsets.reshape(-1))
            and bool(parameter[self.rows, self.cols].all())
            and bool(state.diagonal().all())
        )

    def _dense_plan(self) -> dict[str, torch.Tensor]:
        return {"flat": self.rows * self.layout.size + self.cols}

    def _sparse_plan(self, state: torch.Tensor, parameter: torch.Tensor) -> dict[str, torch.Tensor]:
        """Index tensors of the sparse update (CPU; moved to the state's device on first use)."""
        size, cols, rows = self.layout.size, self.cols, self.rows
        # I_t: units that share no parameter share a colour; one vector-Jacobian product per colour.
        unit_colours = _greedy_colours((parameter.double() @ parameter.double().T) > 0)
        source = parameter[rows, cols]  # kept entries where I_t can be nonzero
        source_entries = source.nonzero(as_tuple=True)[0]
        source_index = unit_colours[rows[source_entries]] * size + cols[source_entries]
        # J_t: columns (units of h_{t-1}) that no unit reads together share a colour; one JVP per colour.
        column_colours = _greedy_colours((state.double().T @ state.double()) > 0)
        colours = int(column_colours.max()) + 1 if column_colours.numel() else 0
        # The pairs: kept entries grouped by parameter, every (k, j) within a group that state[k, j] links.
        by_column = torch.argsort(cols * len(state) + rows)
        counts = torch.bincount(cols, minlength=size)
        starts = torch.cumsum(counts, 0) - counts
        group = counts[cols[by_column]]  # (K,) size of each sorted entry's group
        out_sorted = torch.repeat_interleave(torch.arange(len(by_column)), group)
        offset = torch.arange(int(group.sum())) - torch.repeat_interleave(torch.cumsum(group, 0) - group, group)
        partner_sorted = starts[cols[by_column[out_sorted]]] + offset
        out, partner = by_column[out_sorted], by_column[partner_sorted]
        linked = state[rows[out], rows[partner]]
        out, partner = out[linked], partner[linked]
        return {
            "unit_indicators": _indicators(unit_colours),  # (C_I, H)
            "source_entries": source_entries,
            "source_index": source_index,
            "column_indicators": _indicators(column_colours),  # (C_J, H)
            "pair_out": out,
            "pair_in": partner,
            "pair_jacobian": rows[out] * colours + column_colours[rows[partner]],
        }

    def _on(self, like: torch.Tensor) -> dict[str, torch.Tensor]:
        """The plan on ``like``'s device (indicators in its dtype), cached."""
        key = (like.device, like.dtype)
        if key not in self._cache:
            self._cache[key] = {
                k: v.to(like.device, like.dtype if v.is_floating_point() else v.dtype)
                for k, v in {**self._plan, "rows": self.rows, "cols": self.cols}.items()
            }
        return self._cache[key]

    # -- the estimator's hooks ------------------------------------------------------------------------------
    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"influence": h0.new_zeros(h0.shape[0], self.kept)}

    def _fused_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """Where the kept entries are a factored trace of a plain tanh cell (SnAp-1 of
        :class:`~lightning_ortho.online.TanhRNNCell`), the cell's step and ``m' = d * (diag(W_h) m + a^T)`` row by
        row in one C call (:meth:`~lightning_ortho._native.factored_traces.FactoredTanhTrace.step`, which also sums
        ``x``, ``h'`` and ``m'`` for the NaN/inf verdict) where the tensors allow it (see
        :meth:`OnlineGradientEstimator._fused_step`); else ``None``: the cell's linearisation and :meth:`_advance`."""
        fused = self._fused
        if fused is not None:
            done = fused.step(x, state.h, state.tensors["influence"], True)
            if done is not None:
                return Advance(done[0], {"influence": done[1]}, None, done[2])
        return None

    def _fused_gradient(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[dict[str, torch.Tensor], float] | None:
        """The summed estimate in one C call where :meth:`_fused_step` may fuse (its verdict: the sum of ``grad_h``
        and the estimate); else ``None``: :meth:`_gradient_summed`."""
        fused = self._fused
        return None if fused is None else fused.gradient(state.h, state.tensors["influence"], grad_h)

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        values = state.tensors["influence"]
        plan = self._on(values)
        if self.dense:
            return {"influence": self._dense_update(lin, values, plan)}
        return {"influence": self._sparse_update(lin, values, plan)}

    def _dense_update(self, lin: StepLinearization, values: torch.Tensor, plan) -> torch.Tensor:
        """RTRL's step on the influence scattered into ``(B, H, P)``, then the kept entries gathered back."""
        batch, (hidden, size) = values.shape[0], (len(self.state_pattern), self.layout.size)
        if self.full:  # the kept entries, row-major, are the whole influence
            influence = values.reshape(batch, hidden, size)
        else:
            influence = values.new_zeros(batch, hidden * size)
            influence[:, plan["flat"]] = values
            influence = influence.view(batch, hidden, size)
        updated = (lin.state_jvp_columns(influence) + lin.parameter_jacobian()).reshape(batch, -1)
        return updated if self.full else updated[:, plan["flat"]]

    def _sparse_update(self, lin: StepLinearization, values: torch.Tensor, plan) -> torch.Tensor:
        """``mask * (J M + I)`` on the kept entries: gathered products and one ``index_add``."""
        batch = values.shape[0]
        units = plan["unit_indicators"]
        sources = torch.cat([lin.parameter_vjp(c.expand(batch, -1)) for c in units], dim=1)  # (B, C_I * P)
        updated = values.new_zeros(batch, self.kept)
        updated[:, plan["source_entries"]] = sources[:, plan["source_index"]]
        if plan["pair_out"].numel():
            tangents = plan["column_indicators"].T.expand(batch, -1, -1)  # (B, H, C_J)
            jacobian = lin.state_jvp_columns(tangents).reshape(batch, -1)  # (B, H * C_J): J[k, j] at k * C_J + c(j)
            terms = jacobian[:, plan["pair_jacobian"]] * values[:, plan["pair_in"]]
            updated.index_add_(1, plan["pair_out"], terms)
        return updated

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        values = state.tensors["influence"]
        if self.full:
            return torch.einsum("bh,bhp->bp", grad_h, values.reshape(values.shape[0], grad_h.shape[1], -1))
        plan = self._on(values)
        out = values.new_zeros(values.shape[0], self.layout.size)
        return out.index_add_(1, plan["cols"], grad_h[:, plan["rows"]] * values)

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        values = state.tensors["influence"]
        if self.full:
            return self._gradient_flat(state, grad_h).sum(0)
        plan = self._on(values)
        terms = (grad_h[:, plan["rows"]] * values).sum(0)
        return values.new_zeros(self.layout.size).index_add_(0, plan["cols"], terms)
