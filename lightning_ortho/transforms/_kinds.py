"""How a refusal names a value that should have been a floating-point tensor: by its dtype, with the conversion."""

from __future__ import annotations

import torch


def not_floating(value: object) -> str:
    """The end of ``"... must be a floating-point tensor, got "``: ``a torch.int64 tensor; convert it with
    .float() (or .double())`` for an integer or bool tensor, ``a torch.complex64 tensor (complex values are not
    supported)`` for a complex one, a floating tensor's dtype, or the type's name for anything else (``list``)."""
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    kind = f"a {value.dtype} tensor"
    if value.is_complex():
        return f"{kind} (complex values are not supported)"
    if value.is_floating_point():
        return kind
    return f"{kind}; convert it with .float() (or .double())"
