"""Python bindings of ``factored_traces.c``, for float32/float64 CPU tensors: the whole step of RFLO's and of
SnAp-1's factored trace on the tanh cell (the cell's step and the trace's update) in one call each, and their
summed estimate ``sum_b diag(g_b) E_b`` in the parameters' flat layout in one more
(:class:`lightning_ortho.online.RFLO` and :class:`lightning_ortho.online.SnAp` compute the same with PyTorch ops
elsewhere).

A trace here is ``(B, H, n_a)`` with ``n_a = H + I + 1`` (SnAp's ``(B, K)`` influence with ``K = H n_a`` has that
memory: its kept entries, row-major, are the rows ``[W_h[i, :], W_x[i, :], b_i]`` of every unit ``i``).
"""

from __future__ import annotations

import ctypes

import torch

from lightning_ortho._native import load, real_cpu

__all__ = ["FactoredTanhTrace", "factored_trace_kernels"]

_POINTER, _LONG, _DOUBLE = ctypes.c_void_p, ctypes.c_long, ctypes.c_double
_SUFFIXES = {torch.float32: "float32", torch.float64: "float64"}
#: ``{(library, dtype): (rflo_step, snap1_step, gradient)}``, declared once per library (``load.cache_clear()`` loads
#: a new one).
_DECLARED: dict[tuple, tuple] = {}


class _Setup(ctypes.Structure):
    """``factored_setup`` of ``factored_traces.c``: what a step reads besides the state and ``x``."""

    _fields_ = (
        ("w_hh", _POINTER),
        ("w_ih", _POINTER),
        ("bias", _POINTER),
        ("hidden", _LONG),
        ("inputs", _LONG),
        ("decay", _DOUBLE),
        ("rate", _DOUBLE),
    )


def factored_trace_kernels(like: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """``(rflo_step, snap1_step, gradient)`` C functions for ``like``'s dtype, or ``None`` when ``like`` is not
    float32/float64, when ``like`` or one of ``others`` (pass every tensor the kernel will read) is not a real CPU
    tensor or something is tracing (:func:`lightning_ortho._native.real_cpu`), or when the kernels are unavailable
    (:func:`lightning_ortho._native.load`, which also honours ``native_kernels(False)``). CPU autocast does not
    matter: the kernels read only these tensors, no product PyTorch computed.

    The functions take a pointer to a ``factored_setup`` (the parameters' addresses, ``H``, ``I``, RFLO's decay and
    rate; :class:`FactoredTanhTrace` keeps one), then::

        rflo_step(setup, x, h, trace, B, h_new, trace_new) -> the sum of x, h_new and trace_new
        snap1_step(setup, x, h, influence, B, h_new, influence_new) -> the sum of x, h_new and influence_new
        gradient(setup, trace, grad_h, B, out (P,)) -> the sum of grad_h and out
    """
    dtype = like.dtype
    if dtype not in _SUFFIXES or not real_cpu(like, *others):
        return None
    library = load("factored_traces")
    if library is None:
        return None
    kernels = _DECLARED.get((library, dtype))
    if kernels is None:
        kernels = _DECLARED[library, dtype] = _declare(library, dtype)
    return kernels


def _declare(library: ctypes.CDLL, dtype: torch.dtype) -> tuple:
    """Declare the C signatures of ``dtype``'s functions; returns ``(rflo_step, snap1_step, gradient)``."""
    suffix = _SUFFIXES[dtype]
    rflo = getattr(library, f"rflo_tanh_step_{suffix}")
    snap = getattr(library, f"snap1_tanh_step_{suffix}")
    gradient = getattr(library, f"factored_gradient_{suffix}")
    for step in (rflo, snap):
        step.argtypes = [_POINTER] * 4 + [_LONG] + [_POINTER] * 2
    gradient.argtypes = [_POINTER] * 3 + [_LONG, _POINTER]
    for function in (rflo, snap, gradient):
        function.restype = _DOUBLE
    return rflo, snap, gradient


class FactoredTanhTrace:
    """The fused step and summed estimate of a factored trace ``(B, H, n_a)`` on a plain tanh cell (RFLO's trace,
    SnAp-1's influence), for one estimator: one C call each, or ``None`` where the estimator must take its PyTorch
    path.

    The kernels run only on tensors that are all float32 or all float64, C-contiguous, of the cell's sizes at
    construction (``x`` ``(B, I)``, ``h`` and ``grad_h`` ``(B, H)``, the trace ``B H n_a`` entries, ``weight_hh``
    ``(H, H)``, ``weight_ih`` ``(H, I)``, ``bias`` ``(H,)``), plain CPU tensors with nothing tracing
    (:func:`factored_trace_kernels`), on a cell still of its class at construction (a parametrisation registered
    since swaps the class). The parameters are read from the cell at every call (an optimiser's update, a
    ``cell.double()`` are seen).

    A step at one stream costs a few microseconds of checks, as much as its arithmetic, so what was checked is
    remembered. The state tensors this object made at its last step (``h'`` and the trace: fresh tensors) pass
    while they are the very tensors passed in. The parameters pass while they are the same objects, at the same
    addresses (``data_ptr``) and of the step's dtype: moving or converting them (``cell.to(...)``, an assignment
    of ``.data``) gives them new memory. ``x`` and ``grad_h``, new at every call, are checked at every call.

    Args:
        cell: the :class:`~lightning_ortho.online.TanhRNNCell` (the caller checks it:
            :func:`~lightning_ortho.online.uoro_fused.fusable_tanh_cell`).
        flat: the trace is held as ``(B, H n_a)`` (SnAp's influence), else as ``(B, H, n_a)`` (RFLO's trace).
    """

    __slots__ = ("cell", "flat", "kind", "hidden", "inputs", "columns", "_setup", "_address", "_parameters", "_made")

    def __init__(self, cell: torch.nn.Module, *, flat: bool = False) -> None:
        self.cell, self.flat, self.kind = cell, flat, type(cell)
        self.hidden, self.inputs = cell.hidden_size, cell.input_size
        self.columns = self.hidden + self.inputs + 1  # n_a: a = [h; x; 1]
        self._setup = _Setup(hidden=self.hidden, inputs=self.inputs)
        self._address = ctypes.addressof(self._setup)  # (self._setup keeps it alive)
        #: ``(weight_hh, weight_ih, bias, their data_ptr()s, dtype, decay, rate)`` in the setup, else ``None``
        self._parameters: tuple | None = None
        #: ``(h', trace', h'.data_ptr(), trace'.data_ptr(), B)`` of the last fused step, else ``None``
        self._made: tuple | None = None

    def __getstate__(self) -> dict:  # copy and pickle: the cell and the layout; nothing remembered travels
        return {"cell": self.cell, "flat": self.flat}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cell"], flat=state["flat"])

    def step(
        self, x: torch.Tensor, h: torch.Tensor, trace: torch.Tensor, snap: bool, decay: float = 0.0, rate: float = 0.0
    ) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """One step: ``(h', trace', the sum of x, h' and trace')`` (new tensors; ``h`` and ``trace`` are read
        only), or ``None`` where the PyTorch path must run. With ``h' = tanh(W_h h + W_x x + b)``, ``d = 1 - h'^2``
        and ``a = [h; x; 1]``, per stream: RFLO's ``E' = decay E + (rate d) a^T``, or with ``snap`` SnAp-1's
        ``m'[i, j] = d_i (W_h[i, i] m[i, j] + a_j)``. The sum is NaN/inf when an input or an output holds NaN/inf
        (or the sum of finite entries overflows)."""
        kernels = factored_trace_kernels(x)  # x's dtype, x a real CPU tensor, nothing tracing, the kernels on
        if kernels is None or not x.is_contiguous():
            return None
        batch, inputs = x.shape
        hidden = self.hidden
        if inputs != self.inputs:
            return None
        dtype = x.dtype
        made = self._made
        if made is not None and h is made[0] and trace is made[1] and batch == made[4]:  # this object's outputs
            h_pointer, trace_pointer = made[2], made[3]
        elif (
            h.dtype is dtype
            and trace.dtype is dtype
            and h.shape == (batch, hidden)
            and trace.numel() == batch * hidden * self.columns
            and h.is_contiguous()
            and trace.is_contiguous()
            and real_cpu(h, trace)
        ):
            h_pointer, trace_pointer = h.data_ptr(), trace.data_ptr()
        else:
            return None
        cell = self.cell
        if type(cell) is not self.kind:  # a parametrisation registered since: the weights are no longer these
            return None
        parameters = cell._parameters  # what nn.Module.__getattr__ looks up, without its fallbacks
        weight_hh, weight_ih, bias = parameters["weight_hh"], parameters["weight_ih"], parameters["bias"]
        pointers = weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr()
        known = self._parameters
        if (
            known is None
            or weight_hh is not known[0]
            or weight_ih is not known[1]
            or bias is not known[2]
            or pointers != known[3]
            or dtype is not known[4]
            or decay is not known[5]
            or rate is not known[6]
        ) and not self._set_up(weight_hh, weight_ih, bias, pointers, dtype, decay, rate):
            return None
        h_new = x.new_empty(batch, hidden)  # ints, not a torch.Size: a third of the cost; on x's device
        trace_new = x.new_empty(batch, hidden * self.columns) if self.flat else x.new_empty(batch, hidden, self.columns)
        h_new_pointer, trace_new_pointer = h_new.data_ptr(), trace_new.data_ptr()
        total = kernels[1 if snap else 0](
            self._address, x.data_ptr(), h_pointer, trace_pointer, batch, h_new_pointer, trace_new_pointer
        )
        self._made = (h_new, trace_new, h_new_pointer, trace_new_pointer, batch)
        return h_new, trace_new, total

    def _set_up(
        self,
        weight_hh: torch.Tensor,
        weight_ih: torch.Tensor,
        bias: torch.Tensor,
        pointers: tuple[int, int, int],
        dtype: torch.dtype,
        decay: float,
        rate: float,
    ) -> bool:
        """Check the parameters (dtype, shape, contiguity, real CPU tensors) and write them, ``decay`` and ``rate``
        into the setup the kernels read; false (nothing written) when a check fails."""
        hidden = self.hidden
        if not (
            weight_hh.dtype is dtype
            and weight_ih.dtype is dtype
            and bias.dtype is dtype
            and weight_hh.shape == (hidden, hidden)
            and weight_ih.shape == (hidden, self.inputs)
            and bias.shape == (hidden,)
            and weight_hh.is_contiguous()
            and weight_ih.is_contiguous()
            and bias.is_contiguous()
            and real_cpu(weight_hh, weight_ih, bias)
        ):
            return False
        setup = self._setup
        setup.w_hh, setup.w_ih, setup.bias = pointers
        setup.decay, setup.rate = decay, rate
        self._parameters = (weight_hh, weight_ih, bias, pointers, dtype, decay, rate)
        return True

    def gradient(self, trace: torch.Tensor, grad_h: torch.Tensor) -> tuple[torch.Tensor, float] | None:
        """``(sum_b diag(grad_h_b) E_b (P,), the sum of grad_h and of it)`` laid out as ``[vec(W_h), vec(W_x),
        b]``, or ``None`` where the PyTorch path must run. The sum is NaN/inf when the estimate or ``grad_h`` is not
        finite (or the sum of finite entries overflows)."""
        kernels = factored_trace_kernels(grad_h)
        if kernels is None or not grad_h.is_contiguous():
            return None
        batch, hidden = grad_h.shape
        made = self._made
        if made is not None and trace is made[1] and batch == made[4]:
            trace_pointer = made[3]
        elif (
            trace.dtype is grad_h.dtype
            and trace.numel() == batch * hidden * self.columns
            and trace.is_contiguous()
            and real_cpu(trace)
        ):
            trace_pointer = trace.data_ptr()
        else:
            return None
        if hidden != self.hidden:
            return None
        out = grad_h.new_empty(hidden * self.columns)
        total = kernels[2](self._address, trace_pointer, grad_h.data_ptr(), batch, out.data_ptr())
        return out, total
