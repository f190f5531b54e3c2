"""UORO's step on :class:`~lightning_ortho.online.TanhRNNCell` in a few fused PyTorch calls.

The tanh cell ``h' = tanh(W_h h + W_x x + b)`` has, with ``d = 1 - h'^2`` and ``a = [h; x; 1]`` (the vanilla
RNN of Cooijmans & Martens 2019)::

    J^{h'}_h v = d * (W_h v),     c^T J^{h'}_theta = (c * d) a^T,     J^{h'}_z = diag(d),     c^T J^z_theta = c a^T

so the parameter-side product of a UORO step is one outer product per stream, of norm ``||c * d|| ||a||``.
:class:`TanhUOROStep` runs the whole step of Tallec & Ollivier's UORO (GIR or a fixed rescaling
``Q_t = alpha_t Q0``; cut vertex ``h`` or ``z``) as about thirty calls on ``(B, H)`` tensors and two passes over
``w_tilde`` ``(B, P)`` (its norm, and its rescaling and rank-one update in place; a large ``w_tilde`` on the CPU
takes one, each stream's norm read right after its update while the row is still in cache): no
:class:`~lightning_ortho.online.linearization.StepLinearization`, no ``c^T J`` materialised, no host
synchronisation. It computes what :meth:`lightning_ortho.online.UORO._advance` computes on the cell's closed
form, to float rounding (the tests compare it with the ``torch.func`` path in float64).

With GIR at small sizes on the CPU (:data:`ONE_CALL_MAX_BYTES`) the whole step is one C call instead
(:meth:`TanhUOROStep.whole_gir`, :class:`OneCallStep`): the cell's step, ``W_h h_tilde``, the norms, gamma and beta,
``h_tilde'`` and ``w_tilde'`` (into a new tensor), from the draw as drawn; a step then costs the draw (two generator
calls), the checks of ``x`` (those of the state and of the parameters are remembered while they hold:
:meth:`TanhUOROStep.whole_gir_kernels`, :class:`~lightning_ortho._native.tanh_cell.TanhParameters`), three allocations and the call. UORO tries it
first, before its template's checks (:meth:`lightning_ortho.online.UORO._fused_step`).

Every fused step plugs into :class:`~lightning_ortho.online.UORO`'s one step template behind the
:class:`FusedStep` protocol (:class:`TanhUOROStep` here, :class:`~lightning_ortho.online.orthogonal_uoro.OrthogonalUOROStep`
for the orthogonal cell): the estimator draws the noise, checks the result and calls ``commit`` after the checks;
:func:`fused_step_for` picks the class whose ``fits`` takes the cell. A new fused kernel is one more such class.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from lightning_ortho._native.guard import real_cpu, tracing
from lightning_ortho._native.tanh_cell import TanhParameters
from lightning_ortho._native.uoro import commit, gir_rows, gir_step, row_norms, uoro_tanh_kernels
from lightning_ortho.online.cells import TanhRNNCell, plain_tanh_step
from lightning_ortho.online.linearization import ParameterLayout

#: Parameters from which the PyTorch path of :meth:`TanhUOROStep.commit` (the C kernels always take one pass)
#: updates ``w_tilde`` stream by stream in one pass and takes its norms on the way (on the CPU): from about this size
#: the pass it saves over a memory-bound ``w_tilde`` outweighs the three calls per stream it costs, below it the
#: calls cost more than the pass.
ROW_UPDATE_MIN = 1 << 16
#: Bytes of ``W_h`` from which :meth:`TanhUOROStep._forward` reads it once for ``h`` and ``h_tilde`` (one product
#: of their stack) on the CPU: past a core's L2 cache the second read would come from memory; below it the stack
#: costs more than the read it saves.
STACKED_FORWARD_MIN = 1 << 21
#: The most bytes ``B H (H + I) x itemsize`` (the cell's multiply-adds, about those of ``W_h h_tilde``, in the dtype's
#: bytes) for which :meth:`TanhUOROStep.whole_gir` runs the GIR step as one C call, products included (and
#: ``w_tilde'`` into a new tensor); above it PyTorch's GEMMs do the products and the C row passes the rest,
#: ``w_tilde`` updated in place (measured: the one call takes half the time at one stream, H = 32 to 256, and at
#: 8 streams, H = 32 and 64; the GEMMs win from about 8 streams at H = 128 in float64, 192 in float32).
ONE_CALL_MAX_BYTES = 1 << 20
#: What a one-call step remembers before its first step, ``(h', its influence tensors, their data_ptr()s, B, dtype)``
#: (:class:`TanhUOROStep`, :class:`~lightning_ortho.online.KFRTRL`): no tensor is this object, no dtype either.
NOTHING_MADE = (object(),) * 8
_NOTHING = NOTHING_MADE[0]


@runtime_checkable
class FusedStep(Protocol):
    """A whole UORO step for one kind of cell and cut vertex, in a few fused calls: what
    :class:`~lightning_ortho.online.UORO`'s template needs of it.

    The estimator draws the noise ``nu`` ``(B, H)`` and the signs ``tau`` ``(B, 1)`` (one place for every path),
    calls :meth:`gir` or :meth:`fixed`, checks NaN/inf, then calls :meth:`commit` (GIR only). Parameters are read at
    every call (optimiser updates between steps are seen). Implementations: :class:`TanhUOROStep`,
    :class:`~lightning_ortho.online.orthogonal_uoro.OrthogonalUOROStep`; :func:`fused_step_for` chooses.
    """

    @classmethod
    def fits(cls, cell: nn.Module, projection: str, layout: ParameterLayout) -> bool:
        """Whether this class computes UORO's step on ``cell`` with ``projection`` (to float rounding)."""
        ...

    def gir(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        nu: torch.Tensor,
        tau: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, float | None]:
        """The step with greedy iterative rescaling up to its update of ``w_tilde`` (read only here):
        ``(h', h_tilde', 1 / gamma (B, 1), pending, verdict)``; ``pending`` is what :meth:`commit` needs, and
        ``verdict`` the sum of ``h_tilde'`` as a Python float when it came for free (a C pass), else ``None``. A
        NaN/inf in ``x``, ``h'`` or ``w_tilde`` must reach ``h_tilde'``, so that a finite ``h_tilde'`` is a finite
        step (the estimator checks only it)."""
        ...

    def commit(
        self, w_tilde: torch.Tensor, inverse_gamma: torch.Tensor, pending: Any, h: torch.Tensor, x: torch.Tensor
    ) -> None:
        """``w_tilde <- w_tilde / gamma + (tau / beta) nu^T J^z_theta`` in place, after the checks."""
        ...

    def fixed(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        scaled: torch.Tensor,
        dual: torch.Tensor,
        alpha: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step with a fixed rescaling ``Q_t = alpha Q0``: ``(h', h_tilde', w_tilde')``, new tensors, from
        ``scaled = Q0 u`` and ``dual = Q0^{-T} u`` for ``u = tau nu``."""
        ...


@runtime_checkable
class OneCallStep(FusedStep, Protocol):
    """A :class:`FusedStep` that can also run the whole GIR step, ``w_tilde``'s update included, as one call where
    the sizes and tensors allow it (:class:`TanhUOROStep`): UORO asks :meth:`whole_gir_kernels` first, then draws
    the noise and calls :meth:`whole_gir`; where it declines, :meth:`FusedStep.gir` and :meth:`FusedStep.commit`
    run (the same draw either way)."""

    #: ``H``, the cell's hidden size.
    hidden: int
    #: ``(h', h_tilde', w_tilde', their data_ptr()s, B, dtype)`` of the last :meth:`whole_gir` (a tuple of eight
    #: entries that no tensor is before the first): tensors checked when they were made, which a summed estimate may
    #: take as such while they are the very tensors it is given, at the same addresses.
    made: tuple

    def whole_gir_kernels(
        self, x: torch.Tensor, h: torch.Tensor, h_tilde: torch.Tensor, w_tilde: torch.Tensor
    ) -> Any | None:
        """What :meth:`whole_gir` needs to run on these tensors (the C kernels), or ``None`` where it cannot: in the
        contract of :meth:`lightning_ortho.online.OnlineGradientEstimator._fused_step` (no op autograd records,
        every check of the template's implied)."""
        ...

    def whole_gir(
        self,
        kernels: Any,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        nu: torch.Tensor,
        bits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """The GIR step from the draw as drawn (``nu`` ``(B, H)``, the bits ``(B, 1)`` in ``{0, 1}`` of the signs
        ``tau = 2 bit - 1``): ``(h', h_tilde', w_tilde', verdict)``, new tensors (the state's are read only),
        ``verdict`` the sum of ``x``, ``h'`` and ``h_tilde'`` (see
        :class:`~lightning_ortho.online.estimator.Advance`)."""
        ...


def fused_step_for(cell: nn.Module, projection: str, layout: ParameterLayout, eps: float) -> FusedStep | None:
    """The fused step for ``cell`` and ``projection`` (the first class of :class:`FusedStep` whose ``fits`` takes
    it), or ``None`` (UORO then steps on the cell's linearisation)."""
    # imported here: the orthogonal step needs lightning_ortho.nn, which a plain tanh run never loads
    from lightning_ortho.online.orthogonal_uoro import OrthogonalUOROStep  # noqa: PLC0415

    for kind in (TanhUOROStep, OrthogonalUOROStep):
        if kind.fits(cell, projection, layout):
            return kind(cell, projection, eps)
    return None


def fusable_tanh_cell(cell: nn.Module, layout: ParameterLayout) -> bool:
    """Whether :class:`TanhUOROStep` computes ``cell``'s step: a :class:`TanhRNNCell` whose step is exactly
    ``tanh(W_h h + W_x x + b)`` (:func:`~lightning_ortho.online.cells.plain_tanh_step`) and whose ``linearize``
    is the class's own (a subclass that brings its own Jacobian products keeps them)."""
    return plain_tanh_step(cell, layout) and type(cell).linearize is TanhRNNCell.linearize


class TanhUOROStep:
    """One UORO step of a tanh cell for ``B`` streams.

    Args:
        cell: the :class:`TanhRNNCell` (checked with :func:`fusable_tanh_cell` by the caller); its parameters are
            read at every call, so optimiser updates between steps are seen.
        projection: ``"state"`` (cut vertex ``z = h``) or ``"preactivation"`` (``z = W a``).
        eps: GIR's ``eps`` (added to both norms of each ratio).

    With ``m = nu * d`` the two cut vertices share everything: at ``h`` the forward product is ``psi = nu`` and
    the parameter-side factor ``g = m``; at ``z`` they swap (``psi = m``, ``g = nu``).

    With GIR at small sizes the whole step is one C call (:meth:`whole_gir`: ``w_tilde'`` a new tensor, the state
    left as it was); above them ``w_tilde`` is updated **in place** (:meth:`commit`; a new ``(B, P)`` tensor per
    step would cost a pass and, at large ``P``, fresh pages), and the views of its three parameter blocks are kept
    while it is the same tensor. The norms of a large ``w_tilde`` taken in :meth:`commit` serve the next step's
    ``gamma`` while it is the same tensor at the same version (``Tensor._version``: any in-place change, a reset or a
    loaded checkpoint, which make new tensors, means they are taken afresh).
    """

    def __init__(self, cell: TanhRNNCell, projection: str, eps: float) -> None:
        if projection not in ("state", "preactivation"):
            raise ValueError(f"TanhUOROStep: projection must be 'state' or 'preactivation', got {projection!r}.")
        self.cell, self.state_cut, self.eps = cell, projection == "state", float(eps)
        self._native = True  # the deprecated per-object switch (see native)
        self._blocks: tuple[torch.Tensor, ...] | None = None
        self._rows: tuple | None = None  # (w_tilde, its views per stream: _rows_of)
        self._norms: tuple | None = None  # (w_tilde, its _version, ||w_tilde|| (B, 1)) after commit
        self._constants: tuple = (None,) * 5
        self._checked: tuple | None = None  # (w_tilde, the kernels or None) that gir chose for its commit
        #: ``{dtype: the most streams whose GIR step whole_gir runs as one call}`` (:data:`ONE_CALL_MAX_BYTES`)
        macs = cell.hidden_size * (cell.hidden_size + cell.input_size)
        self.one_call_streams = {t: ONE_CALL_MAX_BYTES // (macs * t.itemsize) for t in (torch.float32, torch.float64)}
        self.hidden, self.inputs = cell.hidden_size, cell.input_size
        self.size = self.hidden * (self.hidden + self.inputs + 1)  # P
        #: the cell's parameters as the one-call step checks them (whole_gir_kernels)
        self.parameters = TanhParameters(cell)
        #: ``(h', h_tilde', w_tilde', their data_ptr()s, B, dtype)`` of the last one-call step (whole_gir)
        self.made: tuple = NOTHING_MADE

    def __getstate__(self) -> dict:  # copy and pickle: what was checked does not travel (new tensors, new memory)
        return {**self.__dict__, "made": NOTHING_MADE}

    @classmethod
    def fits(cls, cell: nn.Module, projection: str, layout: ParameterLayout) -> bool:
        """Cut at ``h`` or ``z`` of a plain tanh cell (:func:`fusable_tanh_cell`)."""
        return projection in ("state", "preactivation") and fusable_tanh_cell(cell, layout)

    @property
    def native(self) -> bool:
        """Deprecated: whether this step may use the C kernels; use :func:`lightning_ortho._native.native_kernels`
        (or ``LIGHTNING_ORTHO_NATIVE=0``). Setting it still turns them off here, with a ``DeprecationWarning``."""
        _warn_native()
        return self._native

    @native.setter
    def native(self, value: bool) -> None:
        _warn_native()
        self._native = bool(value)

    def _constants_like(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(1, eps, -1, 2, ones (B, 1))`` in ``h``'s dtype and device: a 0-d tensor of the operands' dtype is the
        cheapest scalar operand (a Python number or another dtype costs a conversion per call)."""
        compiling = torch.compiler.is_compiling()
        constants = self._constants
        ones = constants[-1]
        if compiling or ones is None or ones.shape[0] != h.shape[0] or ones.dtype != h.dtype or ones.device != h.device:
            ones = h.new_ones(h.shape[0], 1)
            one, eps, minus_one, two = ones.new_tensor([1.0, self.eps, -1.0, 2.0]).unbind()
            constants = (one, eps, minus_one, two, ones)
            if not compiling:  # a compiled graph makes its own: nothing of a trace is kept on the object
                self._constants = constants
        return constants

    def _products(self, x: torch.Tensor, h: torch.Tensor, h_tilde: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_h h + W_x x + b, W_h h_tilde)``, ``(B, H)``: the step's GEMMs."""
        cell = self.cell
        weight_t = cell.weight_hh.T
        if weight_t.nbytes >= STACKED_FORWARD_MIN and h.device.type == "cpu":
            both = torch.mm(torch.cat((h, h_tilde)), weight_t)
            return both[: h.shape[0]].add_(cell.bias).addmm_(x, cell.weight_ih.T), both[h.shape[0] :]
        return torch.addmm(cell.bias, h, weight_t).addmm_(x, cell.weight_ih.T), torch.mm(h_tilde, weight_t)

    def _forward(
        self, x: torch.Tensor, h: torch.Tensor, h_tilde: torch.Tensor, one: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(h', d, J h_tilde)``: the new state, the slope ``d = 1 - h'^2`` and ``d * (W_h h_tilde)``, ``(B, H)``."""
        preactivation, propagated = self._products(x, h, h_tilde)
        h_new = torch.tanh(preactivation)
        slope = torch.addcmul(one, h_new, h_new, value=-1)
        return h_new, slope, propagated.mul_(slope)

    def _kernels(self, *tensors: torch.Tensor) -> tuple | None:
        """The C kernels (:mod:`lightning_ortho._native.uoro_tanh`) when every tensor is a C-contiguous CPU tensor
        of the cell's dtype, else ``None`` (the PyTorch ops then run)."""
        dtype = self.cell.weight_hh.dtype
        if not self._native or any(t.dtype is not dtype or not t.is_contiguous() for t in tensors):
            return None
        return uoro_tanh_kernels(*tensors, self.cell.weight_hh, self.cell.weight_ih, self.cell.bias)

    def whole_gir_kernels(
        self, x: torch.Tensor, h: torch.Tensor, h_tilde: torch.Tensor, w_tilde: torch.Tensor
    ) -> tuple | None:
        """``(the C step, the addresses it reads, (B, H, I))`` for :meth:`whole_gir`, or ``None`` (UORO then runs
        :meth:`gir` and :meth:`commit`, or its template: see :meth:`lightning_ortho.online.UORO._fused_step`).

        It answers only where the one call computes the step of these tensors: ``x`` a ``(B, I)`` tensor with the
        cell's ``I`` and at most :attr:`one_call_streams` streams for its dtype (float32/float64), ``h`` and
        ``h_tilde`` ``(B, H)``, ``w_tilde`` ``(B, P)``, the cell's parameters of their shapes, all of ``x``'s dtype,
        C-contiguous and real CPU tensors, nothing tracing, no autocast, the kernels on and loaded
        (:func:`~lightning_ortho._native.uoro.uoro_tanh_kernels`), the cell still of its class at construction (a
        parametrisation registered since swaps the class). Those are all the template's checks of ``x`` and more.

        At one stream these checks cost as much as the arithmetic, so what was checked is remembered (as
        :class:`~lightning_ortho._native.factored_traces.FactoredTanhTrace` does): the state tensors that
        :meth:`whole_gir` made last (fresh tensors, held here until the next one) pass while they are the very
        tensors passed in, at the same addresses, for a step of the same ``B`` and dtype; the parameters are checked
        by :attr:`parameters` (:class:`~lightning_ortho._native.tanh_cell.TanhParameters`, which remembers them likewise). ``x``, new at every call, is
        checked at every call. The draw that :meth:`whole_gir` reads is drawn after this, in ``x``'s dtype and
        device, into contiguous tensors of its own (:meth:`lightning_ortho.online.UORO._noise_bits`)."""
        if not isinstance(x, torch.Tensor):
            return None
        kernels = uoro_tanh_kernels(x)  # (first: declines while compiling, before any other call on x)
        if kernels is None or not self._native or x.dim() != 2 or not x.is_contiguous():
            return None
        batch, inputs = x.shape
        dtype, hidden = x.dtype, self.hidden
        if inputs != self.inputs or batch > self.one_call_streams.get(dtype, 0):
            return None
        made = self.made
        fits = h is made[0] and h_tilde is made[1] and w_tilde is made[2] and batch == made[6] and dtype is made[7]
        if fits:  # made here, checked then: still at their memory (no set_, resize_)?
            h_pointer, h_tilde_pointer, w_tilde_pointer = h.data_ptr(), h_tilde.data_ptr(), w_tilde.data_ptr()
            fits = h_pointer == made[3] and h_tilde_pointer == made[4] and w_tilde_pointer == made[5]
        if not fits:
            if not (
                isinstance(h, torch.Tensor)  # (the others: real_cpu below)
                and h.dtype is dtype
                and h_tilde.dtype is dtype
                and w_tilde.dtype is dtype
                and h.shape == (batch, hidden)
                and h_tilde.shape == (batch, hidden)
                and w_tilde.shape == (batch, self.size)
                and h.is_contiguous()
                and h_tilde.is_contiguous()
                and w_tilde.is_contiguous()
                and real_cpu(h, h_tilde, w_tilde)
            ):
                return None
            h_pointer, h_tilde_pointer, w_tilde_pointer = h.data_ptr(), h_tilde.data_ptr(), w_tilde.data_ptr()
        addresses = self.parameters.addresses(dtype)
        if addresses is None:
            return None
        addresses += (x.data_ptr(), h_pointer, h_tilde_pointer, w_tilde_pointer)
        return kernels[3], addresses, (batch, hidden, inputs)

    def whole_gir(
        self,
        kernels: tuple,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        nu: torch.Tensor,
        bits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """The whole GIR step as one C call (:func:`lightning_ortho._native.uoro.gir_step`: the cell's step,
        ``W_h h_tilde``, the norms, gamma and beta, ``h_tilde'`` and ``w_tilde'``) with what
        :meth:`whole_gir_kernels` returned for the same tensors: ``(h', h_tilde', w_tilde', the sum of x, h' and
        h_tilde')``, new tensors, ``w_tilde`` read only (the state stays as it was whatever the checks find: nothing
        to commit), from the draw ``nu`` ``(B, H)`` and the sign bits ``bits`` ``(B, 1)`` in ``{0, 1}``
        (C-contiguous, of ``h``'s dtype); the expressions of :meth:`gir` and :meth:`commit`. The new state tensors
        are remembered as checked (:meth:`whole_gir_kernels`)."""
        step, addresses, sizes = kernels
        h_new, h_tilde_new, w_tilde_new, total, *pointers = gir_step(
            step, addresses, h, w_tilde, nu, bits, sizes, self.eps, self.state_cut
        )
        self.made = (h_new, h_tilde_new, w_tilde_new, *pointers, sizes[0], h.dtype)
        return h_new, h_tilde_new, w_tilde_new, total

    def gir(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        nu: torch.Tensor,
        tau: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float | None]:
        """The step with greedy iterative rescaling, up to its update of ``w_tilde``: ``(h', h_tilde', 1 / gamma,
        (tau / beta) g, the sum of h_tilde')`` (the sum a float from the C pass, else ``None``) from ``x`` ``(B, I)``,
        ``h``, ``h_tilde`` ``(B, H)``, ``w_tilde`` ``(B, P)`` (read only), the noise ``nu`` ``(B, H)`` and signs
        ``tau`` ``(B, 1)``; :meth:`commit` then updates ``w_tilde``::

            gamma = sqrt((||w_tilde|| + eps) / (||J h_tilde|| + eps))
            beta = sqrt((||g|| ||a|| + eps) / (||psi|| + eps))
            h_tilde' = gamma J h_tilde + beta tau psi
            w_tilde' = w_tilde / gamma + (tau / beta) g a^T

        A NaN/inf in ``x`` reaches ``h_tilde'`` through ``||a||`` and ``beta`` (``inf * 0`` is NaN), a NaN in
        ``h'`` through ``d``, an overflowed ``w_tilde`` through ``gamma``: a finite ``h_tilde'`` means a finite
        step, so the caller can check its sum before anything is changed in place.
        """
        kernels = self._kernels(h, x, h_tilde, w_tilde, nu, tau)
        if kernels is not None or not torch.compiler.is_compiling():  # (kernels run outside compiled regions only)
            # commit then takes the same path without checking again (its other operands come from here)
            self._checked = (w_tilde, kernels)
        if kernels is not None:  # the row work in one C pass around the GEMMs
            preactivation, propagated = self._products(x, h, h_tilde)
            norms = self._norm_of(w_tilde, kernels, x.shape[1])
            return gir_rows(kernels, preactivation.tanh_(), propagated, nu, tau, h, x, norms, self.eps, self.state_cut)
        one, eps, _, _, ones = self._constants_like(h)
        h_new, slope, propagated = self._forward(x, h, h_tilde, one)
        m = nu * slope
        psi, g = (nu, m) if self.state_cut else (m, nu)
        norm = torch.linalg.vector_norm  # (B, 1) norms of the rows: norm(v, 2, 1, True)
        inputs = norm(torch.cat((h, x, ones), 1), 2, 1, True)  # ||a||
        gamma = self._norm_of(w_tilde).add(eps).div_(norm(propagated, 2, 1, True).add_(eps)).sqrt_()
        beta = norm(g, 2, 1, True).mul_(inputs).add_(eps).div_(norm(psi, 2, 1, True).add_(eps)).sqrt_()
        h_tilde_new = torch.addcmul(propagated.mul_(gamma), beta * tau, psi)
        return h_new, h_tilde_new, gamma.reciprocal(), g * (tau / beta), None

    def commit(
        self, w_tilde: torch.Tensor, inverse_gamma: torch.Tensor, g: torch.Tensor, h: torch.Tensor, x: torch.Tensor
    ) -> None:
        """``w_tilde <- w_tilde / gamma + g a^T`` in place, with ``1 / gamma`` and ``g`` from :meth:`gir`.

        Large ``w_tilde`` on the CPU (``P >= ROW_UPDATE_MIN``, where the step is bound by memory): one ``addr_``
        per stream and block, ``beta = 1 / gamma``, rescales and adds in a single pass (equal to the two passes to
        rounding; ``1 / gamma`` is read on the host, which on the CPU waits for nothing), and each stream's new norm
        is taken right after its update, while its row is still in the caches, for the next step's ``gamma``
        (:meth:`_norm_of`) instead of in a pass of its own.
        """
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is w_tilde and not tracing():  # gir's choice, not a traced call's
            kernels = checked[1]
        else:
            kernels = self._kernels(h, x, w_tilde, inverse_gamma, g)
        if kernels is not None:  # rescale, add and take the norms in one C pass
            norms = commit(kernels, w_tilde, inverse_gamma, g, h, x)
            if not w_tilde.is_inference():  # inference tensors have no version counter to check the norms by
                self._norms = (w_tilde, w_tilde._version, norms)
            return
        if w_tilde.device.type == "cpu" and w_tilde.shape[1] >= ROW_UPDATE_MIN and not tracing():
            self._blocks_of(w_tilde, g, x)[3].mul_(inverse_gamma).add_(g)  # first: each row is final in its turn
            norm, norms, rows = torch.linalg.vector_norm, [], self._rows_of(w_tilde)
            for stream, scale in enumerate(inverse_gamma.view(-1).tolist()):
                row, block_hh, block_ih = rows[stream]
                block_hh.addr_(g[stream], h[stream], beta=scale)
                block_ih.addr_(g[stream], x[stream], beta=scale)
                norms.append(norm(row))
            if not w_tilde.is_inference():  # inference tensors have no version counter to check the norms by
                self._norms = (w_tilde, w_tilde._version, torch.stack(norms).unsqueeze_(1))
            return
        w_tilde.mul_(inverse_gamma)
        self._accumulate(w_tilde, g, h, x)

    def fixed(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        scaled: torch.Tensor,
        dual: torch.Tensor,
        alpha: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step with a fixed rescaling ``Q_t = alpha Q0``: ``(h', h_tilde', w_tilde')`` (new tensors) from
        ``scaled = Q0 u`` and ``dual = Q0^{-T} u`` ``(B, H)`` for ``u = tau nu``::

            h_tilde' = J h_tilde + alpha J^h_z Q0 u,        w_tilde' = w_tilde + (u^T Q0^{-1} J^z_theta) / alpha
        """
        h_new, slope, propagated = self._forward(x, h, h_tilde, self._constants_like(h)[0])
        psi, g = (scaled, dual * slope) if self.state_cut else (scaled * slope, dual)
        h_tilde_new = propagated.add_(psi, alpha=alpha)
        w_tilde_new = w_tilde.clone()
        self._accumulate(w_tilde_new, g * (1 / alpha), h, x)
        return h_new, h_tilde_new, w_tilde_new

    def _norm_of(self, w_tilde: torch.Tensor, kernels: tuple | None = None, inputs: int = 0) -> torch.Tensor:
        """``||w_tilde||`` per stream ``(B, 1)``: the norms :meth:`commit` took if ``w_tilde`` is the tensor it
        updated and has not changed since (same ``_version``), else a pass over it: with the C ``kernels``
        (``inputs`` the cell's input size), the pass sums as the C commit does, so a state loaded from a checkpoint
        (a new tensor) steps on exactly as the uninterrupted run."""
        cached = None if kernels is None and torch.compiler.is_compiling() else self._norms
        if cached is not None and cached[0] is w_tilde and cached[1] == w_tilde._version:
            return cached[2]
        if kernels is not None:
            return row_norms(kernels, w_tilde, self.cell.hidden_size, inputs)
        return torch.linalg.vector_norm(w_tilde, 2, 1, True)

    def _rows_of(self, out: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], ...]:
        """Per stream ``(row (P,), W_h block (H, H), W_x block (H, I))`` of ``out`` (views), kept while it is the
        same tensor (call :meth:`_blocks_of` first)."""
        rows = self._rows
        if rows is None or rows[0] is not out:
            _, block_hh, block_ih, _ = self._blocks
            rows = self._rows = (out, tuple(zip(out.unbind(0), block_hh.unbind(0), block_ih.unbind(0), strict=True)))
        return rows[1]

    def _blocks_of(self, out: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(out, W_h block (B, H, H), W_x block (B, H, I), b block (B, H))``: views of ``out`` ``(B, P)``, kept
        while ``out`` is the same tensor."""
        compiling = torch.compiler.is_compiling()
        blocks = None if compiling else self._blocks
        if blocks is None or blocks[0] is not out:
            batch, hidden = g.shape
            block_hh, block_ih, block_b = out.split_with_sizes((hidden * hidden, hidden * x.shape[1], hidden), 1)
            blocks = (out, block_hh.view(batch, hidden, hidden), block_ih.view(batch, hidden, -1), block_b)
            if not compiling:  # views of a traced tensor are not kept on the object
                self._blocks = blocks
        return blocks

    def _accumulate(self, out: torch.Tensor, g: torch.Tensor, h: torch.Tensor, x: torch.Tensor) -> None:
        """``out += g a^T`` per stream in place, ``a = [h; x; 1]`` laid out as ``[vec(W_h), vec(W_x), b]``."""
        blocks = self._blocks_of(out, g, x)
        column = g.unsqueeze(2)
        blocks[1].addcmul_(column, h.unsqueeze(1))
        blocks[2].addcmul_(column, x.unsqueeze(1))
        blocks[3].add_(g)


def _warn_native() -> None:
    warnings.warn(
        "TanhUOROStep.native is deprecated: use the package's one switch, lightning_ortho._native.native_kernels(False)"
        " (a function and a context manager), or LIGHTNING_ORTHO_NATIVE=0.",
        DeprecationWarning,
        stacklevel=3,
    )
