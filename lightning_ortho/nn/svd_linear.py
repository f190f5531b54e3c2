"""Fully connected layers in SVD form, ``y = U diag(s) V^T x + b`` (Zhang et al. 2018; Appendix B.1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightning_ortho.nn._checks import check_features
from lightning_ortho.nn.orthogonal_maps import OrthogonalMethod, orthogonal_map


class SVDLinear(nn.Module):
    """``y = U Sigma V^T x + b`` with ``U``, ``V`` orthogonal(-like) maps and learnable singular values.

    Args:
        in_features: size of the input, on which ``V`` acts.
        out_features: size of the output, on which ``U`` acts; ``Sigma`` is the ``(out, in)`` rectangular
            diagonal of ``min(in, out)`` singular values.
        orthogonal: the map used for both ``U`` and ``V^T`` (see :func:`orthogonal_map`). With ``"aux"``
            both are auxiliary reflections, as in the paper's FCNN.
        bias: add a learnable bias.
        **map_kwargs: passed to :func:`orthogonal_map` for both maps.

    Singular values start ``U(0.99, 1.01)`` (Appendix B.1), so the layer starts close to orthogonal.

    Shapes: ``(..., in_features) -> (..., out_features)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        orthogonal: OrthogonalMethod = "aux",
        bias: bool = True,
        **map_kwargs: Any,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.orthogonal = in_features, out_features, orthogonal
        self.right = orthogonal_map(in_features, orthogonal, **map_kwargs)  # V^T
        self.left = orthogonal_map(out_features, orthogonal, **map_kwargs)  # U
        self.rank = min(in_features, out_features)
        self.singular_values = nn.Parameter(torch.empty(self.rank).uniform_(0.99, 1.01))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = U Sigma V^T x + b`` for every row: ``(..., in_features) -> (..., out_features)``.

        ``V^T x`` keeps its first ``rank = min(in, out)`` entries, scaled by the singular values and zero-padded
        to ``out_features``, then ``U`` acts and the bias is added.

        Args:
            x: ``(..., in_features)`` inputs.

        Returns:
            ``(..., out_features)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor.
            ValueError: the trailing dimension of ``x`` is not ``in_features``.
        """
        check_features(x, self.in_features, name="x", layer="SVDLinear")
        z = self.right(x)[..., : self.rank] * self.singular_values.to(x.dtype)
        if self.out_features > self.rank:
            z = nn.functional.pad(z, (0, self.out_features - self.rank))
        y = self.left(z)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, orthogonal={self.orthogonal!r}, bias={self.bias is not None}"
