"""When a C kernel may touch tensors: :func:`real_cpu`, the one test every kernel getter of this package applies.

A C kernel reads and writes memory through ``data_ptr()``, behind the back of the dispatcher: no tracer, transform
or mode sees it. So it may run only where that memory is real and where nobody needs to see the ops:

* not while ops are traced or watched: ``torch.compile``/``torch.export`` (Dynamo, whose values are fake tensors
  with no memory behind their ``data_ptr()``), ``make_fx`` and AOT autograd (a ``TorchDispatchMode`` is active:
  proxy, fake, functionalization), ``torch.jit.trace``, ``torch.fx.symbolic_trace``, a ``torch.func`` transform
  (``vmap``, ``grad``, ``jacrev``, ``functionalize``: a functorch level is active), or any other dispatch mode or
  torch-function mode (a mode may replace what the ops around the kernel return; only ``torch.device`` contexts,
  which change where factory functions allocate, are let through: the bindings allocate on their inputs' device);
* only on tensors whose type is exactly ``torch.Tensor`` or ``nn.Parameter`` (no subclass: ``FakeTensor``,
  ``FunctionalTensor``, ``DTensor``, a user's ``__torch_function__``/``__torch_dispatch__`` class), on the CPU (not
  meta, not an accelerator), with a storage (which functorch's wrappers, vmap's ``BatchedTensor`` and ``grad``'s
  tracking tensor, have not, even once they escape their transform, nor sparse and mkldnn tensors), not functional
  (``torch._is_functional_tensor``: a storage without memory behind it), and without the lazy negation bit (whose
  memory holds ``-x``).

Where the test fails the callers run their PyTorch ops, which compute the same expression (and which a tracer
records). The test costs well under a microsecond per tensor; dtypes, shapes and strides are each getter's own
business, and so is autocast: a getter whose callers compute the kernel's inputs with PyTorch products (the
reflection's rows, UORO's fused step) declines under CPU autocast, which would return those products in bfloat16
for a kernel that reads float32.
"""

from __future__ import annotations

import torch
import torch.fx._symbolic_trace as _fx
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext

__all__ = ["real_cpu", "real_cpu_tensor", "tracing"]

_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))
_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_functorch_level = torch._C._functorch.maybe_current_level
_jit_tracing = torch._C._is_tracing
_functional = torch._is_functional_tensor
_has_storage = torch._C._has_storage
# fx.symbolic_trace's flag is thread-local; reading its __dict__ is ten times cheaper than the public accessor.
_fx_state = getattr(_fx, "_is_fx_tracing_tls", None)
_fx_symbolic_tracing = getattr(_fx, "is_fx_symbolic_tracing", lambda: False)


def _fx_tracing() -> bool:
    if _fx_state is not None:
        return bool(_fx_state.__dict__.get("flag", False))
    return _fx_symbolic_tracing()


def _foreign_function_mode() -> bool:
    """A torch-function mode other than a ``torch.device`` block is active (called only when some mode is)."""
    return not all(isinstance(mode, DeviceContext) for mode in _get_current_function_mode_stack())


def tracing() -> bool:
    """Whether some tracer, transform or mode may see or replace the ops right now (see the module docstring): then
    no C kernel runs, whatever the tensors."""
    return bool(
        _compiling()
        or _dispatch_modes()
        or _functorch_level() is not None
        or _jit_tracing()
        or _fx_tracing()
        or (_function_modes() and _foreign_function_mode())
    )


def real_cpu_tensor(t: torch.Tensor) -> bool:
    """:func:`real_cpu` of one tensor (not ``None``), written out: the check of a step's ``x`` at one stream, where
    the call and the loop of :func:`real_cpu` are a measurable part of the step."""
    return not (
        _compiling()
        or _dispatch_modes()
        or _functorch_level() is not None
        or _jit_tracing()
        or (_fx_state.__dict__.get("flag", False) if _fx_state is not None else _fx_symbolic_tracing())
        or (_function_modes() and _foreign_function_mode())
        or type(t) not in _PLAIN
        or not t.is_cpu
        or t.is_neg()
        or not _has_storage(t)
        or _functional(t)
    )


def real_cpu(*tensors: torch.Tensor | None) -> bool:
    """Whether a C kernel may read and write every one of ``tensors`` (``None`` entries are skipped) through its
    ``data_ptr()``: plain CPU tensors with real memory, and nothing tracing (:func:`tracing`)."""
    if tracing():
        return False
    for t in tensors:
        # No storage: functorch's wrappers (vmap's BatchedTensor, grad's tracking tensor, also once they escape
        # their transform), sparse and mkldnn layouts; a functional tensor has a storage without memory behind it.
        if t is not None and (
            type(t) not in _PLAIN or not t.is_cpu or t.is_neg() or not _has_storage(t) or _functional(t)
        ):
            return False
    return True
