"""Python bindings of ``lru.c``: one step of the linear recurrent unit with all its exact RTRL traces, and their
summed estimate by parameter, each in one C call, for float32/float64 parameters (complex64/complex128 states) on the
CPU (:class:`lightning_ortho.online.lru.LRUTraces` computes the same with PyTorch ops elsewhere).

:class:`FusedLRU` checks what it is given and answers ``None`` (the caller then runs its PyTorch ops) unless every
tensor the kernel touches is C-contiguous, of the one real dtype or its complex counterpart, of the shapes the kernel
assumes, without the lazy conjugation bit (whose memory holds ``conj(z)``) and a real CPU tensor outside any tracing
(:func:`lightning_ortho._native.real_cpu`, which also refuses the lazy negation bit), and the library loads
(:func:`lightning_ortho._native.load`). The kernel reads the tensors it is given and nothing PyTorch computed for it,
so CPU autocast does not matter.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lightning_ortho._native import load, real_cpu

__all__ = ["FusedLRU", "lru_kernels"]

#: The kernels take their arguments as two arrays of 64-bit integers (see ``lru.c``): ``setup`` (the parameters'
#: addresses, ``H``, ``I``, the cache's address; one per :class:`FusedLRU`, written when the parameters change) and
#: the call's own addresses and batch. ctypes converts each argument of a call in Python (about 0.15 us apiece); an
#: entry written into an array costs a fifth of that.
_SETUP, _STEP_ARGS, _GRADIENT_ARGS = ctypes.c_int64 * 8, ctypes.c_int64 * 8, ctypes.c_int64 * 12
_DOUBLE = ctypes.c_double
#: The real dtype of the parameters -> (the kernels' name suffix, the complex dtype of the state and traces).
_TYPES = {torch.float32: ("float32", torch.complex64), torch.float64: ("float64", torch.complex128)}
#: The complex dtype of the state -> the real dtype of the parameters.
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
#: dtype -> (the library, its declared (step, gradient)): the functions of the library that load returns now.
_DECLARED: dict[torch.dtype, tuple] = {}
#: Per thread, the call's argument arrays: another thread could refill a shared array between this thread's filling
#: it and the kernel's reading it.
_ARGUMENTS = threading.local()
#: An empty CPU tensor of each real dtype, whose ``new_empty`` makes the estimate (on the CPU whatever the default
#: device; the cheapest allocation of a tensor of another dtype than the operands' at hand).
_EXEMPLARS = {dtype: torch.empty(0, dtype=dtype, device="cpu") for dtype in _TYPES}
#: ``torch.empty_like``, looked up once (the step's outputs: a tenth cheaper than ``new_empty`` with their sizes)
_empty_like = torch.empty_like


def lru_kernels(like: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """``(step, gradient)``, the C functions for ``like``'s dtype (float32 or float64 parameters and inputs,
    complex64 or complex128 states: either kind of ``like`` names the pair), or ``None`` when ``like`` is of another
    dtype, when ``like`` or one of ``others`` (pass every tensor the kernel will touch) is not a real CPU tensor or
    something is tracing (:func:`lightning_ortho._native.real_cpu`, asked first: under ``torch.compile`` nothing
    else is read), or when the kernels are unavailable or turned off (:func:`lightning_ortho._native.load`).
    Dtypes of ``others``, shapes, strides and conjugation bits are the caller's to check.

    The functions take two arrays of 64-bit integers (``lru.c``)::

        step(setup, [x, h, e_units, e_b, h_new, e_units_new, e_b_new, B]) -> the sum of x and of the outputs
        gradient(setup, [grad_h, e_units, e_b, out_nu, out_theta, out_gamma, out_b_re, out_b_im, out_c_re,
                         out_c_im, out_d, B]) -> the sum of grad_h and of the recurrent outputs

    with ``setup = [nu_log, theta_log, gamma_log, B_re, B_im, H, I, cache]`` (addresses, sizes, and the address of
    the step's cache or 0: ``struct lru_cache`` of ``lru.c``, ``8 + 10 H * 8`` zeroed bytes; the gradient reads
    only the sizes)."""
    if not real_cpu(like, *others):
        return None
    dtype = _REAL.get(like.dtype, like.dtype)
    if dtype not in _TYPES:
        return None
    library = load("lru")
    if library is None:
        return None
    return _declared(library, dtype)


def _declared(library: ctypes.CDLL, dtype: torch.dtype) -> tuple:
    """``(step, gradient)`` of ``library`` for ``dtype`` (a key of ``_TYPES``), their signatures declared once per
    library (``load.cache_clear()`` loads a new one)."""
    known = _DECLARED.get(dtype)
    if known is not None and known[0] is library:
        return known[1]
    suffix = _TYPES[dtype][0]
    step, gradient = getattr(library, f"lru_step_{suffix}"), getattr(library, f"lru_gradient_{suffix}")
    step.argtypes, gradient.argtypes = [_SETUP, _STEP_ARGS], [_SETUP, _GRADIENT_ARGS]
    step.restype = gradient.restype = _DOUBLE
    _DECLARED[dtype] = (library, (step, gradient))
    return step, gradient


def _new_arguments() -> tuple[ctypes.Array, ctypes.Array]:
    """This thread's argument arrays ``(step, gradient)``, made at its first call."""
    _ARGUMENTS.step, _ARGUMENTS.gradient = arrays = (_STEP_ARGS(), _GRADIENT_ARGS())
    return arrays


class FusedLRU:
    """The fused step and summed estimate of :class:`~lightning_ortho.online.DiagonalRTRL` on a plain
    :class:`~lightning_ortho.online.LinearRecurrentUnit`: one C call each, or ``None`` where the estimator must take
    its PyTorch path (:class:`~lightning_ortho.online.lru.LRUTraces`).

    With ``lambda = exp(-exp(nu_log) + i exp(theta_log))``, ``mu = exp(nu_log)``, ``phi = exp(theta_log)``,
    ``gamma = exp(gamma_log)`` and ``u = (B_re + i B_im) x``, per stream::

        h' = lambda h + gamma u,   e_units' = lambda e_units + [-mu lambda h, i phi lambda h, gamma u],
        e_B' = lambda e_B + gamma x^T

    and the estimate ``Re(conj(g) e)`` (``-Im(conj(g) e_B)`` for ``B_im``, zeros for ``C_re``, ``C_im``, ``D``)
    summed over the streams.

    The kernels run only on tensors that are all float32 (complex64) or all float64 (complex128), C-contiguous, of
    the cell's sizes at construction (``x`` ``(B, I)`` real, ``h`` and ``grad_h`` ``(B, H)``, ``e_units``
    ``(B, 3, H)``, ``e_B`` ``(B, H, I)`` complex with ``B >= 1``, ``nu_log``, ``theta_log``, ``gamma_log`` ``(H,)``,
    ``B_re``, ``B_im`` ``(H, I)`` real), without the conjugation bit, plain CPU tensors with nothing tracing
    (:func:`lightning_ortho._native.real_cpu`, which also refuses the negation bit), with the kernels on
    (:func:`lightning_ortho._native.load`), on a cell still of its class at construction (a parametrisation
    registered since swaps the class and renames the parameter). The parameters are read from the cell at every
    call (an optimiser's update, a replaced parameter, a ``cell.double()`` are seen).

    At one stream the checks of a call cost as much as its arithmetic, so what was checked is remembered. The state
    tensors this object made at its last step (``h'``, ``e_units'``, ``e_B'``: fresh tensors, held here until the
    next step) pass while they are the very tensors passed in, at the same addresses, for a call of the same batch
    and dtype. The parameters pass while they are the same objects (held here, so their ``id`` stays theirs), at the
    same addresses (``data_ptr``), for a step of the dtype they were checked in: moving or converting them
    (``cell.to(...)``, an assignment of ``.data``) gives them new memory. ``x`` and ``grad_h``, new at every call,
    are checked at every call. What the step derives from ``nu_log``, ``theta_log`` and ``gamma_log`` (``lambda``,
    ``gamma``, the slopes of ``lambda``) the kernel keeps in a cache of this object's, beside a copy of the three
    parameters, and reuses while they hold the same bits (``lru.c``).

    Args:
        cell: the :class:`~lightning_ortho.online.LinearRecurrentUnit` whose closed-form traces are
            :class:`~lightning_ortho.online.lru.LRUTraces` (the caller checks it).
        advance: what :meth:`step` makes of its result: ``advance(h', {"e_units": e_units', "e_B": e_B'}, None,
            verdict)`` (the estimator's :class:`~lightning_ortho.online.estimator.Advance`, which this module cannot
            import: the estimators import it).
    """

    __slots__ = (
        "cell",
        "kind",
        "hidden",
        "inputs",
        "advance",
        "_cache",
        "_setup",
        "_library",
        "_dtype",
        "_kernels",
        "_key",
        "_made",
    )

    def __init__(self, cell: nn.Module, advance: Callable[..., Any]) -> None:
        self.cell, self.kind, self.advance = cell, type(cell), advance
        self.hidden, self.inputs = cell.hidden_size, cell.input_size
        #: the step's cache of what it derives from nu_log, theta_log, gamma_log (``struct lru_cache`` of ``lru.c``:
        #: an 8-byte head and 10 H scalars, zeroed; the kernel checks the parameters' bits against its copy of them)
        self._cache = (ctypes.c_double * (1 + 10 * self.hidden))()
        self._setup = _SETUP(0, 0, 0, 0, 0, self.hidden, self.inputs, ctypes.addressof(self._cache))
        #: the library, the real dtype and the kernels of the last call (a dictionary lookup fewer per call)
        self._library = self._dtype = self._kernels = None
        #: ``(nu_log, theta_log, gamma_log, B_re, B_im, their data_ptr()s, dtype)`` written in the setup (the
        #: parameters themselves are held: their ids stay theirs)
        self._key: tuple = (None,) * 11
        #: ``(h', e_units', e_B', their data_ptr()s, B, real dtype)`` of the last fused step
        self._made: tuple = (None, None, None, 0, 0, 0, 0, None)

    def __getstate__(self) -> dict:  # copy and pickle: the cell; nothing remembered travels (nor ctypes arrays)
        return {"cell": self.cell, "advance": self.advance}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cell"], state["advance"])

    def _kernels_for(self, dtype: torch.dtype) -> tuple | None:
        """``(step, gradient)`` for the real ``dtype``, or ``None`` when ``dtype`` is not float32/float64 or the
        kernels are off or unavailable (:func:`lightning_ortho._native.load`, asked at every call), with the last
        library's lookup remembered. The caller has asked :func:`~lightning_ortho._native.real_cpu`."""
        library = load("lru")
        if library is not self._library or dtype is not self._dtype:
            if library is None or dtype not in _TYPES:
                return None
            self._library, self._dtype, self._kernels = library, dtype, _declared(library, dtype)
        return self._kernels

    def step(self, x: torch.Tensor, h: torch.Tensor, tensors: dict[str, torch.Tensor]) -> Any:
        """One step from ``h`` and its traces ``tensors`` (``{"e_units": (B, 3, H), "e_B": (B, H, I)}``):
        ``advance(h', {"e_units": e_units', "e_B": e_B'}, None, verdict)`` (new tensors; the ones given are read
        only), or ``None`` where the PyTorch path must run (see the class docstring; also where ``x`` is not a
        ``(B, I)`` float32/float64 tensor with ``h``'s ``B`` and the real dtype of ``h``). ``verdict`` is the sum of
        ``x`` and of the real views of the three outputs, in double: NaN/inf when one of them holds NaN/inf (or,
        rarely, when finite entries sum past the range). Raises nothing."""
        if x is None or not real_cpu(x):  # (real_cpu first: false for a non-tensor and when compiling)
            return None
        dtype = x.dtype
        kernels = self._kernels_for(dtype)
        if kernels is None or x.dim() != 2 or not x.is_contiguous():
            return None
        batch, inputs = x.shape
        e_units, e_b = tensors.get("e_units"), tensors.get("e_B")
        made = self._made
        if h is made[0] and e_units is made[1] and e_b is made[2] and batch == made[6] and dtype is made[7]:
            pointers = h.data_ptr(), e_units.data_ptr(), e_b.data_ptr()
            if pointers != made[3:6]:  # moved since (resize_, set_): checked again
                pointers = self._state_pointers(h, e_units, e_b, batch, dtype)
        else:
            pointers = self._state_pointers(h, e_units, e_b, batch, dtype)
        if pointers is None or inputs != self.inputs or not self._parameters_ready(dtype):
            return None
        # Shaped, strided (contiguous: checked) and placed (the CPU) as the inputs; cheaper than new_empty(sizes).
        h_new, e_units_new, e_b_new = _empty_like(h), _empty_like(e_units), _empty_like(e_b)
        made = (h_new, e_units_new, e_b_new, h_new.data_ptr(), e_units_new.data_ptr(), e_b_new.data_ptr())
        try:
            arguments = _ARGUMENTS.step
        except AttributeError:  # this thread's first call
            arguments = _new_arguments()[0]
        arguments[0] = x.data_ptr()
        arguments[1], arguments[2], arguments[3] = pointers
        arguments[4], arguments[5], arguments[6] = made[3], made[4], made[5]
        arguments[7] = batch
        verdict = kernels[0](self._setup, arguments)
        self._made = (*made, batch, dtype)
        return self.advance(h_new, {"e_units": e_units_new, "e_B": e_b_new}, None, verdict)

    def _state_pointers(
        self,
        h: torch.Tensor | None,
        e_units: torch.Tensor | None,
        e_b: torch.Tensor | None,
        batch: int,
        dtype: torch.dtype,
    ) -> tuple[int, int, int] | None:
        """The addresses of ``h``, ``e_units``, ``e_B`` where they are what the kernels take for ``batch`` streams
        of the real ``dtype`` (the class docstring), else ``None``."""
        state_dtype, hidden = _TYPES[dtype][1], self.hidden
        if (
            h is None
            or e_units is None
            or e_b is None
            or not batch  # empty tensors may have no memory (a null data_ptr)
            or not real_cpu(h, e_units, e_b)
            or h.dtype is not state_dtype
            or e_units.dtype is not state_dtype
            or e_b.dtype is not state_dtype
            or h.shape != (batch, hidden)
            or e_units.shape != (batch, 3, hidden)
            or e_b.shape != (batch, hidden, self.inputs)
            or h.is_conj()
            or e_units.is_conj()
            or e_b.is_conj()
            or not (h.is_contiguous() and e_units.is_contiguous() and e_b.is_contiguous())
        ):
            return None
        return h.data_ptr(), e_units.data_ptr(), e_b.data_ptr()

    def _parameters_ready(self, dtype: torch.dtype) -> bool:
        """Whether the setup holds the addresses of the cell's recurrent parameters as they are now, checked for a
        step of the real ``dtype``; checks them and writes the setup where they changed."""
        cell = self.cell
        if type(cell) is not self.kind:  # a parametrisation registered since: the weights are no longer these
            return False
        parameters = cell._parameters  # what nn.Module.__getattr__ looks up, without its fallbacks
        try:
            nu_log, theta_log, gamma_log = parameters["nu_log"], parameters["theta_log"], parameters["gamma_log"]
            b_re, b_im = parameters["B_re"], parameters["B_im"]
        except KeyError:  # removed or moved (a parametrisation keeps it under parametrizations.<name>.original)
            return False
        key = self._key
        if (
            nu_log is key[0]
            and theta_log is key[1]
            and gamma_log is key[2]
            and b_re is key[3]
            and b_im is key[4]
            and dtype is key[10]
            and nu_log.data_ptr() == key[5]
            and theta_log.data_ptr() == key[6]
            and gamma_log.data_ptr() == key[7]
            and b_re.data_ptr() == key[8]
            and b_im.data_ptr() == key[9]
        ):
            return True
        return self._set_up((nu_log, theta_log, gamma_log, b_re, b_im), dtype)

    def _set_up(self, recurrent: tuple, dtype: torch.dtype) -> bool:
        """Check the recurrent parameters (``dtype``, the cell's shapes, contiguous, real CPU tensors without the
        negation or conjugation bit) and write their addresses into the setup; false (nothing written) when a check
        fails."""
        units, weights = (self.hidden,), (self.hidden, self.inputs)
        if not (
            all(type(p) in (torch.Tensor, nn.Parameter) and p.dtype is dtype for p in recurrent)
            and all(p.shape == units for p in recurrent[:3])
            and all(p.shape == weights for p in recurrent[3:])
            and all(p.is_contiguous() and not p.is_conj() for p in recurrent)
            and real_cpu(*recurrent)
        ):
            return False
        pointers = tuple(p.data_ptr() for p in recurrent)
        self._setup[0:5] = pointers
        self._key = (*recurrent, *pointers, dtype)
        return True

    def gradient(
        self, h: torch.Tensor, tensors: dict[str, torch.Tensor], grad_h: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], float] | None:
        """``({name: estimate}, verdict)`` at the state ``h`` with traces ``tensors``: the estimate summed over the
        streams by parameter, in the order and shapes of the cell's parameters (``nu_log``, ``theta_log``,
        ``gamma_log`` ``(H,)``, ``B_re``, ``B_im`` ``(H, I)``, ``C_re``, ``C_im`` ``(I, H)``, ``D`` ``(I,)``; the
        last three zeros), each a new tensor, or ``None`` where the PyTorch path must run (see the class docstring;
        also where ``grad_h`` is not a 2-D tensor of exactly the shape and dtype of ``h``). ``verdict`` is the sum
        of the real view of ``grad_h`` and of the estimate, in double: NaN/inf when one of them holds NaN/inf.
        Raises nothing."""
        if grad_h is None or not real_cpu(grad_h):  # (real_cpu first: false for a non-tensor and when compiling)
            return None
        dtype = _REAL.get(grad_h.dtype)
        if dtype is None or grad_h.dim() != 2 or grad_h.is_conj() or not grad_h.is_contiguous():
            return None
        kernels = self._kernels_for(dtype)
        if kernels is None:
            return None
        batch, hidden = grad_h.shape
        e_units, e_b = tensors.get("e_units"), tensors.get("e_B")
        made = self._made
        if h is made[0] and e_units is made[1] and e_b is made[2] and batch == made[6] and dtype is made[7]:
            units_pointer, b_pointer = e_units.data_ptr(), e_b.data_ptr()
            fits = units_pointer == made[4] and b_pointer == made[5]  # not moved since (resize_, set_)
        else:
            fits = False
        if not fits:
            pointers = self._state_pointers(h, e_units, e_b, batch, dtype)
            if pointers is None:
                return None
            units_pointer, b_pointer = pointers[1], pointers[2]
        if hidden != self.hidden:
            return None
        inputs, new_empty = self.inputs, _EXEMPLARS[dtype].new_empty
        # One allocation per parameter (cheaper than views of one tensor); the kernel writes every entry.
        nu_log, theta_log, gamma_log = new_empty(hidden), new_empty(hidden), new_empty(hidden)
        b_re, b_im = new_empty(hidden, inputs), new_empty(hidden, inputs)
        c_re, c_im, d = new_empty(inputs, hidden), new_empty(inputs, hidden), new_empty(inputs)
        try:
            arguments = _ARGUMENTS.gradient
        except AttributeError:  # this thread's first call
            arguments = _new_arguments()[1]
        arguments[0], arguments[1], arguments[2] = grad_h.data_ptr(), units_pointer, b_pointer
        arguments[3], arguments[4], arguments[5] = nu_log.data_ptr(), theta_log.data_ptr(), gamma_log.data_ptr()
        arguments[6], arguments[7] = b_re.data_ptr(), b_im.data_ptr()
        arguments[8], arguments[9], arguments[10] = c_re.data_ptr(), c_im.data_ptr(), d.data_ptr()
        arguments[11] = batch
        verdict = kernels[1](self._setup, arguments)
        estimate = {
            "nu_log": nu_log,
            "theta_log": theta_log,
            "gamma_log": gamma_log,
            "B_re": b_re,
            "B_im": b_im,
            "C_re": c_re,
            "C_im": c_im,
            "D": d,
        }
        return estimate, verdict
