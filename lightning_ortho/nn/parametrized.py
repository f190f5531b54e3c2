"""Orthogonal maps from ``torch.nn.utils.parametrizations.orthogonal`` behind our ``(..., d)`` interface."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn
from torch.nn.utils import parametrizations

from lightning_ortho.nn._checks import (
    LOW_PRECISION,
    check_orthogonal,
    check_parameters_finite,
    check_positive_int,
    prepare_input,
)
from lightning_ortho.nn.base import OrthogonalMap

TorchOrthogonalMap = Literal["cayley", "matrix_exp", "householder"]


class ParametrizedOrthogonal(OrthogonalMap):
    """``x -> Q x`` with ``Q`` from PyTorch's own orthogonal parametrisation (not re-implemented here).

    ``"cayley"`` and ``"matrix_exp"`` are the maps of Lezcano-Casado & Martinez-Rubio (2019) and Casado
    (2019); ``"householder"`` is PyTorch's ``householder_product`` (LAPACK ``orgqr``), kept as a baseline.

    Args:
        d: feature dimension; inputs ``(..., d)``.
        orthogonal_map: ``"cayley"``, ``"matrix_exp"`` or ``"householder"``.

    The base weight is initialised ``U(-1/sqrt(d), 1/sqrt(d))`` as in Appendix B.1; PyTorch then starts
    from the orthogonal factor of that matrix.
    """

    def __init__(self, d: int, orthogonal_map: TorchOrthogonalMap = "cayley") -> None:
        super().__init__()
        check_positive_int(d, "d", "ParametrizedOrthogonal")
        if orthogonal_map not in ("cayley", "matrix_exp", "householder"):
            raise ValueError(
                f"ParametrizedOrthogonal: orthogonal_map must be 'cayley', 'matrix_exp' or 'householder', got {orthogonal_map!r}."
            )
        self.d, self.orthogonal_map = d, orthogonal_map
        linear = nn.Linear(d, d, bias=False)
        nn.init.uniform_(linear.weight, -1.0 / math.sqrt(d), 1.0 / math.sqrt(d))
        self.linear = parametrizations.orthogonal(linear, orthogonal_map=orthogonal_map)

    @classmethod
    def from_orthogonal(
        cls, orthogonal: torch.Tensor, orthogonal_map: TorchOrthogonalMap = "cayley"
    ) -> ParametrizedOrthogonal:
        """The map with ``Q = U`` for an orthogonal ``(d, d)`` ``U`` (through PyTorch's ``right_inverse``)."""
        layer = cls(orthogonal.shape[0], orthogonal_map).to(device=orthogonal.device, dtype=orthogonal.dtype)
        return layer.reset_orthogonal_(orthogonal)

    @property
    def represents_every_orthogonal(self) -> bool:
        """True: PyTorch's ``right_inverse`` sets ``Q`` to any orthogonal matrix."""
        return True

    @torch.no_grad()
    def reset_orthogonal_(self, orthogonal: torch.Tensor) -> ParametrizedOrthogonal:
        """Set ``Q = U`` in place. Returns ``self``."""
        check_orthogonal(orthogonal, self.d, "ParametrizedOrthogonal.reset_orthogonal_")
        self.linear.weight = orthogonal.to(self.linear.parametrizations.weight.original.dtype)
        return self

    def matrix(self) -> torch.Tensor:
        """``(d, d)``: the current orthogonal matrix ``Q``."""
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d)``: ``Q x`` for every row."""
        y = self.linear(prepare_input(x, self.d, self, name="x", layer="ParametrizedOrthogonal"))
        # PyTorch's maps turn a NaN input into a NaN output silently: check it as every other layer does.
        check_parameters_finite(y.detach().sum(-1), lambda: {"x": x}, layer="ParametrizedOrthogonal")
        return y.to(x.dtype)

    def _apply(self, fn, recurse: bool = True):
        # Refuse a cast to half precision before any tensor is converted (an empty slice tells fn's result dtype).
        dtype = fn(self.linear.parametrizations.weight.original.detach()[:0]).dtype
        if dtype in LOW_PRECISION:
            raise TypeError(
                f"ParametrizedOrthogonal({self.orthogonal_map!r}): PyTorch's orthogonal parametrisation cannot run in "
                f"{dtype} (its LU / matrix exponential have no half-precision kernels). Keep these maps in float32 and "
                "train with mixed precision instead (autocast, e.g. --trainer.precision=bf16-mixed), or use "
                "orthogonal='aux' or 'householder', which accept half-precision parameters and compute in float32."
            )
        return super()._apply(fn, recurse)

    def __reduce_ex__(self, protocol: int):
        # PyTorch refuses to pickle a parametrised module, and ddp_spawn (like torch.save(model)) pickles the model:
        # rebuild it from its arguments and state_dict instead.
        return _rebuild, (self.d, self.orthogonal_map, self.state_dict(), self.training)

    def extra_repr(self) -> str:
        return f"d={self.d}, orthogonal_map={self.orthogonal_map!r}"


def _rebuild(d: int, orthogonal_map: TorchOrthogonalMap, state: dict, training: bool) -> ParametrizedOrthogonal:
    """Unpickle a :class:`ParametrizedOrthogonal` (see ``__reduce_ex__``) without drawing from the global RNG."""
    with torch.random.fork_rng(devices=[]):
        layer = ParametrizedOrthogonal(d, orthogonal_map)
    like = next(iter(state.values()))
    layer.to(device=like.device, dtype=like.dtype).load_state_dict(state)
    return layer.train(training)
