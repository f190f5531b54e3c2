"""``y = C (T x) + b``: a fast product followed by a sparse matrix, the layer :func:`compress_linear` builds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from lightning_ortho.transforms.blocks import BinaryBlockProduct, BlockProduct
from lightning_ortho.transforms.costs import OpCount, row_cost


def _frozen(transform: BlockProduct) -> BlockProduct:
    """A non-trainable copy of ``transform`` (binary products stay binary)."""
    if not isinstance(transform, BlockProduct):
        raise TypeError(f"FactorizedLinear: transform must be a BlockProduct, got {type(transform).__name__}.")
    if isinstance(transform, BinaryBlockProduct):
        copy = BinaryBlockProduct(
            transform.n, transform.pairs.cpu(), transform.core_index.cpu(), dtype=transform.blocks.dtype
        )
    else:
        copy = BlockProduct(transform.n, transform.pairs.cpu(), transform.blocks.detach().cpu(), trainable=False)
    return copy.to(transform.blocks.device)


class FactorizedLinear(nn.Module):
    """``y = C (T x) + b``: a fast product ``T`` (``T = D^T`` for a learned dictionary ``D``), then sparse codes.

    Args:
        transform: the :class:`BlockProduct` ``T`` applied to the inputs (copied, non-trainable; use
            :meth:`from_dictionary` to pass ``D`` instead).
        codes: ``(out, n)`` code matrix ``C``; entries outside ``mask`` are set to zero.
        bias: ``(out,)`` or ``None``.
        mask: ``(out, n)`` bool support of ``C`` (default: ``codes != 0``), the buffer ``mask``.

    Fine-tuning: ``codes`` (dense ``(out, n)``, zero off the support) and ``bias`` are the only parameters. The
    forward pass uses ``codes.masked_fill(~mask, 0)``, so gradients outside the support are exactly zero and
    whatever an optimizer writes there (momentum, weight decay) never reaches the output: only the support is
    trained. The product is one dense ``F.linear`` (fast on every device); :meth:`op_count` reports the cost
    of the sparse product instead.

    Attributes:
        error: ``100 ||W - C T||^2 / ||W||^2`` of the layer it replaced (percent; ``nan`` when not known).
        report: the :class:`CompressionReport` of :func:`compress_linear` (``None`` otherwise).

    Shapes: ``forward(x)``: ``(..., n) -> (..., out)``.

    Raises:
        TypeError: ``transform`` is not a BlockProduct, ``codes`` not floating point, ``mask`` not bool.
        ValueError: shapes disagree, or ``codes``/``bias`` hold NaN or inf.
    """

    def __init__(
        self,
        transform: BlockProduct,
        codes: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.transform = _frozen(transform)
        n = self.transform.n
        if not isinstance(codes, torch.Tensor) or not codes.is_floating_point():
            raise TypeError("FactorizedLinear: codes must be a floating-point (out, n) tensor.")
        if codes.dim() != 2 or codes.shape[1] != n:
            raise ValueError(f"FactorizedLinear: codes must have shape (out, {n}), got {tuple(codes.shape)}.")
        codes = codes.detach().clone()
        if mask is None:
            mask = codes != 0
        elif not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("FactorizedLinear: mask must be a bool tensor shaped like codes.")
        if mask.shape != codes.shape:
            raise ValueError(f"FactorizedLinear: mask has shape {tuple(mask.shape)}, codes {tuple(codes.shape)}.")
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (codes.shape[0],)):
            raise ValueError(f"FactorizedLinear: bias must be a tensor of shape ({codes.shape[0]},) or None.")
        for name, tensor in (("codes", codes), ("bias", bias)):
            if tensor is not None and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"FactorizedLinear: {name} holds NaN or inf.")
        mask = mask.detach().to(codes.device).clone()
        self.codes = nn.Parameter(codes.masked_fill(~mask, 0))
        self.register_buffer("mask", mask)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone().to(codes))
        self.transform.to(device=codes.device, dtype=codes.dtype)
        self.in_features, self.out_features = n, codes.shape[0]
        self.error = math.nan
        self.report: Any = None  # the CompressionReport of compress_linear, when it built this layer

    @classmethod
    def from_dictionary(
        cls, dictionary: BlockProduct, codes: torch.Tensor, bias: torch.Tensor | None = None, *, mask=None
    ) -> FactorizedLinear:
        """``y = C (D^T x) + b`` from a learner's dictionary ``D`` (``Y ~ codes @ D^T``); ``T = D.transpose()``."""
        return cls(dictionary.transpose(), codes, bias, mask=mask)

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], prefix: str = "") -> FactorizedLinear:
        """Rebuild a module from its ``state_dict()`` (keys under ``prefix``); outputs are reproduced exactly.

        Raises:
            KeyError: a required key (``codes``, ``mask``, ``transform.pairs``, ``transform.blocks``) is missing.
        """
        sub = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        missing = [k for k in ("codes", "mask", "transform.pairs", "transform.blocks") if k not in sub]
        if missing:
            raise KeyError(f"FactorizedLinear.from_state_dict: missing {[prefix + k for k in missing]}.")
        codes, blocks, pairs = sub["codes"], sub["transform.blocks"], sub["transform.pairs"].cpu()
        n = codes.shape[1]
        if "transform.core_index" in sub:
            transform = BinaryBlockProduct(n, pairs, sub["transform.core_index"].cpu(), dtype=blocks.dtype)
        else:
            transform = BlockProduct(n, pairs, blocks.cpu(), trainable=False)
        module = cls(transform.to(codes.device), codes, sub.get("bias"), mask=sub["mask"].bool())
        module.load_state_dict(sub, strict=True)
        return module

    def sparse_codes(self) -> torch.Tensor:
        """``(out, n)`` codes with the support enforced (differentiable in ``codes``)."""
        return self.codes.masked_fill(~self.mask, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``C (T x) + b`` for each row: ``(..., n) -> (..., out)``.

        Raises:
            TypeError, ValueError: as :meth:`BlockProduct.forward` (non-float input, wrong last dimension, NaN).
        """
        return functional.linear(self.transform(x).to(x.dtype), self.sparse_codes(), self.bias)

    def dense_weight(self) -> torch.Tensor:
        """The ``(out, n)`` matrix ``C T`` the layer applies (differentiable in ``codes``)."""
        return self.sparse_codes() @ self.transform.matrix().to(self.codes.dtype)

    def relative_error(self, weight: torch.Tensor) -> float:
        """``100 ||W - C T||_F^2 / ||W||_F^2`` in percent for a dense ``(out, n)`` weight ``W`` (float64)."""
        weight = weight.detach().double()
        residual = weight - self.dense_weight().detach().double().to(weight.device)
        return float(100 * residual.square().sum() / weight.square().sum())

    @property
    def nnz(self) -> int:
        """Size of the support (``mask.sum()``)."""
        return int(self.mask.sum())

    def codes_op_count(self) -> OpCount:
        """Cost of ``C t``, row by row with :func:`~lightning_ortho.transforms.costs.row_cost`: a row with ``k``
        nonzero codes costs ``k - 1`` additions and one multiplication per nonzero (``+-1`` free, powers of two a
        shift); for generic real codes that is ``nnz`` multiplications and ``nnz - (nonempty rows)`` additions.
        Support entries that are exactly zero cost nothing. The bias is not counted (nor in :meth:`dense_op_count`)."""
        total = OpCount()
        for row in self.sparse_codes().detach().double().cpu().tolist():
            total = total + row_cost(row)
        return total

    def transform_op_count(self, terms: int | None = None, *, defer_scaling: bool = False) -> OpCount:
        """Cost of ``T x``: :meth:`BlockProduct.op_count` (``terms`` for SOPOT cores, ``defer_scaling`` for binary
        cores, see :meth:`BinaryBlockProduct.op_count`).

        Raises:
            ValueError: ``terms`` is given and a core entry is not a sum of at most ``terms`` signed powers of two.
        """
        if isinstance(self.transform, BinaryBlockProduct):
            return self.transform.op_count(defer_scaling=defer_scaling)
        return self.transform.op_count(terms)

    def op_count(self, terms: int | None = None, *, defer_scaling: bool = False) -> OpCount:
        """Operations of one ``C (T x)``: :meth:`transform_op_count` plus :meth:`codes_op_count`."""
        return self.transform_op_count(terms, defer_scaling=defer_scaling) + self.codes_op_count()

    def dense_op_count(self) -> OpCount:
        """Operations of the dense ``W x`` it replaces: ``out * in`` multiplications, ``out * (in - 1)`` additions."""
        return OpCount(
            additions=self.out_features * (self.in_features - 1), multiplications=self.out_features * self.in_features
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nnz={self.nnz}, bias={self.bias is not None}"
