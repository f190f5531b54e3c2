"""The sparse codes every compressed layer holds (``FactorizedLinear``, ``FactorizedConv``): checked and registered
one way."""

from __future__ import annotations

import torch
from torch import nn


def register_sparse_codes(
    module: nn.Module, codes: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor | None, layer: str
) -> None:
    """Give ``module`` the parameter ``codes`` (zero off ``mask``), the buffer ``mask`` (default ``codes != 0``) and
    the parameter ``bias`` (``(out,)`` or ``None``), copies on the codes' device and dtype.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: ``mask`` is not of the codes' shape, ``bias`` not ``(out,)``, or codes or bias hold NaN or inf.
    """
    codes = codes.detach().clone()
    if mask is None:
        mask = codes != 0
    elif not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{layer}: mask must be a bool tensor shaped like codes.")
    if mask.shape != codes.shape:
        raise ValueError(f"{layer}: mask has shape {tuple(mask.shape)}, codes {tuple(codes.shape)}.")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (codes.shape[0],)):
        raise ValueError(f"{layer}: bias must be a tensor of shape ({codes.shape[0]},) or None.")
    for name, tensor in (("codes", codes), ("bias", bias)):
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{layer}: {name} holds NaN or inf.")
    mask = mask.detach().to(codes.device).clone()
    module.codes = nn.Parameter(codes.masked_fill(~mask, 0))
    module.register_buffer("mask", mask)
    module.bias = None if bias is None else nn.Parameter(bias.detach().clone().to(codes))
