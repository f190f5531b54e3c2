"""Python binding of ``tanh_cell.c``: the tanh cell's step ``h' = tanh(W_h h + W_x x + b)`` in one C call, for
:class:`~lightning_ortho.online.TanhRNNCell`'s forward at small sizes outside autograd
(:class:`TanhCellForward`, one per cell)."""

from __future__ import annotations

import ctypes

import torch

from lightning_ortho._native import load, real_cpu
from lightning_ortho._native.fastcall import fastcall
from lightning_ortho._native.guard import real_cpu_tensor

__all__ = ["MAX_WORK", "TanhCellForward", "TanhParameters", "parameters_fit"]

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long
_SUFFIX = {torch.float32: "float32", torch.float64: "float64"}
#: Multiply-adds ``B H (H + I)`` up to which the C loop beats PyTorch's two GEMMs, add and tanh (each a dispatch of a
#: few microseconds); past it the GEMMs' blocking wins.
MAX_WORK = 1 << 16
#: Whether an autocast (of any device) is on: a third of the cost of ``torch.is_autocast_enabled("cpu")``, which
#: stands in where a version of torch lacks the private check.
_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: torch.is_autocast_enabled("cpu"))
#: Stands for "nothing checked yet" in :class:`TanhParameters` (no parameter, dtype or address is this object).
_UNCHECKED = object()
#: {(library, dtype): its declared C function}
_DECLARED: dict[tuple, ctypes._CFuncPtr] = {}


class _Setup(ctypes.Structure):
    """``tanh_cell_setup`` of ``tanh_cell.c``: the parameters' addresses and the cell's sizes."""

    _fields_ = (("w_hh", _POINTER), ("w_ih", _POINTER), ("bias", _POINTER), ("hidden", _LONG), ("inputs", _LONG))


def _kernel(library: ctypes.CDLL, dtype: torch.dtype):
    """``library``'s forward for ``dtype``, its signature declared once."""
    kernel = _DECLARED.get((library, dtype))
    if kernel is None:
        kernel = getattr(library, f"tanh_cell_forward_{_SUFFIX[dtype]}")
        kernel.argtypes = [_POINTER] * 3 + [_LONG, _POINTER]
        kernel.restype = None
        _DECLARED[library, dtype] = kernel
    return kernel


def parameters_fit(
    weight_hh: torch.Tensor | None,
    weight_ih: torch.Tensor | None,
    bias: torch.Tensor | None,
    hidden: int,
    inputs: int,
    dtype: torch.dtype,
) -> bool:
    """Whether a C kernel may read a tanh cell's parameters in a step of ``dtype``: all present, plain CPU tensors
    with nothing tracing (:func:`lightning_ortho._native.real_cpu`), of ``dtype``, C-contiguous, ``weight_hh``
    ``(hidden, hidden)``, ``weight_ih`` ``(hidden, inputs)``, ``bias`` ``(hidden,)``."""
    return (
        real_cpu(weight_hh, weight_ih, bias)  # (first: a parameter set to None passes it and fails below)
        and weight_hh is not None
        and weight_ih is not None
        and bias is not None
        and weight_hh.dtype is dtype
        and weight_ih.dtype is dtype
        and bias.dtype is dtype
        and weight_hh.shape == (hidden, hidden)
        and weight_ih.shape == (hidden, inputs)
        and bias.shape == (hidden,)
        and weight_hh.is_contiguous()
        and weight_ih.is_contiguous()
        and bias.is_contiguous()
    )


class TanhParameters:
    """The addresses of a plain :class:`~lightning_ortho.online.TanhRNNCell`'s ``weight_hh`` ``(H, H)``,
    ``weight_ih`` ``(H, I)`` and ``bias`` ``(H,)`` for a C kernel, checked at most once per change (the cell's
    one-call forward, the one-call steps of UORO, KF-RTRL, RFLO and SnAp-1).

    :meth:`addresses` answers where every parameter is a C-contiguous real CPU tensor of the cell's shape and of the
    step's dtype (:func:`lightning_ortho._native.real_cpu`) and the cell is still of its class at construction (a
    parametrisation registered since swaps the class). What passed is remembered: the same parameter objects (held
    here, so that their ids stay theirs) at the same addresses (``data_ptr()``: ``cell.to(...)``, ``cell.double()``
    or an assignment of ``.data`` gives them new memory), for a step of the dtype they were checked in, pass without
    the other checks. They are read from the cell at every call: an optimiser's update between steps is seen.

    Args:
        cell: the plain tanh cell (:func:`~lightning_ortho.online.uoro_fused.fusable_tanh_cell`: the caller checks it).
    """

    __slots__ = ("cell", "kind", "hidden", "inputs", "_checked")

    def __init__(self, cell: torch.nn.Module) -> None:
        self.cell, self.kind, self.hidden, self.inputs = cell, type(cell), cell.hidden_size, cell.input_size
        #: ``(weight_hh, weight_ih, bias, dtype, their data_ptr()s)`` as last checked
        self._checked: tuple = (_UNCHECKED,) * 5

    def __getstate__(self) -> dict:  # copy and pickle: the cell; nothing checked travels
        return {"cell": self.cell}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cell"])

    def addresses(self, dtype: torch.dtype) -> tuple[int, int, int] | None:
        """``(weight_hh, weight_ih, bias)``'s ``data_ptr()`` where the kernel may read them in a step of ``dtype``,
        else ``None``."""
        cell = self.cell
        if type(cell) is not self.kind:  # a parametrisation registered since: the weights are no longer these
            return None
        parameters = cell._parameters  # what nn.Module.__getattr__ looks up, without its fallbacks
        weight_hh, weight_ih, bias = parameters.get("weight_hh"), parameters.get("weight_ih"), parameters.get("bias")
        checked = self._checked
        if weight_hh is checked[0] and weight_ih is checked[1] and bias is checked[2] and dtype is checked[3]:
            addresses = (weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr())
            if addresses == checked[4]:
                return addresses
        if not parameters_fit(weight_hh, weight_ih, bias, self.hidden, self.inputs, dtype):
            return None
        addresses = (weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr())
        self._checked = (weight_hh, weight_ih, bias, dtype, addresses)
        return addresses


class TanhCellForward:
    """``tanh(h W_h^T + x W_x^T + b)`` ``(B, H)`` in one C call for one cell, or ``None`` where the kernel does not
    apply and the caller runs its PyTorch ops: parameters missing from the cell's ``_parameters`` (a
    parametrisation moved them), another dtype than float32/float64, shapes that do not fit (``x`` ``(B, I)``,
    ``h`` ``(B, H)``, ``W_h`` ``(H, H)``, ``W_x`` ``(H, I)``, ``b`` ``(H,)``: PyTorch's ops then raise their own
    errors), a tensor not C-contiguous or of another dtype than ``x``, more than :data:`MAX_WORK` multiply-adds,
    autocast, something tracing or a tensor that is not a plain CPU tensor (:func:`~lightning_ortho._native.real_cpu`),
    or the kernels off or unavailable (:func:`~lightning_ortho._native.load`). The caller checks that autograd is
    off. Agrees with the PyTorch expression to rounding (the dot products are summed in another order than BLAS's).

    A forward at one stream costs a few microseconds, as much as its checks, so the parameters' checks are
    remembered: they pass while the cell's parameters are the same objects at the same addresses (``data_ptr``) and
    the call's dtype is the one they were checked in (moving or converting them, ``cell.to(...)``, an assignment of
    ``.data``, gives them new memory). ``x`` is checked at every call, and so is ``h`` unless it is this object's
    output of the last call, still at its memory (a rollout feeds each output back). Copies and pickles start
    afresh.

    That common case (``h`` the last output, the parameters as checked) also exists in C with the CPython API
    (:mod:`lightning_ortho._native.fastcall`): :attr:`fast` ``(parameters, x, h) -> h' or None``, which the caller
    tries first, armed at every set-up of this object and told of its outputs; it makes the same checks of ``x``,
    the switch and tracing, and costs about a third of this method. ``None`` where the extension is unavailable.
    :attr:`call` ``(cell, args) -> h' or None`` is the cell's whole ``nn.Module.__call__`` in that case, where that
    call would only run ``forward`` (no hook of the cell's or global ones, not ``cell.compile()``-d, no ``forward``
    on the instance, autograd off): a cell's call then costs no Python frame.
    """

    __slots__ = (
        "_setup",
        "_address",
        "_key",
        "_kernel",
        "_library",
        "_rows_work",
        "_hidden",
        "_inputs",
        "_made",
        "_fast",
        "fast",
        "call",
    )

    def __init__(self) -> None:
        self._setup = _Setup()
        self._address = ctypes.addressof(self._setup)  # (self._setup keeps it alive)
        #: ``(weight_hh, weight_ih, bias, their data_ptr()s, dtype)`` written in the setup (the parameters held, so
        #: that ``is`` compares objects that are alive)
        self._key: tuple = (None,) * 7
        self._kernel = self._library = None
        self._rows_work = self._hidden = self._inputs = 0  # H (H + I): a stream's multiply-adds; H; I
        #: ``(h', h'.data_ptr(), B, dtype)`` of the last call
        self._made: tuple = (None, 0, 0, None)
        #: the common case in C (:mod:`lightning_ortho._native.fastcall`, armed at every set-up) and its call
        #: ``fast(parameters, x, h) -> h' or None``, which the caller tries first (``None``: no extension), and
        #: ``call(cell, args) -> h' or None``: the cell's ``nn.Module.__call__`` where it would only run forward
        self._fast = self.fast = self.call = None

    def __getstate__(self) -> dict:  # copy and pickle: nothing remembered travels
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __call__(self, parameters: dict, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """The step from the cell's ``_parameters`` (``weight_hh``, ``weight_ih``, ``bias``), ``x`` ``(B, I)`` and
        ``h`` ``(B, H)``: a new ``(B, H)`` tensor, or ``None`` (see the class docstring)."""
        library = load("tanh_cell")  # (honours native_kernels(False) at every call)
        if library is None or x.dim() != 2 or h.dim() != 2:
            return None
        weight_hh, weight_ih, bias = parameters.get("weight_hh"), parameters.get("weight_ih"), parameters.get("bias")
        dtype, key = x.dtype, self._key
        if not (
            weight_hh is key[0]
            and weight_ih is key[1]
            and bias is key[2]
            and dtype is key[6]
            and library is self._library
            and weight_hh.data_ptr() == key[3]
            and weight_ih.data_ptr() == key[4]
            and bias.data_ptr() == key[5]
        ) and not self._set_up(library, weight_hh, weight_ih, bias, dtype):
            return None
        batch, inputs = x.shape
        hidden, made = self._hidden, self._made
        if h is made[0] and batch == made[2] and dtype is made[3]:  # the last output: checked when made
            h_pointer = h.data_ptr()
            fits = h_pointer == made[1] and real_cpu_tensor(x)  # (still at its memory: no resize_, set_)
        else:
            fits = (
                h.shape == (batch, hidden)
                and h.dtype is dtype
                and h.is_contiguous()
                and batch * self._rows_work <= MAX_WORK
                and real_cpu(x, h)
            )
            h_pointer = h.data_ptr() if fits else 0
        if not fits or inputs != self._inputs or not x.is_contiguous() or _autocast():
            return None
        h_new = h.new_empty(batch, hidden)  # ints, not a torch.Size: a third of the cost
        h_new_pointer = h_new.data_ptr()
        self._kernel(self._address, x.data_ptr(), h_pointer, batch, h_new_pointer)
        self._made = (h_new, h_new_pointer, batch, dtype)
        if self._fast is not None:
            self._fast.made(h_new, batch)
        return h_new

    def _set_up(
        self,
        library: ctypes.CDLL,
        weight_hh: torch.Tensor | None,
        weight_ih: torch.Tensor | None,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> bool:
        """Check the parameters (present, of ``dtype`` (float32/float64), of the cell's shapes, contiguous, plain CPU
        tensors with nothing tracing) and write their addresses and the sizes into the setup; false (nothing
        written) when a check fails."""
        if weight_ih is None or weight_ih.dim() != 2 or dtype not in _SUFFIX:
            return False
        hidden, inputs = weight_ih.shape  # (the cell's sizes, as its parameters say)
        if not parameters_fit(weight_hh, weight_ih, bias, hidden, inputs, dtype):
            return False
        pointers = weight_hh.data_ptr(), weight_ih.data_ptr(), bias.data_ptr()
        setup = self._setup
        setup.w_hh, setup.w_ih, setup.bias = pointers
        setup.hidden, setup.inputs = hidden, inputs
        self._rows_work, self._hidden, self._inputs = hidden * (hidden + inputs), hidden, inputs
        self._kernel, self._library = _kernel(library, dtype), library
        self._key = (weight_hh, weight_ih, bias, *pointers, dtype)
        self._made = (None, 0, 0, None)  # an output of other sizes must be checked again
        self._arm_fast(weight_hh, weight_ih, bias, dtype, library, hidden, inputs)
        return True

    def _arm_fast(self, weight_hh, weight_ih, bias, dtype, library, hidden: int, inputs: int) -> None:
        """Arm the C object of the common case with what :meth:`_set_up` checked (made at the first set-up where
        the extension is available; it then answers only for outputs :meth:`__call__` tells it of)."""
        module = fastcall()
        if module is None or not isinstance(self._kernel, ctypes._CFuncPtr):
            self._fast = self.fast = self.call = None  # (no extension, or a kernel a caller wrapped)
            return
        if self._fast is None:
            self._fast = module.TanhForward()
            self.fast, self.call = self._fast.forward, self._fast.call
        kernel = ctypes.cast(self._kernel, ctypes.c_void_p).value
        self._fast.arm(
            weight_hh,
            weight_ih,
            bias,
            dtype,
            library,
            globals(),
            "tanh_cell",
            kernel,
            self._address,
            self._setup,
            hidden,
            inputs,
        )
