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
import struct

import torch

from lightning_ortho._native import load, real_cpu
from lightning_ortho._native.fastcall import fastcall
from lightning_ortho._native.guard import _compiling, real_cpu_tensor
from lightning_ortho._native.tanh_cell import parameters_fit

__all__ = ["FactoredTanhTrace", "factored_trace_kernels"]

_POINTER, _LONG, _DOUBLE = ctypes.c_void_p, ctypes.c_long, ctypes.c_double
_SUFFIXES = {torch.float32: "float32", torch.float64: "float64"}
#: ``{(library, dtype): (rflo_step, snap1_step, gradient)}``, declared once per library (``load.cache_clear()`` loads
#: a new one).
_DECLARED: dict[tuple, tuple] = {}
#: Whether an autocast (of any device) is on: a third of the cost of ``torch.is_autocast_enabled("cpu")``, which
#: stands in where a version of torch lacks the private check.
_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: torch.is_autocast_enabled("cpu"))
#: ``factored_step_arguments`` and ``factored_gradient_arguments`` of ``factored_traces.c`` (native sizes and
#: alignment): a call passes its own arguments packed in one buffer, one ctypes argument (ctypes converts each
#: argument in Python). The bytes are new at every call: no buffer is shared between threads.
_PACK = struct.Struct("@5Pl").pack


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
    (:func:`lightning_ortho._native.load`, which also honours ``native_kernels(False)``). Autocast does not matter
    here: the kernels read only these tensors, no product PyTorch computed (:class:`FactoredTanhTrace` declines
    under autocast for another reason: the PyTorch path it stands in for changes there).

    The functions take a pointer to a ``factored_setup`` (the parameters' addresses, ``H``, ``I``, RFLO's decay and
    rate; :class:`FactoredTanhTrace` keeps one), then their own arguments packed in one buffer (``_PACK``)::

        rflo_step(setup, (x, h, trace, h_new, trace_new, B)) -> the sum of x, h_new and trace_new
        snap1_step(setup, (x, h, influence, h_new, influence_new, B)) -> the sum of x, h_new and influence_new
        gradient(setup, (trace, grad_h, out_hh (H, H), out_ih (H, I), out_b (H,), B)) -> the sum of grad_h and the
            estimate
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
    for function in (rflo, snap, gradient):  # the setup's address, then the packed arguments (bytes, not copied)
        function.argtypes = [_POINTER, ctypes.c_char_p]
        function.restype = _DOUBLE
    return rflo, snap, gradient


class FactoredTanhTrace:
    """The fused step and summed estimate of a factored trace ``(B, H, n_a)`` on a plain tanh cell (RFLO's trace,
    SnAp-1's influence), for one estimator: one C call each, or ``None`` where the estimator must take its PyTorch
    path.

    The kernels run only on tensors that are all float32 or all float64, C-contiguous, of the cell's sizes at
    construction (``x`` ``(B, I)``, ``h`` and ``grad_h`` ``(B, H)``, the trace ``B H n_a`` entries, ``weight_hh``
    ``(H, H)``, ``weight_ih`` ``(H, I)``, ``bias`` ``(H,)``), plain CPU tensors with nothing tracing
    (:func:`lightning_ortho._native.real_cpu`), with the kernels on (:func:`lightning_ortho._native.load`) and no
    autocast (under which the PyTorch path computes in another dtype, or refuses to), on a cell still of its class
    at construction (a parametrisation registered since swaps the class). The parameters
    are read from the cell at every call (an optimiser's update, a ``cell.double()`` are seen).

    At one stream the checks of a call cost as much as its arithmetic, so what was checked is remembered. The state
    tensors this object made at its last step (``h'`` and the trace: fresh tensors, held here until the next step)
    pass while they are the very tensors passed in, at the same addresses. The parameters pass while they are the same objects (held here, so their ``id`` stays
    theirs), at the same addresses (``data_ptr``), for a step of the dtype they were checked in: moving or
    converting them (``cell.to(...)``, an assignment of ``.data``) gives them new memory. ``x`` and ``grad_h``,
    new at every call, are checked at every call.

    Args:
        cell: the :class:`~lightning_ortho.online.TanhRNNCell` (the caller checks it:
            :func:`~lightning_ortho.online.uoro_fused.fusable_tanh_cell`).
        flat: the trace is held as ``(B, H n_a)`` (SnAp's influence), else as ``(B, H, n_a)`` (RFLO's trace).
    """

    __slots__ = (
        "cell",
        "flat",
        "kind",
        "hidden",
        "inputs",
        "columns",
        "_setup",
        "_address",
        "_library",
        "_dtype",
        "_kernels",
        "_key",
        "_made",
        "_fast",
        "_fast_step",
        "_fast_gradient",
    )

    def __init__(self, cell: torch.nn.Module, *, flat: bool = False) -> None:
        self.cell, self.flat, self.kind = cell, flat, type(cell)
        self.hidden, self.inputs = cell.hidden_size, cell.input_size
        self.columns = self.hidden + self.inputs + 1  # n_a: a = [h; x; 1]
        self._setup = _Setup(hidden=self.hidden, inputs=self.inputs)
        self._address = ctypes.addressof(self._setup)  # (self._setup keeps it alive)
        #: the library, the dtype and the kernels of the last call (a dictionary lookup fewer per call)
        self._library = self._dtype = self._kernels = None
        #: ``(weight_hh, weight_ih, bias, their data_ptr()s, dtype, decay, rate)`` written in the setup (the
        #: parameters held, so that ``is`` compares objects that are alive)
        self._key: tuple = (None,) * 9
        #: ``(h', trace', h'.data_ptr(), trace'.data_ptr(), B, dtype)`` of the last fused step
        self._made: tuple = (None, None, 0, 0, 0, None)
        #: the common case in C (:mod:`lightning_ortho._native.fastcall`, armed at every set-up) and its two calls,
        #: tried first by :meth:`step` and :meth:`gradient` (``None``: no extension)
        self._fast = self._fast_step = self._fast_gradient = None

    def __getstate__(self) -> dict:  # copy and pickle: the cell and the layout; nothing remembered travels
        return {"cell": self.cell, "flat": self.flat}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cell"], flat=state["flat"])

    def _kernels_for(self, like: torch.Tensor) -> tuple | None:
        """:func:`factored_trace_kernels` of ``like`` alone, with the last library's lookup remembered; ``None``
        also under autocast, where the PyTorch path computes (or refuses) another dtype's step and estimate. (Called
        by :meth:`step` and :meth:`gradient` where ``like`` is of another dtype, or the library another, than at the
        last call; they check the common case themselves, written out: one frame fewer at every call.)"""
        if not real_cpu_tensor(like):  # first: also a tensor at all, and false when compiling
            return None
        dtype = like.dtype
        if dtype not in _SUFFIXES or _autocast():
            return None
        library = load("factored_traces")
        if library is not self._library or dtype is not self._dtype:
            if library is None:
                return None
            kernels = factored_trace_kernels(like)
            if kernels is None:
                return None
            self._library, self._dtype, self._kernels = library, dtype, kernels
        return self._kernels

    def step(
        self, x: torch.Tensor, h: torch.Tensor, trace: torch.Tensor, snap: bool, decay: float = 0.0, rate: float = 0.0
    ) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """One step: ``(h', trace', the sum of x, h' and trace')`` (new tensors; ``h`` and ``trace`` are read
        only), or ``None`` where the PyTorch path must run. With ``h' = tanh(W_h h + W_x x + b)``, ``d = 1 - h'^2``
        and ``a = [h; x; 1]``, per stream: RFLO's ``E' = decay E + (rate d) a^T``, or with ``snap`` SnAp-1's
        ``m'[i, j] = d_i (W_h[i, i] m[i, j] + a_j)``. The sum is NaN/inf when an input or an output holds NaN/inf
        (or the sum of finite entries overflows)."""
        fast = self._fast_step  # the common case in C: the state made here, nothing else changed
        if fast is not None and not _compiling():  # (a tracer cannot call into C: it runs the checks below)
            done = fast(self.cell, x, h, trace, snap, decay, rate)
            if done is not None:
                return done
        if (  # _kernels_for where x is of the last call's dtype and the library the same, written out
            real_cpu_tensor(x)  # first: also a tensor at all, and false when compiling
            and x.dtype is self._dtype
            and not _autocast()
            and load("factored_traces") is self._library
        ):
            kernels = self._kernels
        else:
            kernels = self._kernels_for(x)
        if kernels is None or x.dim() != 2 or not x.is_contiguous():
            return None
        batch, inputs = x.shape
        hidden, dtype = self.hidden, x.dtype
        made = self._made
        if h is made[0] and trace is made[1] and batch == made[4] and dtype is made[5]:  # made here: checked then
            h_pointer, trace_pointer = h.data_ptr(), trace.data_ptr()
            fits = h_pointer == made[2] and trace_pointer == made[3]  # still at their memory (no resize_, set_)
        else:
            fits = (
                h.dtype is dtype
                and trace.dtype is dtype
                and h.shape == (batch, hidden)
                and trace.numel() == batch * hidden * self.columns
                and h.is_contiguous()
                and trace.is_contiguous()
                and real_cpu(h, trace)
            )
            if fits:
                h_pointer, trace_pointer = h.data_ptr(), trace.data_ptr()
        if not fits or inputs != self.inputs:
            return None
        cell = self.cell
        if type(cell) is not self.kind:  # a parametrisation registered since: the weights are no longer these
            return None
        parameters = cell._parameters  # what nn.Module.__getattr__ looks up, without its fallbacks
        weight_hh, weight_ih, bias = parameters.get("weight_hh"), parameters.get("weight_ih"), parameters.get("bias")
        key = self._key  # compared entry by entry: no tuple built at every step
        if not (
            weight_hh is key[0]
            and weight_ih is key[1]
            and bias is key[2]
            and dtype is key[6]
            and decay == key[7]
            and rate == key[8]
            and weight_hh.data_ptr() == key[3]
            and weight_ih.data_ptr() == key[4]
            and bias.data_ptr() == key[5]
        ) and not self._set_up(weight_hh, weight_ih, bias, dtype, decay, rate):
            return None
        h_new = x.new_empty(batch, hidden)  # ints, not a torch.Size: a third of the cost; on x's device
        trace_new = x.new_empty(batch, hidden * self.columns) if self.flat else x.new_empty(batch, hidden, self.columns)
        h_new_pointer, trace_new_pointer = h_new.data_ptr(), trace_new.data_ptr()
        total = kernels[snap](
            self._address, _PACK(x.data_ptr(), h_pointer, trace_pointer, h_new_pointer, trace_new_pointer, batch)
        )
        self._made = (h_new, trace_new, h_new_pointer, trace_new_pointer, batch, dtype)
        if self._fast is not None:
            self._fast.made(h_new, trace_new, batch)
        return h_new, trace_new, total

    def _set_up(
        self,
        weight_hh: torch.Tensor,
        weight_ih: torch.Tensor,
        bias: torch.Tensor,
        dtype: torch.dtype,
        decay: float,
        rate: float,
    ) -> bool:
        """Check the parameters (``dtype``, the cell's shapes, contiguous, real CPU tensors) and write their
        addresses, ``decay`` and ``rate`` into the setup the kernels read; false (nothing written) when a check
        fails."""
        if not parameters_fit(weight_hh, weight_ih, bias, self.hidden, self.inputs, dtype):
            return False
        pointers = weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr()
        setup = self._setup
        setup.w_hh, setup.w_ih, setup.bias = pointers
        setup.decay, setup.rate = decay, rate
        self._key = (weight_hh, weight_ih, bias, *pointers, dtype, decay, rate)
        self._arm_fast(weight_hh, weight_ih, bias, dtype, decay, rate)
        return True

    def _arm_fast(self, weight_hh, weight_ih, bias, dtype: torch.dtype, decay: float, rate: float) -> None:
        """Arm the C object of the common case with what :meth:`_set_up` checked and the kernels of the step that
        called it (made at the first set-up where the extension is available; it then answers only for states
        :meth:`step` tells it of)."""
        module = fastcall()
        if module is None or not all(isinstance(k, ctypes._CFuncPtr) for k in self._kernels or ()):
            self._fast = self._fast_step = self._fast_gradient = None  # (no extension, or kernels a caller wrapped)
            return
        if self._fast is None:
            self._fast = module.FactoredTrace()
            self._fast_step, self._fast_gradient = self._fast.step, self._fast.gradient
        rflo, snap, gradient = (ctypes.cast(k, ctypes.c_void_p).value for k in self._kernels)
        self._fast.arm(
            weight_hh,
            weight_ih,
            bias,
            self.kind,
            dtype,
            self._library,
            globals(),
            "factored_traces",
            rflo,
            snap,
            gradient,
            self._address,
            self._setup,
            decay,
            rate,
            self.hidden,
            self.inputs,
            self.flat,
        )

    def gradient(
        self, h: torch.Tensor, trace: torch.Tensor, grad_h: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], float] | None:
        """``({"weight_hh": (H, H), "weight_ih": (H, I), "bias": (H,)}, the sum of grad_h and of them)``, the
        estimate ``sum_b diag(grad_h_b) E_b`` by parameter, or ``None`` where the PyTorch path must run: also where ``grad_h`` is not ``(B, H)`` of the dtype of
        the state ``h`` (whose shape it must have) and the trace. The sum is NaN/inf when the estimate or
        ``grad_h`` is not finite (or the sum of finite entries overflows)."""
        fast = self._fast_gradient  # the common case in C: the state made here
        if fast is not None and not _compiling():  # (a tracer cannot call into C: it runs the checks below)
            done = fast(h, trace, grad_h)
            if done is not None:
                return done
        if (  # _kernels_for where grad_h is of the last call's dtype and the library the same, written out
            real_cpu_tensor(grad_h)  # first: also a tensor at all, and false when compiling
            and grad_h.dtype is self._dtype
            and not _autocast()
            and load("factored_traces") is self._library
        ):
            kernels = self._kernels
        else:
            kernels = self._kernels_for(grad_h)
        if kernels is None or grad_h.dim() != 2 or not grad_h.is_contiguous():
            return None
        batch, hidden = grad_h.shape
        dtype, made = grad_h.dtype, self._made
        if h is made[0] and trace is made[1] and batch == made[4] and dtype is made[5]:  # made here: checked then
            trace_pointer = trace.data_ptr()
            fits = trace_pointer == made[3]  # still at its memory (no resize_, set_)
        else:
            fits = (
                trace.dtype is dtype
                and h.dtype is dtype
                and h.shape == grad_h.shape
                and trace.numel() == batch * hidden * self.columns
                and trace.is_contiguous()
                and real_cpu(trace)
            )
            trace_pointer = trace.data_ptr() if fits else 0
        if not fits or hidden != self.hidden:
            return None
        # One allocation per parameter: cheaper than three views of one (P,) tensor.
        out_hh, out_ih, out_b = (
            grad_h.new_empty(hidden, hidden),
            grad_h.new_empty(hidden, self.inputs),
            grad_h.new_empty(hidden),
        )
        total = kernels[2](
            self._address,
            _PACK(trace_pointer, grad_h.data_ptr(), out_hh.data_ptr(), out_ih.data_ptr(), out_b.data_ptr(), batch),
        )
        return {"weight_hh": out_hh, "weight_ih": out_ih, "bias": out_b}, total
