"""Python binding of ``fastcall.c``: the common case of the one-stream calls (:class:`TanhCellForward`'s step,
:class:`FactoredTanhTrace`'s step and estimate) in C with the CPython API, where Python's headers are found
(:func:`lightning_ortho._native.load_extension`); else ``None`` and those classes run their Python code, which makes
the same checks and the same C kernel call.

Each C object stands beside one Python object, which arms it with what its own checks passed (the parameters, their
addresses, the dtype, the kernel and the setup it wrote) and tells it the state tensors it made; the C call handles
only that case and answers ``None`` for anything else. Its checks are those of the Python path (the caller module's
``load`` still gives the armed library, :func:`~lightning_ortho._native.guard.tracing` (any torch-function mode
declines), no autocast, every tensor a plain CPU tensor of the armed dtype, C-contiguous, of the armed shape).
"""

from __future__ import annotations

import types

import torch

import lightning_ortho._native as _native
from lightning_ortho._native import load_extension
from lightning_ortho._native.guard import _fx_state, _fx_tracing

__all__ = ["fastcall"]

#: Whether an autocast (of any device) is on (as ``tanh_cell._autocast``).
_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: torch.is_autocast_enabled("cpu"))


def fastcall() -> types.ModuleType | None:
    """The extension (its types ``TanhForward`` and ``FactoredTrace``), configured with the guard's checks, or
    ``None`` (kernels off, no ``Python.h``, no compiler, a failed build)."""
    module = load_extension("fastcall")
    if module is not None and not getattr(module, "configured", False):
        module.configure(
            torch.Tensor,
            torch.nn.Parameter,
            torch.compiler.is_compiling,
            torch._C._len_torch_dispatch_stack,
            torch._C._functorch.maybe_current_level,
            torch._C._is_tracing,
            _fx_state,  # (None where this version of torch has no such flag: then _fx_tracing is called)
            _fx_tracing,
            torch._C._is_torch_function_mode_enabled,
            torch._C._has_storage,
            torch._is_functional_tensor,
            _autocast,
            _native.load,  # (a caller module whose `load` is this one: the switch decides; another is called)
            vars(_native),  # (its `_switch`: native_kernels' setting)
            _native._environment_enabled,
            vars(torch.nn.modules.module),  # (its global hooks, read at every call: nn.Module.__call__ reads them)
            torch.is_grad_enabled,
        )
        module.configured = True
    return module
