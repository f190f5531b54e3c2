"""Products of ``k`` Householder reflections ``Q = H(v_1) ... H(v_k)`` (Mhammedi et al. 2017)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

from lightning_ortho.nn._checks import LOW_PRECISION, check_orthogonal, check_parameters_finite, prepare_input
from lightning_ortho.nn._undefined import safe_squared_norm
from lightning_ortho.nn.base import OrthogonalMap
from lightning_ortho.nn.reflection import reflect_unchecked

Strategy = Literal["sequential", "wy"]


class HouseholderProduct(OrthogonalMap):
    """The orthogonal map ``x -> H(v_1) H(v_2) ... H(v_k) x`` with learnable ``v_i`` ("normal reflections").

    Any ``d x d`` orthogonal matrix is a product of ``d`` reflections, so ``k = d`` (the default) represents
    the whole orthogonal group (:meth:`from_orthogonal`); ``k < d`` trades expressiveness for speed.

    Two strategies compute the same product:

    * ``"sequential"``: ``k`` reflections one after another, O(k B d) work in ``k`` dependent steps
      (the low GPU utilisation the paper sets out to avoid).
    * ``"wy"`` (default): the compact WY form ``Q = I - U S^{-1} U^T`` with ``U`` the normalised ``v_i`` as
      columns and ``S = I/2 + striu(U^T U)`` (the UT transform of Joffrain et al. 2006, the representation
      FastH (Mathiasen et al. 2020) builds blockwise). One Gram matrix, one triangular solve and matrix
      products: no step depends on the previous reflection. ``Q`` is materialised when the batch is large
      enough that ``x Q^T`` is cheaper than applying the factors, otherwise the factors are applied.

    Args:
        d: feature dimension; inputs ``(..., d)``.
        k: number of reflections, default ``d``.
        strategy: ``"sequential"`` or ``"wy"``.

    A zero vector ``v_i`` is the identity (``H(0) := I``), as in :func:`~lightning_ortho.nn.reflect`.
    """

    def __init__(self, d: int, k: int | None = None, *, strategy: Strategy = "wy") -> None:
        super().__init__()
        if not isinstance(d, int) or d < 1:
            raise ValueError(f"HouseholderProduct: d must be a positive integer, got {d!r}.")
        k = d if k is None else k
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"HouseholderProduct: k must be a positive integer (number of reflections), got {k!r}.")
        if strategy not in ("sequential", "wy"):
            raise ValueError(f"HouseholderProduct: strategy must be 'sequential' or 'wy', got {strategy!r}.")
        self.d, self.k, self.strategy = d, k, strategy
        bound = 1.0 / math.sqrt(d)  # Appendix B.1 initialisation
        self.vectors = nn.Parameter(torch.empty(k, d).uniform_(-bound, bound))
        self._cached_matrix: torch.Tensor | None = None

    @contextlib.contextmanager
    def cached(self) -> Iterator[None]:
        """Inside the block, ``Q`` is built once (with autograd) and every call is ``x Q^T``, like
        ``torch.nn.utils.parametrize.cached()`` for PyTorch's parametrisations: for an RNN that applies the
        same ``Q`` at every time step."""
        self._cached_matrix = self.matrix()
        try:
            yield
        finally:
            self._cached_matrix = None

    @classmethod
    def from_orthogonal(cls, orthogonal: torch.Tensor, *, strategy: Strategy = "wy") -> HouseholderProduct:
        """``d`` reflections whose product is exactly ``U`` (Householder QR, as the paper initialises them).

        Column ``j`` of ``H(v_{j-1}) ... H(v_1) U`` is reflected onto ``e_j`` with ``v_j = c - e_j`` (Lemma 5);
        after ``d`` steps the product is ``I``, so ``U = H(v_1) ... H(v_d)``. The entry ``c_j - 1`` is computed
        as ``-||c_{j+1:}||^2 / (c_j + 1)`` to avoid cancellation. Works for ``det U = -1`` too.

        Raises:
            ValueError: ``U`` is not a square orthogonal matrix.
        """
        orthogonal = torch.as_tensor(orthogonal)
        if orthogonal.dim() != 2 or orthogonal.shape[0] != orthogonal.shape[1]:
            raise ValueError(
                f"HouseholderProduct.from_orthogonal: U must be a square (d, d) matrix, got {tuple(orthogonal.shape)}."
            )
        layer = cls(orthogonal.shape[0], strategy=strategy).to(device=orthogonal.device, dtype=orthogonal.dtype)
        return layer.reset_orthogonal_(orthogonal)

    @property
    def represents_every_orthogonal(self) -> bool:
        """True for ``k = d`` reflections, which span the orthogonal group; fewer do not."""
        return self.k == self.d

    @torch.no_grad()
    def reset_orthogonal_(self, orthogonal: torch.Tensor) -> HouseholderProduct:
        """Set the ``k = d`` vectors in place so that the product equals ``U``. Returns ``self``."""
        check_orthogonal(orthogonal, self.d, "HouseholderProduct.reset_orthogonal_")
        if self.k != self.d:
            raise ValueError(
                f"HouseholderProduct.reset_orthogonal_: needs k = d = {self.d} reflections, this layer has k = {self.k}."
            )
        if self.vectors.is_meta:  # deferred initialisation: no values to compute (the shape is already right)
            return self
        vectors = householder_vectors(orthogonal.to(torch.float64)).to(self.vectors.dtype)
        self.vectors.copy_(vectors)
        return self

    def _normalised(self, dtype: torch.dtype) -> torch.Tensor:
        """``(k, d)`` unit vectors; a zero vector stays zero (``H(0) = I``) and a NaN vector stays NaN."""
        vectors = self.vectors.to(dtype)
        squared, defined = safe_squared_norm(torch.linalg.vecdot(vectors, vectors))
        return torch.where(defined.unsqueeze(-1), vectors * squared.rsqrt().unsqueeze(-1), 0.0)

    def _wy_factors(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, S)``: ``(k, d)`` unit vectors as rows and the ``(k, k)`` upper-triangular ``S``."""
        unit = self._normalised(dtype)
        eye = torch.eye(self.k, dtype=dtype, device=unit.device)
        return unit, torch.triu(unit @ unit.mT, diagonal=1) + 0.5 * eye

    def matrix(self) -> torch.Tensor:
        """``(d, d)``: the dense product ``Q = H(v_1) ... H(v_k)`` (float32 for half-precision vectors)."""
        dtype = torch.float32 if self.vectors.dtype in LOW_PRECISION else self.vectors.dtype
        if self.strategy == "sequential":
            eye = torch.eye(self.d, dtype=dtype, device=self.vectors.device)
            return self._sequential(eye).mT
        unit, s = self._wy_factors(dtype)
        eye = torch.eye(self.d, dtype=dtype, device=unit.device)
        return eye - unit.mT @ torch.linalg.solve_triangular(s, unit, upper=True)

    def _sequential(self, x: torch.Tensor) -> torch.Tensor:
        for v in self.vectors.to(x.dtype).flip(0):  # H(v_k) acts first
            x = reflect_unchecked(x, v)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d) -> (..., d)``: ``Q x`` for every row."""
        xc = prepare_input(x, self.d, self, name="x", layer="HouseholderProduct")
        dtype = xc.dtype
        if self._cached_matrix is not None:
            y = xc @ self._cached_matrix.to(dtype).mT
        elif self.strategy == "sequential":
            y = self._sequential(xc)
        else:
            y = self._wy_apply(xc)
        check_parameters_finite(
            y.detach().sum(-1), lambda: {"x": x, "vectors": self.vectors}, layer="HouseholderProduct"
        )
        return y.to(x.dtype)

    def _wy_apply(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.d
        unit, s = self._wy_factors(x.dtype)
        # Flops: factored k B (2d + k); materialised k d (k + 2d) + 2 B d^2. Take the cheaper one.
        if 2 * rows * self.d * self.d + self.k * self.d * (self.k + 2 * self.d) < self.k * rows * (2 * self.d + self.k):
            q = torch.eye(self.d, dtype=x.dtype, device=x.device) - unit.mT @ torch.linalg.solve_triangular(
                s, unit, upper=True
            )
            return x @ q.mT
        # y = Q x  =>  rows: Y = X Q^T = X - (X U^T) S^{-T} U.
        flat = x.reshape(-1, self.d)
        coefficients = torch.linalg.solve_triangular(s, (flat @ unit.mT).mT, upper=True).mT
        return (flat - coefficients @ unit).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"d={self.d}, k={self.k}, strategy={self.strategy!r}"


@torch.no_grad()
def householder_vectors(orthogonal: torch.Tensor) -> torch.Tensor:
    """``(d, d)`` rows ``v_1..v_d`` with ``H(v_1) ... H(v_d) = U`` for an orthogonal ``(d, d)`` ``U``.

    Rows may be zero (an identity factor) where a column is already in place.
    """
    d = orthogonal.shape[0]
    work = orthogonal.clone()
    vectors = torch.zeros_like(work)
    for j in range(d):
        column = work[j:, j]
        tail = torch.linalg.vector_norm(column[1:]) ** 2
        if j == d - 1:
            # The last column is +-e_d: reflect through e_d when it is -e_d.
            if column[0] < 0:
                vectors[j, j] = 1.0
        elif tail > 0 or column[0] < 0:
            v = column.clone()
            v[0] = -tail / (column[0] + 1.0) if column[0] > 0 else column[0] - 1.0
            vectors[j, j:] = v
        v = vectors[j, j:]
        vv = v @ v
        if vv > 0:
            work[j:, :] -= (2.0 / vv) * torch.outer(v, v @ work[j:, :])
    return vectors
