"""Python bindings of ``uoro.c``, for float32/float64 CPU tensors: UORO's whole GIR step on the tanh cell in one
call (:func:`gir_step`, at small sizes), or its row work around PyTorch's GEMMs and its one-pass update of
``w_tilde`` (at larger ones; :class:`lightning_ortho.online.uoro_fused.TanhUOROStep` computes the same with PyTorch
ops elsewhere), and the summed estimate of any cell's UORO in one pass over ``w_tilde``, one output per parameter
(:class:`SummedEstimate`)."""

from __future__ import annotations

import ctypes
import struct

import torch

from lightning_ortho._native import load, real_cpu

__all__ = ["SummedEstimate", "commit", "gir_rows", "gir_step", "row_norms", "uoro_gradient_kernel", "uoro_tanh_kernels"]

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
#: ``uoro_step_arguments`` of ``uoro.c`` (native sizes and alignment): the one-call step's arguments packed in one
#: buffer, one ctypes argument (ctypes converts each argument in Python, about 0.15 us apiece).
_STEP_ARGUMENTS = struct.Struct("@12P4ld").pack
#: ``uoro_gradient_arguments`` of ``uoro.c`` before its parts (each part ``(length, out)``: ``"lP"``).
_GRADIENT_HEAD = "@3P4l"
_autocast = torch.is_autocast_enabled
_TYPES = {torch.float32: ("float32", ctypes.c_float), torch.float64: ("float64", ctypes.c_double)}


#: ``{dtype: (library, kernels)}``: the C functions of the last loaded library, declared once per dtype (a getter
#: runs at every step: a lookup here instead of four ``getattr`` on the library).
_TANH_KERNELS: dict[torch.dtype, tuple] = {}
_GRADIENT_KERNELS: dict[torch.dtype, tuple] = {}


def uoro_tanh_kernels(like: torch.Tensor, *others: torch.Tensor | None) -> tuple | None:
    """``(gir_rows, commit, norms, gir_step)`` C functions for ``like``'s dtype, or ``None`` when ``like`` is not
    float32/float64, when ``like`` or one of ``others`` (every tensor the kernels will read, or whose products they
    will read: the cell's weights) is not a real CPU tensor or something is tracing
    (:func:`lightning_ortho._native.real_cpu`), under CPU autocast (the caller's products would come back in
    bfloat16), or when the kernels are unavailable (:func:`lightning_ortho._native.load`)."""
    found = _TANH_KERNELS.get(like.dtype)  # (declared: float32 or float64)
    if (found is None and like.dtype not in _TYPES) or _autocast("cpu") or not real_cpu(like, *others):
        return None
    library = load("uoro")
    if library is None:
        return None
    if found is None or found[0] is not library:
        suffix = _declare(library, like.dtype)
        names = ("gir_rows", "commit", "norms", "gir_step")
        found = _TANH_KERNELS[like.dtype] = (library, tuple(getattr(library, f"uoro_tanh_{n}_{suffix}") for n in names))
    return found[1]


def _declare(library: ctypes.CDLL, dtype: torch.dtype) -> str:
    """Declare the C signatures of ``dtype``'s functions (once: ctypes keeps the function objects); returns the
    functions' name suffix."""
    suffix, scalar = _TYPES[dtype]
    rows, commit = getattr(library, f"uoro_tanh_gir_rows_{suffix}"), getattr(library, f"uoro_tanh_commit_{suffix}")
    gradient = getattr(library, f"uoro_gradient_{suffix}")
    norms = getattr(library, f"uoro_tanh_norms_{suffix}")
    step = getattr(library, f"uoro_tanh_gir_step_{suffix}")
    if rows.argtypes is None:
        norms.argtypes = [_POINTER, _LONG, _LONG, _LONG, _POINTER]
        norms.restype = None
        rows.argtypes = [_POINTER] * 7 + [_LONG, _LONG, _LONG, scalar, _INT] + [_POINTER] * 3
        rows.restype = ctypes.c_double
        commit.argtypes = [_POINTER] * 5 + [_LONG, _LONG, _LONG, _POINTER]
        commit.restype = None
        for packed in (gradient, step):  # the bytes of the packed arguments, passed without a copy
            packed.argtypes = [ctypes.c_char_p]
            packed.restype = ctypes.c_double
    return suffix


def uoro_gradient_kernel(like: torch.Tensor, *others: torch.Tensor | None):
    """The C function of :class:`SummedEstimate` for ``like``'s dtype, or ``None`` (as :func:`uoro_tanh_kernels`:
    pass ``w_tilde``, ``grad_h`` and ``h_tilde``; autocast does not matter, the kernel reads only them)."""
    if like.dtype not in _TYPES or not real_cpu(like, *others):
        return None
    library = load("uoro")
    if library is None:
        return None
    return _gradient_of(library, like.dtype)


def _gradient_of(library: ctypes.CDLL, dtype: torch.dtype):
    """The summed estimate's C function of ``library`` for ``dtype`` (float32/float64), declared once per library."""
    found = _GRADIENT_KERNELS.get(dtype)
    if found is None or found[0] is not library:
        suffix = _declare(library, dtype)
        found = _GRADIENT_KERNELS[dtype] = (library, getattr(library, f"uoro_gradient_{suffix}"))
    return found[1]


class SummedEstimate:
    """UORO's summed estimate ``sum_b (grad_h_b . h_tilde_b) w_tilde_b`` of any cell, split by parameter as
    ``gradient()`` returns it: one C pass over ``w_tilde`` ``(B, P)`` that writes each parameter's entries (the next
    ``numel`` entries of the flat layout, in the layout's order) into a tensor of its own, of its shape.

    One allocation per parameter (about 1.2 us each at one stream, with the sizes as ints) is cheaper than one
    ``(P,)`` tensor and a view per parameter (about 1.7 us each), whatever the number of parameters, so every cell
    takes its own outputs. Three parameters (the tanh cell's ``weight_hh``, ``weight_ih``, ``bias``) take a path
    written out, a microsecond shorter than the loop.

    Args:
        names: the parameters' names, in the layout's order (``cell.named_parameters()``).
        shapes: their shapes, in that order.
    """

    __slots__ = ("names", "shapes", "size", "_pack", "_parts", "_three")

    def __init__(self, names: tuple[str, ...], shapes: tuple[tuple[int, ...], ...]) -> None:
        self.names, self.shapes = tuple(names), tuple(tuple(shape) for shape in shapes)
        lengths = [1] * len(self.shapes)
        for index, shape in enumerate(self.shapes):
            for extent in shape:
                lengths[index] *= extent
        self.size = sum(lengths)  # P
        self._pack = struct.Struct(_GRADIENT_HEAD + "lP" * len(lengths)).pack
        #: ``(name, new_empty's arguments, entries)`` per parameter (a 0-d one is allocated with the shape ``()``)
        self._parts = tuple(
            (name, shape if shape else ((),), length)
            for name, shape, length in zip(self.names, self.shapes, lengths, strict=True)
        )
        #: the three parts' fields side by side, where there are three (else ``None``)
        self._three = sum(self._parts, ()) if len(self._parts) == 3 else None

    def __reduce__(self) -> tuple:  # copy and pickle: made again from the layout (a struct.Struct does not pickle)
        return type(self), (self.names, self.shapes)

    def __call__(
        self, kernel, w_tilde: int, grad_h: torch.Tensor, h_tilde: int, batch: int, hidden: int
    ) -> tuple[dict[str, torch.Tensor], float]:
        """``({name: estimate of that parameter}, the sum of grad_h and of the estimate)`` from the addresses of
        ``w_tilde`` ``(B, P)`` and ``h_tilde`` ``(B, H)`` (``data_ptr()``) and ``grad_h`` ``(B, H)``, all
        C-contiguous, of one dtype and of these sizes (the caller checks; ``kernel``: :func:`uoro_gradient_kernel`
        of that dtype). The outputs are new tensors of ``grad_h``'s dtype and device; the sum is NaN/inf when
        ``grad_h`` or the estimate is not finite."""
        new_empty, three = grad_h.new_empty, self._three
        if three is not None:
            name_0, size_0, length_0, name_1, size_1, length_1, name_2, size_2, length_2 = three
            out_0, out_1, out_2 = new_empty(*size_0), new_empty(*size_1), new_empty(*size_2)  # (ints: see above)
            total = kernel(
                self._pack(
                    w_tilde, grad_h.data_ptr(), h_tilde, batch, hidden, self.size, 3,
                    length_0, out_0.data_ptr(), length_1, out_1.data_ptr(), length_2, out_2.data_ptr(),
                )
            )  # fmt: skip
            return {name_0: out_0, name_1: out_1, name_2: out_2}, total
        outputs, parts = {}, []
        for name, size, length in self._parts:
            out = outputs[name] = new_empty(*size)
            parts += (length, out.data_ptr())
        head = (w_tilde, grad_h.data_ptr(), h_tilde, batch, hidden, self.size, len(self._parts))
        return outputs, kernel(self._pack(*head, *parts))


def gir_step(
    step,
    addresses: tuple[int, ...],
    h: torch.Tensor,
    w_tilde: torch.Tensor,
    nu: torch.Tensor,
    bits: torch.Tensor,
    sizes: tuple[int, int, int],
    eps: float,
    state_cut: bool,
) -> tuple:
    """The whole GIR step of UORO on the tanh cell in one call of ``step`` (the ``gir_step`` of
    :func:`uoro_tanh_kernels`): ``(h', h_tilde', w_tilde', the sum of x, h' and h_tilde', and the three outputs'
    data_ptr()s)``, new tensors (the state is read only), from ``addresses``: the ``data_ptr()`` of ``W_h``
    ``(H, H)``, ``W_x`` ``(H, I)``, ``b`` ``(H,)``, ``x`` ``(B, I)``, ``h``, ``h_tilde`` ``(B, H)`` and ``w_tilde``
    ``(B, P)`` (``h`` and ``w_tilde`` given too: the outputs are allocated like them; ``sizes = (B, H, I)``, which
    these shapes must have: the caller checks) and the draw: ``nu`` ``(B, H)`` and the bits ``(B, 1)`` in ``{0, 1}``
    of the signs ``tau = 2 bit - 1``::

        h' = tanh(W_h h + W_x x + b),   d = 1 - h'^2,   J h_tilde = d * (W_h h_tilde),   a = [h; x; 1]
        (psi, g) = (nu, nu * d) at the cut h, (nu * d, nu) at z
        gamma = sqrt((||w_tilde|| + eps) / (||J h_tilde|| + eps)),   beta = sqrt((||g|| ||a|| + eps) / (||psi|| + eps))
        h_tilde' = gamma J h_tilde + beta tau psi,   w_tilde' = w_tilde / gamma + (tau / beta) g a^T

    Every tensor C-contiguous and of one dtype; the sum is NaN/inf when the step is not finite."""
    empty_like = torch.empty_like  # (as cheap as new_empty with ints; a shape tuple costs more)
    h_new, h_tilde_new, w_tilde_new = empty_like(h), empty_like(h), empty_like(w_tilde)
    outputs = h_new.data_ptr(), h_tilde_new.data_ptr(), w_tilde_new.data_ptr()
    total = step(_STEP_ARGUMENTS(*addresses, nu.data_ptr(), bits.data_ptr(), *outputs, *sizes, state_cut, eps))
    return h_new, h_tilde_new, w_tilde_new, total, *outputs


def gir_rows(
    kernels: tuple,
    h_new: torch.Tensor,
    prop: torch.Tensor,
    nu: torch.Tensor,
    tau: torch.Tensor,
    h: torch.Tensor,
    x: torch.Tensor,
    w_norm: torch.Tensor,
    eps: float,
    state_cut: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """``(h', h_tilde', 1 / gamma (B, 1), (tau / beta) g, sum of h_tilde')`` from the new state ``h'`` and
    ``prop = W_h h_tilde`` ``(B, H)``, the noise ``nu`` ``(B, H)`` and ``tau`` ``(B, 1)``, ``h`` ``(B, H)``, ``x``
    ``(B, I)`` and ``||w_tilde||`` ``(B, 1)``; every tensor C-contiguous and of one dtype."""
    batch, hidden = h_new.shape
    h_tilde, g = torch.empty_like(h_new), torch.empty_like(h_new)
    inverse_gamma = h_new.new_empty(batch, 1)
    total = kernels[0](
        h_new.data_ptr(), prop.data_ptr(), nu.data_ptr(), tau.data_ptr(), h.data_ptr(), x.data_ptr(),
        w_norm.data_ptr(), batch, hidden, x.shape[1], eps, int(state_cut),
        h_tilde.data_ptr(), inverse_gamma.data_ptr(), g.data_ptr(),
    )  # fmt: skip
    return h_new, h_tilde, inverse_gamma, g, total


def commit(
    kernels: tuple,
    w_tilde: torch.Tensor,
    inverse_gamma: torch.Tensor,
    g: torch.Tensor,
    h: torch.Tensor,
    x: torch.Tensor,
) -> torch.Tensor:
    """``w_tilde <- w_tilde / gamma + g a^T`` in place (``a = [h; x; 1]``, blocks ``[vec(W_h), vec(W_x), b]``) and
    the new ``||w_tilde||`` per stream ``(B, 1)``; every tensor C-contiguous and of one dtype."""
    norms = w_tilde.new_empty(w_tilde.shape[0], 1)
    kernels[1](
        w_tilde.data_ptr(), inverse_gamma.data_ptr(), g.data_ptr(), h.data_ptr(), x.data_ptr(),
        g.shape[0], g.shape[1], x.shape[1], norms.data_ptr(),
    )  # fmt: skip
    torch.autograd.graph.increment_version(w_tilde)  # written behind PyTorch's back: tell its version counter
    return norms


def row_norms(kernels: tuple, w_tilde: torch.Tensor, hidden: int, inputs: int) -> torch.Tensor:
    """``||w_tilde||`` per stream ``(B, 1)`` of a C-contiguous ``w_tilde`` ``(B, H H + H I + H)``, summed exactly as
    :func:`commit` sums the norms it returns (so a state loaded from a checkpoint steps on bit for bit)."""
    norms = w_tilde.new_empty(w_tilde.shape[0], 1)
    kernels[2](w_tilde.data_ptr(), w_tilde.shape[0], hidden, inputs, norms.data_ptr())
    return norms
