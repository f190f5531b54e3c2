"""The 16 orthonormal "binary" 2x2 cores ``G1 u G2`` of Rusu's orthogonal B-transforms: the symmetry group of
the regular octagon.

Index order (0-based ``k``): ``k = t - 1`` for the code's type ``t = 1..15`` of the table below, and the
identity last, ``k = 15`` (``IDENTITY_INDEX``). So ``k = 0..7`` is ``G1`` (entries ``+-2^{-1/2}``, the
45-degree rotations and reflections) and ``k = 8..15`` is ``G2`` (signed permutations, a subgroup with ``I``).
Each core is row-major ``[[a, c], [b, d]]`` in the notation of eq. (2): acting on the pair ``(x_i, x_j)`` it gives
``y_i = a x_i + c x_j`` and ``y_j = b x_i + d x_j``.

The tables below are computed from the matrices (not typed in) and checked by the tests: products of two
cores are cores (:data:`CORE_PRODUCT_TABLE`), every core has its inverse (its transpose) among them
(:data:`CORE_INVERSE`), and ``G2 G2 = G2``, ``G2 G1 = G1``.
"""

from __future__ import annotations

import math

import torch

from lightning_ortho.transforms.costs import OpCount, block_cost

_R = 1.0 / math.sqrt(2.0)

#: Number of binary cores.
NUM_BINARY_CORES = 16
#: Index of the identity core.
IDENTITY_INDEX = 15
#: Indices of G1 (scaled by 2^{-1/2}) and of G2 (signed permutations, identity included).
G1_INDICES = tuple(range(8))
G2_INDICES = tuple(range(8, 16))
#: Index of the swap ``[0 1; 1 0]`` (t = 14), which the author's code never selects (cost set to +inf).
SWAP_INDEX = 13

_TABLE = [
    [[-_R, _R], [_R, _R]],  # t=1  reflection
    [[_R, _R], [-_R, _R]],  # t=2  rotation -45
    [[_R, -_R], [_R, _R]],  # t=3  rotation +45
    [[_R, _R], [_R, -_R]],  # t=4  reflection (Haar / Hadamard butterfly)
    [[_R, -_R], [-_R, -_R]],  # t=5  reflection
    [[-_R, -_R], [_R, -_R]],  # t=6  rotation +135
    [[-_R, _R], [-_R, -_R]],  # t=7  rotation -135
    [[-_R, -_R], [-_R, _R]],  # t=8  reflection
    [[0.0, 1.0], [-1.0, 0.0]],  # t=9  rotation -90
    [[0.0, -1.0], [1.0, 0.0]],  # t=10 rotation +90
    [[1.0, 0.0], [0.0, -1.0]],  # t=11 reflection
    [[-1.0, 0.0], [0.0, 1.0]],  # t=12 reflection
    [[0.0, -1.0], [-1.0, 0.0]],  # t=13 reflection
    [[0.0, 1.0], [1.0, 0.0]],  # t=14 swap (disabled in the author's code)
    [[-1.0, 0.0], [0.0, -1.0]],  # t=15 -I
    [[1.0, 0.0], [0.0, 1.0]],  # identity
]


def binary_cores(dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``(16, 2, 2)`` tensor of binary cores in the documented index order (a fresh copy).

    Args:
        dtype: floating-point dtype of the result.
        device: device of the result (``None``: the default device).

    Raises:
        TypeError: ``dtype`` is not a floating-point dtype.
    """
    if not dtype.is_floating_point:
        raise TypeError(f"binary_cores: dtype must be floating point (entries are +-2^(-1/2)), got {dtype}.")
    return torch.tensor(_TABLE, dtype=torch.float64, device=device).to(dtype)


def _index_of(matrix: torch.Tensor, cores: torch.Tensor) -> int:
    distance = (cores - matrix).abs().amax(dim=(-2, -1))
    k = int(distance.argmin())
    if float(distance[k]) > 1e-12:  # pragma: no cover - the group is closed (tested)
        raise AssertionError("binary core product left the group")
    return k


def _tables() -> tuple[torch.Tensor, torch.Tensor]:
    cores = binary_cores()
    product = torch.empty(16, 16, dtype=torch.int64)
    for a in range(16):
        for b in range(16):
            product[a, b] = _index_of(cores[a] @ cores[b], cores)
    inverse = torch.tensor([_index_of(cores[k].T, cores) for k in range(16)], dtype=torch.int64)
    return product, inverse


#: ``CORE_PRODUCT_TABLE[a, b]`` is the index of ``cores[a] @ cores[b]`` (``(16, 16)`` ``int64``).
#: ``CORE_INVERSE[k]`` is the index of ``cores[k]^{-1} = cores[k]^T`` (``(16,)`` ``int64``).
CORE_PRODUCT_TABLE, CORE_INVERSE = _tables()
#: Indices of the cores that are their own inverse (the 8 reflections, ``-I`` and ``I``).
SELF_INVERSE_INDICES = tuple(int(k) for k in torch.nonzero(CORE_INVERSE == torch.arange(16)).flatten())


def binary_core_cost(index: int) -> OpCount:
    """Operations to apply core ``index`` to a pair: 2 additions + 2 multiplications (by ``2^{-1/2}``) for G1,
    nothing for G2 (signed permutations; negations are free, as the paper counts them).

    Raises:
        IndexError: ``index`` is not in ``0..15``.
    """
    if not isinstance(index, int) or not 0 <= index < NUM_BINARY_CORES:
        raise IndexError(f"binary_core_cost: index must be an int in 0..15, got {index!r}.")
    return block_cost(_TABLE[index])


#: Per-core operation counts, in index order.
BINARY_CORE_COSTS = tuple(binary_core_cost(k) for k in range(NUM_BINARY_CORES))
