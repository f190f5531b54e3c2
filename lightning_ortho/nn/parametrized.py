"""Orthogonal maps from ``torch.nn.utils.parametrizations.orthogonal`` behind our ``(..., d)`` interface."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from lightning_ortho.nn._checks import (
    LOW_PRECISION,
    check_orthogonal,
    check_parameters_finite,
    check_positive_int,
    has_values,
    prepare_input,
)
from lightning_ortho.nn.base import OrthogonalMap
from lightning_ortho.nn.stiefel import orthonormalize_

TorchOrthogonalMap = Literal["cayley", "matrix_exp", "householder"]


class _GuardedOrthogonal(parametrizations._Orthogonal):
    """PyTorch's orthogonal parametrisation of a square matrix (same state: ``original`` and the buffer ``base``, so
    the same ``state_dict`` keys), with two guards so that ``Q = base @ Q(original)`` is orthogonal to the precision
    of its dtype:

    * ``"householder"``: PyTorch reads the signs of the columns as ``original.diagonal().int()``. With the
      trivialisation the diagonal is written as ``-1`` (``right_inverse`` always returns ``-I``) and never receives a
      gradient, but weight decay shrinks it, and ``int(-0.9999) = 0`` makes ``Q = 0``. Here the signs are the
      ``-1`` that ``right_inverse`` wrote, whatever the optimiser did to the diagonal:
      ``Q = -base @ householder_product(tril(X, -1), 2 / (1 + ||columns||^2))``.
    * ``base`` is an orthogonal matrix of the dtype it was built in: cast from float32 to float64 it is orthogonal only
      to ~1e-7. After a dtype change (``.double()``, ``.to(dtype)``) and after ``load_state_dict``, a base that is not
      orthogonal to ``10 d eps`` of its dtype is replaced by its nearest orthogonal matrix (the polar factor
      ``U V^T`` of its SVD), which moves it by its own error (~1e-7) and no more. A base that passes is left bit for
      bit (a float32 checkpoint resumes exactly).

    Meta tensors (deferred initialisation) keep their shapes: there is nothing to orthogonalise.
    """

    def __init__(self, weight: torch.Tensor, orthogonal_map: TorchOrthogonalMap) -> None:
        super().__init__(weight, parametrizations._OrthMaps[orthogonal_map])
        self.register_load_state_dict_post_hook(_orthogonalize_after_load)

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803 - PyTorch's name
        if self.orthogonal_map != parametrizations._OrthMaps.householder:
            return super().forward(X)
        lower = X.tril(diagonal=-1)
        tau = 2.0 / (1.0 + (lower * lower).sum(dim=-2))
        return self.base @ -torch.linalg.householder_product(lower, tau)

    @torch.no_grad()
    def right_inverse(self, Q: torch.Tensor) -> torch.Tensor:  # noqa: N803 - PyTorch's name
        if has_values(Q):
            return super().right_inverse(Q)
        self.base = Q.clone()  # meta: PyTorch's orthogonality test would read values
        negative_identity = torch.zeros_like(Q)
        negative_identity.diagonal(dim1=-2, dim2=-1).fill_(-1.0)
        return negative_identity

    def _apply(self, fn, recurse: bool = True):
        dtype = None if self.base is None else self.base.dtype
        result = super()._apply(fn, recurse)
        if self.base is not None and self.base.dtype != dtype:
            self.orthogonalize_base_()
        return result

    def orthogonalize_base_(self) -> None:
        """Replace ``base`` by its polar factor if it is not orthogonal to ``10 d eps`` of its dtype (see above)."""
        if self.base is not None and has_values(self.base):
            orthonormalize_(self.base)


def _orthogonalize_after_load(module: _GuardedOrthogonal, _incompatible_keys) -> None:
    """``load_state_dict`` post-hook: a float32 base loaded into float64 is made orthogonal to float64 precision."""
    module.orthogonalize_base_()


class ParametrizedOrthogonal(OrthogonalMap):
    """``x -> Q x`` with ``Q`` from PyTorch's own orthogonal parametrisation (not re-implemented here).

    ``"cayley"`` and ``"matrix_exp"`` are the maps of Lezcano-Casado & Martinez-Rubio (2019) and Casado
    (2019); ``"householder"`` is PyTorch's ``householder_product`` (LAPACK ``orgqr``), kept as a baseline.

    Args:
        d: feature dimension; inputs ``(..., d)``.
        orthogonal_map: ``"cayley"``, ``"matrix_exp"`` or ``"householder"``.

    The base weight is initialised ``U(-1/sqrt(d), 1/sqrt(d))`` as in Appendix B.1; PyTorch then starts
    from the orthogonal factor of that matrix.

    ``Q`` is orthogonal to the precision of the parameters' dtype, also where PyTorch's own parametrisation is not:
    under weight decay (its ``"householder"`` map read the column signs from a diagonal that decay shrinks, and
    returned ``Q = 0``) and after ``.double()`` or loading a float32 ``state_dict`` into float64 (its trivialisation
    base stayed a float32-orthogonal matrix). The parametrisation is PyTorch's ``_Orthogonal`` with these two guards
    (:class:`_GuardedOrthogonal`; the ``state_dict`` keys are PyTorch's).
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
        parametrize.register_parametrization(
            linear, "weight", _GuardedOrthogonal(linear.weight, orthogonal_map), unsafe=True
        )  # what parametrizations.orthogonal(linear, orthogonal_map=...) does, with the guarded parametrisation
        self.linear = linear

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
