"""O-transforms (Rusu's unnormalised O-transforms): products of unnormalised binary blocks, integer matrices at 2 additions a block.

``O_ij`` is eq. (2) with the core ``O~ = sqrt(2) G~`` for ``G~`` in G1 (spec t = 1..8): entries ``+-1`` with
orthogonal rows, ``O~^T O~ = 2 I``, ``det O~ = +-2``. A product ``O = O_{i_m j_m} ... O_{i_1 j_1}`` has integer
entries and ``det O = +-2^m``; applying one block costs 2 additions and nothing else (signs are free). ``O`` is not
orthogonal, so B_m-DLA's exact block update (eq. 12) does not apply to it; :func:`o_block_change` gives the exact
change of ``||Y - X O^T||^2`` for one block instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lightning_ortho.transforms.binary_cores import G1_INDICES, binary_cores
from lightning_ortho.transforms.blocks import BlockProduct


def o_cores(core_index: torch.Tensor | Sequence[int], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The ``(m, 2, 2)`` cores ``sqrt(2) G~`` (entries exactly ``+-1``) for G1 indices ``0..7`` (spec ``t - 1``).

    Raises:
        ValueError: an index is not in G1 (``0..7``).
    """
    index = torch.as_tensor(core_index, dtype=torch.int64) if len(core_index) else torch.empty(0, dtype=torch.int64)
    if index.dim() != 1 or (index.numel() and (int(index.min()) < 0 or int(index.max()) > max(G1_INDICES))):
        raise ValueError(
            f"o_cores: core indices must be G1 indices 0..7 (types t = 1..8 of binary_cores; only G1 cores scale to +-1 "
            f"entries), got {index.tolist()[:8]}."
        )
    # sqrt(2) * (+-2^{-1/2}) rounds to +-1 up to one ulp; round so the cores are exactly the integer matrices.
    return (math.sqrt(2.0) * binary_cores(torch.float64)[index]).round().to(dtype)


def o_transform(
    n: int, pairs: torch.Tensor | Sequence[Sequence[int]], core_index: torch.Tensor | Sequence[int], **kwargs
) -> BlockProduct:
    """An O-transform as a (non-trainable) :class:`BlockProduct`: ``forward``, ``matrix()`` (integer entries),
    ``inverse()`` (exact: every core's inverse is ``O~^T / 2``), ``op_count()`` (2 additions a block).

    Raises as :func:`o_cores` and :class:`BlockProduct`.

    Args:
        n: dimension, as :class:`BlockProduct`.
        pairs: ``(m, 2)`` coordinates of the blocks, as :class:`BlockProduct`.
        core_index: ``(m,)`` indices of the O-cores (:func:`o_cores`).
        **kwargs: passed to :class:`BlockProduct` (``dtype``).
    """
    return BlockProduct(n, pairs, o_cores(core_index, kwargs.pop("dtype", torch.float64)), trainable=False, **kwargs)


def o_block_change(z: torch.Tensor, code_energy: torch.Tensor, i: int, j: int, core: torch.Tensor) -> torch.Tensor:
    """Exact ``||Y - X O_ij^T||^2 - ||Y - X||^2`` for one unnormalised block (derived from Rusu's O-transform update):

        Delta_ij(O~) = ||x_i||^2 + ||x_j||^2 - 2 sum_{a, b in {i, j}} (O~ - I)_ab Z_ab,

    with ``Z = Y^T X`` ``(n, n)`` (batch-first ``Y``, ``X`` ``(N, n)``), ``code_energy`` the per-coordinate
    ``||x_a||^2`` ``(n,)`` (the diagonal of ``X^T X``) and ``core`` a ``(2, 2)`` ``+-1`` core with orthogonal rows
    (its cross term vanishes because ``O~^T O~ = 2 I``).
    """
    index = [i, j]
    difference = core.to(z.dtype) - torch.eye(2, dtype=z.dtype, device=z.device)
    return code_energy[i] + code_energy[j] - 2 * (difference * z[index][:, index]).sum()
