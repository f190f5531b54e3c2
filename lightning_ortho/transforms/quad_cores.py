"""The 768 orthonormal 4x4 cores of Rusu's B-transforms with 4x4 blocks (B⊗_m-DLA), and products of such blocks.

Rusu ("Learning multiplication-free linear transformations", 2018, the 4x4 variant of the B-transforms) extends the
2x2 binary blocks of eq. (2) to blocks acting on four coordinates ``i < j < r < p``: the identity except on those
rows and columns, where it holds a 4x4 core ``H``. The cores are the 4x4 Hadamard matrices scaled by ``1/2``
(entries ``+-1/2``, ``H H^T = I``); they are also every orthonormal 4x4 matrix with entries in ``{0, +-1/2}`` (a unit
row of such entries has four nonzeros). Applying one costs 12 additions and 4 shifts (per output: 3 additions of
``+-x`` and one shift by ``1/2``), no multiplication.

Index order. Every core factors uniquely as ``H = diag(r) N_pi diag(c) / 2`` with

* ``N_pi`` a normalised Hadamard matrix (first row and column all ones): row 0 is the Walsh row ``w_0 = (1, 1, 1, 1)``
  and rows ``1, 2, 3`` are ``w_pi(1), w_pi(2), w_pi(3)`` for a permutation ``pi`` of ``(1, 2, 3)``, where
  ``w_1 = (1, -1, 1, -1)``, ``w_2 = (1, 1, -1, -1)``, ``w_3 = (1, -1, -1, 1)`` (Sylvester order, ``N_id = H_2 (x) H_2``);
* ``c`` a column sign vector with ``c_0 = +1`` (8 choices) and ``r`` a row sign vector (16 choices).

Core ``k = (16 * 8) * perm + 16 * e + row`` has ``pi = PERMUTATIONS[perm]`` (``itertools.permutations`` order, 6),
``c = COLUMN_SIGNS[e]`` and ``r = ROW_SIGNS[row]``; a sign vector's coordinate ``b`` is ``-1`` when bit ``b`` of its
index is set (``COLUMN_SIGNS[e]`` uses bits ``1..3`` of ``2 e``). ``6 * 8 * 16 = 768``. Core 0 is ``H_2 (x) H_2 / 2``.
The factorisation is what lets :mod:`~lightning_ortho.transforms.quad_cost_table` find the best of the 768 cores on
a quadruple with a few small products.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from lightning_ortho.nn._checks import check_features, check_finite
from lightning_ortho.transforms.costs import OpCount, row_cost

#: Number of 4x4 cores.
NUM_QUAD_CORES = 768
#: Walsh rows ``w_0..w_3`` (Sylvester order), ``(4, 4)`` float64.
WALSH_ROWS = torch.tensor([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64)
#: The 6 permutations ``pi`` of the Walsh rows ``1, 2, 3`` placed on rows ``1, 2, 3`` of ``N_pi``.
PERMUTATIONS = tuple(itertools.permutations((1, 2, 3)))


def _signs(index: int) -> list[float]:
    return [-1.0 if index >> b & 1 else 1.0 for b in range(4)]


#: Column sign vectors ``c`` with ``c_0 = +1`` (``(8, 4)`` float64) and row sign vectors ``r`` (``(16, 4)`` float64).
COLUMN_SIGNS = torch.tensor([_signs(2 * e) for e in range(8)], dtype=torch.float64)
ROW_SIGNS = torch.tensor([_signs(row) for row in range(16)], dtype=torch.float64)


def _table() -> torch.Tensor:
    normalised = torch.stack([WALSH_ROWS[[0, *pi]] for pi in PERMUTATIONS])  # (6, 4, 4)
    cores = ROW_SIGNS[None, None, :, :, None] * normalised[:, None, None] * COLUMN_SIGNS[None, :, None, None, :]
    return cores.reshape(NUM_QUAD_CORES, 4, 4) / 2


_TABLE = _table()


def quad_cores(dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``(768, 4, 4)`` cores in the documented index order (a fresh copy); entries ``+-1/2``, orthonormal.

    Raises:
        TypeError: ``dtype`` is not a floating-point dtype.
    """
    if not dtype.is_floating_point:
        raise TypeError(f"quad_cores: dtype must be floating point (entries are +-1/2), got {dtype}.")
    return _TABLE.to(device=device, dtype=dtype, copy=True)


def _transpose_table() -> torch.Tensor:
    position = {tuple(core.flatten().tolist()): k for k, core in enumerate(_TABLE)}
    return torch.tensor([position[tuple(core.T.flatten().tolist())] for core in _TABLE], dtype=torch.int64)


#: ``QUAD_CORE_TRANSPOSE[k]`` is the index of ``cores[k]^T = cores[k]^{-1}`` (``(768,)`` int64).
QUAD_CORE_TRANSPOSE = _transpose_table()


def quad_core_cost(index: int) -> OpCount:
    """Operations to apply core ``index`` to four coordinates: 12 additions + 4 shifts (each output row sums four
    ``+-x`` terms, 3 additions, and is halved once: the rules of :mod:`lightning_ortho.transforms.costs`).

    Raises:
        IndexError: ``index`` is not an int in ``0..767``.
    """
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < NUM_QUAD_CORES:
        raise IndexError(f"quad_core_cost: index must be an int in 0..767, got {index!r}.")
    total = OpCount()
    for row in _TABLE[index].tolist():
        total = total + row_cost(row)
    return total


def _check_quads(quads: object, n: int, where: str) -> torch.Tensor:
    if isinstance(quads, torch.Tensor):
        if quads.is_floating_point() or quads.is_complex() or quads.dtype == torch.bool:
            raise TypeError(f"{where}: quads must hold integers, got dtype {quads.dtype}.")
        tensor = quads.detach().to(device="cpu", dtype=torch.int64)
    else:
        try:
            tensor = torch.as_tensor(quads if len(quads) else torch.empty(0, 4), dtype=torch.int64)  # type: ignore[arg-type]
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{where}: quads must be an (m, 4) integer tensor or a list of (i, j, r, p).") from error
    if tensor.dim() != 2 or tensor.shape[1] != 4:
        raise ValueError(f"{where}: quads must have shape (m, 4), got {tuple(tensor.shape)}.")
    bad = ((tensor < 0) | (tensor >= n)).any(1) | (tensor.diff(dim=1) <= 0).any(1)
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{where}: quadruple {k} = {tuple(tensor[k].tolist())} must be increasing coordinates i < j < r < p in "
            f"0..{n - 1} (0-based)."
        )
    return tensor


def schedule_quad_layers(quads: torch.Tensor, n: int) -> torch.Tensor:
    """Layer of each block ``(m,)`` int64: one more than the latest earlier block sharing a coordinate (0-based), so
    blocks of one layer touch disjoint coordinates and the product order is kept."""
    last = [-1] * n
    layers = []
    for quad in quads.tolist():
        layer = max(last[a] for a in quad) + 1
        for a in quad:
            last[a] = layer
        layers.append(layer)
    return torch.tensor(layers, dtype=torch.int64)


class QuadBlockProduct(nn.Module):
    """A B-transform with 4x4 blocks, ``D = B_m ... B_1`` (block 0 acts first), ``B_k`` the identity except the core
    ``quad_cores()[core_index[k]]`` on rows and columns ``quads[k] = (i, j, r, p)``; orthonormal.

    Args:
        n: dimension (``>= 4``).
        quads: ``(m, 4)`` increasing 0-based coordinates per block; ``m = 0`` is the identity.
        core_index: ``(m,)`` indices into :func:`quad_cores`.
        dtype: dtype of the core buffer (default: torch's default dtype); inputs of other dtypes use the float64
            table cast to theirs.

    Shapes: ``forward(x)``: ``(..., n) -> (..., n)``, ``y = D x`` for every row (``x @ D^T``). Blocks are grouped into
    layers of disjoint quadruples (:func:`schedule_quad_layers`); one layer is one gather, one batched 4x4 product
    and one ``index_copy`` (differentiable in ``x``).

    Raises:
        ValueError: ``n < 4``; ``quads`` not ``(m, 4)`` increasing in range; ``core_index`` not ``(m,)`` in
            ``0..767``.
        TypeError: ``quads`` or ``core_index`` not integer.
    """

    def __init__(
        self,
        n: int,
        quads: torch.Tensor | Sequence[Sequence[int]],
        core_index: torch.Tensor | Sequence[int],
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(n, int) or isinstance(n, bool) or n < 4:
            raise ValueError(f"{name}: n must be an int >= 4 (a block acts on four coordinates), got {n!r}.")
        self.n = n
        quads = _check_quads(quads, n, name)
        index = torch.as_tensor(core_index) if len(core_index) else torch.empty(0, dtype=torch.int64)
        if index.is_floating_point() or index.dtype == torch.bool:
            raise TypeError(f"{name}: core_index must hold integers, got dtype {index.dtype}.")
        index = index.detach().to(device="cpu", dtype=torch.int64)
        if index.shape != (quads.shape[0],) or (index.numel() and not 0 <= int(index.min()) <= int(index.max()) < 768):
            raise ValueError(
                f"{name}: core_index must be ({quads.shape[0]},) indices in 0..767 (one per quadruple), got shape "
                f"{tuple(index.shape)}."
            )
        layer_of = schedule_quad_layers(quads, n)
        self.register_buffer("quads", quads)
        self.register_buffer("core_index", index)
        self.register_buffer("layer_of", layer_of)
        self.register_buffer("cores", quad_cores(dtype or torch.get_default_dtype())[index])

    @property
    def num_blocks(self) -> int:
        """``m``, the number of blocks."""
        return int(self.quads.shape[0])

    @property
    def num_layers(self) -> int:
        """Number of layers of disjoint blocks (the sequential depth of :meth:`forward`)."""
        return int(self.layer_of.max()) + 1 if self.num_blocks else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = D x`` for each row, ``(..., n) -> (..., n)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor.
            ValueError: ``x`` is not ``(..., n)`` or holds NaN/inf.
        """
        name = type(self).__name__
        check_features(x, self.n, name="x", layer=name)
        check_finite(x, name="x", layer=name)
        cores = quad_cores(torch.float64, self.core_index.device)[self.core_index].to(x.dtype)
        y = x
        for layer in range(self.num_layers):
            blocks = (self.layer_of == layer).nonzero().flatten()
            index = self.quads[blocks].flatten()
            gathered = y.index_select(-1, index).unflatten(-1, (blocks.numel(), 4))
            mixed = torch.einsum("...bj,bij->...bi", gathered, cores[blocks])
            y = y.index_copy(-1, index, mixed.flatten(-2))
        return y

    def matrix(self) -> torch.Tensor:
        """The dense ``(n, n)`` product ``D = B_m ... B_1`` in the core buffer's dtype."""
        eye = torch.eye(self.n, dtype=self.cores.dtype, device=self.cores.device)
        return self(eye).mT  # rows of forward(I) are columns of D

    def transpose(self) -> QuadBlockProduct:
        """``D^T = D^{-1} = B_1^T ... B_m^T`` as a new product (block order reversed, each core transposed)."""
        index = QUAD_CORE_TRANSPOSE.to(self.core_index.device)[self.core_index.flip(0)]
        return QuadBlockProduct(self.n, self.quads.flip(0), index, dtype=self.cores.dtype)

    def inverse(self) -> QuadBlockProduct:
        """Exact inverse, equal to :meth:`transpose` (the cores are orthonormal)."""
        return self.transpose()

    def op_count(self) -> OpCount:
        """Operations of one ``D x``: 12 additions + 4 shifts per block (:func:`quad_core_cost`)."""
        total = OpCount()
        for k in self.core_index.tolist():
            total = total + quad_core_cost(k)
        return total

    def extra_repr(self) -> str:
        return f"n={self.n}, blocks={self.num_blocks}, layers={self.num_layers}"
