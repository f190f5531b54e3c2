"""Products of 2x2 blocks on coordinate pairs: the one representation of B-, M-, shear- and O-transforms.

Rusu eqs. (2)-(3): ``R_ij`` is the identity except ``R(i,i) = a``, ``R(i,j) = c``, ``R(j,i) = b``,
``R(j,j) = d``; its core is ``[[a, c], [b, d]]``. A product of ``m`` blocks is

    R = R_{i_m j_m} ... R_{i_2 j_2} R_{i_1 j_1},

so block ``k = 0`` (the first row of ``pairs``) acts first on ``x``. B-transforms (eq. 11) have binary cores
(:class:`BinaryBlockProduct`), M-transforms (eq. 15) are ``q`` layers of ``n/2`` disjoint binary blocks, shears
(eq. 17) have cores ``[1 0; b 1]`` / ``[1 c; 0 1]`` and scalings ``[g 0; 0 1]``, O-transforms have cores
``sqrt(2) * G1``: all are a :class:`BlockProduct` with suitable cores.

Fast apply: at construction the blocks are scheduled into layers, each block in the earliest layer after every
earlier block that shares a coordinate with it (ASAP scheduling of the dependency chains; blocks in one layer
touch disjoint coordinates, and the number of layers is the longest chain of blocks that successively share a
coordinate, the minimum for any order-respecting schedule). One layer is ``y = w0 * x + w1 * x[partner]`` over the
whole vector, so the Python loop runs over layers, not blocks. Where autograd must record the product, a layer is
one ``index_select`` and one ``addcmul`` (batch-first). Where it need not (``torch.no_grad``, or neither ``x`` nor
the cores require gradients) and ``x`` is a float32/float64 CPU tensor of at least ``_BAG_MIN_ELEMENTS`` entries,
the batch is cut into chunks of about ``_CHUNK_ELEMENTS`` entries per thread, each chunk is transposed to
coordinate-major ``(n, rows)`` and every layer is applied to it as one ``torch.embedding_bag`` (mode ``sum``, bags
of two: ``w0[r] x[r] + w1[r] x[partner[r]]``, one fused pass that gathers whole rows) while the chunk stays in
cache; then it is transposed back. Both paths compute the same sums (the last bits may differ, as between two
orders of fused multiply-adds).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightning_ortho.nn._checks import check_features, check_finite, compute_dtype
from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.binary_cores import (
    BINARY_CORE_COSTS,
    CORE_INVERSE,
    G1_INDICES,
    NUM_BINARY_CORES,
    binary_cores,
)
from lightning_ortho.transforms.costs import OpCount, block_cost

#: Entries (rows x n) of one batch chunk of the no-grad CPU path per intra-op thread: 2^17 float32 = 512 KiB, small
#: enough to stay in a core's L2 cache through every layer (a chunk of ``threads`` times this is split among the
#: threads by each op). Smaller chunks pay the per-chunk calls more often and larger ones spill out of the cache:
#: both are slower, and so are no chunking and the batch-first gather + addcmul (much slower at large sizes).
_CHUNK_ELEMENTS = 1 << 17
#: Below this many entries of ``x`` the batch-first path is faster (its fixed cost is two fewer calls, which is what
#: counts for small inputs); above it the chunked path wins, by more the larger the batch.
_BAG_MIN_ELEMENTS = 8192


class SingularBlockError(ValueError):
    """A block of a product is singular, so the product has no inverse."""


def _check_n(n: object, where: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"{where}: n must be an integer >= 2 (the dimension the blocks act on), got {n!r}.")
    return n


def _check_pairs(pairs: object, n: int, where: str) -> torch.Tensor:
    if isinstance(pairs, torch.Tensor):
        if pairs.is_floating_point() or pairs.is_complex() or pairs.dtype == torch.bool:
            raise TypeError(f"{where}: pairs must hold integers, got dtype {pairs.dtype}.")
        tensor = pairs.detach().to(device="cpu", dtype=torch.int64)
    else:
        try:
            tensor = torch.as_tensor(pairs if len(pairs) else torch.empty(0, 2), dtype=torch.int64)  # type: ignore[arg-type]
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{where}: pairs must be an (m, 2) integer tensor or a list of (i, j) pairs.") from error
    if tensor.dim() != 2 or tensor.shape[1] != 2:
        raise ValueError(f"{where}: pairs must have shape (m, 2), got {tuple(tensor.shape)}.")
    if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= n):
        bad = int(torch.nonzero((tensor < 0) | (tensor >= n))[0, 0])
        raise ValueError(
            f"{where}: pair {bad} = {tuple(tensor[bad].tolist())} is out of range for n = {n}; coordinates are "
            f"0-based in 0..{n - 1}."
        )
    same = torch.nonzero(tensor[:, 0] == tensor[:, 1]).flatten()
    if same.numel():
        k = int(same[0])
        raise ValueError(
            f"{where}: pair {k} = {tuple(tensor[k].tolist())} has i == j; a 2x2 block needs two different "
            f"coordinates (for a scaling of coordinate i alone use the core [[g, 0], [0, 1]] on any pair (i, j))."
        )
    return tensor


def schedule_layers(pairs: torch.Tensor, n: int) -> torch.Tensor:
    """Layer of each block, ``(m,)`` ``int64``: ``layer[k] = 1 + max(layer of the earlier blocks sharing i_k or j_k)``,
    0-based. Blocks in one layer touch disjoint coordinates; the layer count is minimal among schedules that keep
    every pair of coordinate-sharing blocks in product order."""
    last = [-1] * n
    layers = []
    for i, j in pairs.tolist():
        layer = max(last[i], last[j]) + 1
        last[i] = last[j] = layer
        layers.append(layer)
    return torch.tensor(layers, dtype=torch.int64)


def embed_block(n: int, i: int, j: int, core: torch.Tensor) -> torch.Tensor:
    """Dense ``(n, n)`` matrix ``R_ij`` of eq. (2): the identity with ``core = [[a, c], [b, d]]`` at rows/columns
    ``(i, j)``. Differentiable in ``core``; dtype and device of ``core``."""
    matrix = torch.eye(n, dtype=core.dtype, device=core.device)
    index = torch.tensor([i, j], device=core.device)
    return matrix.index_put((index[:, None], index[None, :]), core)


class BlockProduct(nn.Module):
    """A product of ``m`` 2x2 blocks, ``R = R_{i_m j_m} ... R_{i_1 j_1}`` (Rusu eqs. 2-3), applied batch-first.

    Args:
        n: dimension (``>= 2``).
        pairs: ``(m, 2)`` integer coordinates ``(i_k, j_k)``, 0-based, ``i_k != j_k``; row 0 acts first.
            ``m = 0`` is the identity.
        blocks: ``(m, 2, 2)`` cores ``[[a, c], [b, d]]`` (``y_i = a x_i + c x_j``, ``y_j = b x_i + d x_j``);
            ``None`` starts every block at the identity.
        trainable: the cores are an ``nn.Parameter`` ``blocks`` (default) or a buffer.
        dtype: dtype of the cores when ``blocks`` is ``None`` (default: torch's default dtype).

    ``pairs`` and the layer schedule are buffers (``pairs``, ``layer_of``, ``partner``) and follow ``.to(device)``.

    Shapes: ``forward(x)``: ``(..., n) -> (..., n)``, ``y = R x`` for every row ``x`` (i.e. ``x @ R.T``).

    Raises:
        ValueError: ``n`` is not an integer ``>= 2``; ``pairs`` is not ``(m, 2)``, out of range or has ``i == j``;
            ``blocks`` is not ``(m, 2, 2)`` or not finite.
        TypeError: ``pairs`` is not integer, or ``blocks`` not floating point.
    """

    def __init__(
        self,
        n: int,
        pairs: torch.Tensor | Sequence[Sequence[int]],
        blocks: torch.Tensor | None = None,
        *,
        trainable: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.n = _check_n(n, name)
        pairs = _check_pairs(pairs, self.n, name)
        m = pairs.shape[0]
        if blocks is None:
            blocks = torch.eye(2, dtype=dtype or torch.get_default_dtype()).expand(m, 2, 2).clone()
        elif not isinstance(blocks, torch.Tensor) or not blocks.is_floating_point():
            raise TypeError(
                f"{name}: blocks must be a floating-point tensor of shape ({m}, 2, 2), got {not_floating(blocks)}."
            )
        else:
            blocks = blocks.detach().clone()
            if dtype is not None:
                blocks = blocks.to(dtype)
        if blocks.shape != (m, 2, 2):
            raise ValueError(f"{name}: blocks must have shape ({m}, 2, 2) for {m} pairs, got {tuple(blocks.shape)}.")
        check_finite(blocks, name="blocks", layer=name)
        self.trainable = bool(trainable)
        if self.trainable:
            self.blocks = nn.Parameter(blocks)
        else:
            self.register_buffer("blocks", blocks)
        layer_of = schedule_layers(pairs, self.n)
        num_layers = int(layer_of.max()) + 1 if m else 0
        partner = torch.arange(self.n).repeat(num_layers, 1)
        if m:
            partner[layer_of, pairs[:, 0]] = pairs[:, 1]
            partner[layer_of, pairs[:, 1]] = pairs[:, 0]
        device = blocks.device
        self.register_buffer("pairs", pairs.to(device))
        self.register_buffer("layer_of", layer_of.to(device))
        self.register_buffer("partner", partner.to(device))

    # ----------------------------------------------------------------------------------------------- structure
    @property
    def num_blocks(self) -> int:
        """``m``, the number of blocks."""
        return int(self.pairs.shape[0])

    @property
    def num_layers(self) -> int:
        """Number of layers of disjoint blocks (the sequential depth of :meth:`forward`)."""
        return int(self.partner.shape[0])

    def layers(self) -> list[torch.Tensor]:
        """Block indices of each layer, in application order (each a 1-D ``int64`` tensor, increasing)."""
        return [torch.nonzero(self.layer_of == layer).flatten() for layer in range(self.num_layers)]

    def cores(self) -> torch.Tensor:
        """The ``(m, 2, 2)`` cores (the parameter itself when trainable)."""
        return self.blocks

    # ------------------------------------------------------------------------------------------------- apply
    def _layer_weights(self, cores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``w0, w1`` of shape ``(L, n)`` with ``y = w0 * x + w1 * x[partner]`` per layer (differentiable)."""
        count = self.num_layers * self.n
        i = self.layer_of * self.n + self.pairs[:, 0]
        j = self.layer_of * self.n + self.pairs[:, 1]
        index = torch.cat([i, j])
        w0 = torch.ones(count, dtype=cores.dtype, device=cores.device).scatter(
            0, index, torch.cat([cores[:, 0, 0], cores[:, 1, 1]])
        )
        w1 = torch.zeros(count, dtype=cores.dtype, device=cores.device).scatter(
            0, index, torch.cat([cores[:, 0, 1], cores[:, 1, 0]])
        )
        return w0.view(self.num_layers, self.n), w1.view(self.num_layers, self.n)

    def _apply_cores(self, x: torch.Tensor, cores: torch.Tensor) -> torch.Tensor:
        if self.num_layers == 0:
            return x
        w0, w1 = self._layer_weights(cores)
        records = torch.is_grad_enabled() and (x.requires_grad or w0.requires_grad)
        if (
            not records
            and x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.float64)
            and w0.dtype == x.dtype
            and x.numel() >= _BAG_MIN_ELEMENTS
        ):
            return self._apply_bags(x, w0, w1)
        y = x
        for layer in range(self.num_layers):
            y = torch.addcmul(y * w0[layer], y.index_select(-1, self.partner[layer]), w1[layer])
        return y

    def _apply_bags(self, x: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
        """The no-grad CPU path of :meth:`_apply_cores`: chunks of rows, coordinate-major, one ``embedding_bag``
        per layer (see the module docstring). ``x`` ``(..., n)``; returns a new contiguous ``(..., n)`` tensor."""
        n, layers = self.n, self.num_layers
        rows = torch.arange(n, device=x.device).expand(layers, n)
        index = torch.stack([rows, self.partner], -1).reshape(layers, 2 * n).unbind()  # bag r: (r, partner[l, r])
        weights = torch.stack([w0, w1], -1).reshape(layers, 2 * n).unbind()
        offsets = torch.arange(0, 2 * n, 2, device=x.device)
        flat = x.reshape(-1, n)
        out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
        step = max(1, _CHUNK_ELEMENTS * max(1, torch.get_num_threads()) // n)
        for start in range(0, flat.shape[0], step):
            state = flat[start : start + step].T.contiguous()  # (n, rows): a layer gathers whole rows
            for bags, bag_weights in zip(index, weights, strict=True):
                # aten's embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode=0 (sum), sparse,
                # per_sample_weights, include_last_offset, padding_idx=None)
                state, *_ = torch.embedding_bag(state, bags, offsets, False, 0, False, bag_weights, False, None)
            out[start : start + step] = state.T
        return out.view(x.shape)

    def _prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        name = type(self).__name__
        check_features(x, self.n, name="x", layer=name)
        check_finite(x, name="x", layer=name)
        dtype = compute_dtype(x, self.blocks.dtype if self.trainable else None, layer=name)
        return x.to(dtype), self._cores_as(dtype)

    def _cores_as(self, dtype: torch.dtype) -> torch.Tensor:
        return self.cores().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = R x`` for each row: ``(..., n) -> (..., n)``, layer by layer (see the module docstring).

        Raises:
            TypeError: ``x`` is not a floating-point tensor, or its dtype differs from trainable cores' dtype.
            ValueError: ``x`` is not ``(..., n)``, or holds NaN/inf.
        """
        x, cores = self._prepare(x)
        return self._apply_cores(x, cores)

    def matrix(self) -> torch.Tensor:
        """The dense ``(n, n)`` product ``R = R_{i_m j_m} ... R_{i_1 j_1}`` (differentiable in the cores)."""
        cores = self.cores()
        eye = torch.eye(self.n, dtype=cores.dtype, device=cores.device)
        return self._apply_cores(eye, cores).mT  # rows of forward(I) are columns of R

    # ----------------------------------------------------------------------------------------------- algebra
    def _rebuilt(self, pairs: torch.Tensor, cores: torch.Tensor) -> BlockProduct:
        return BlockProduct(self.n, pairs, cores, trainable=self.trainable)

    def transpose(self) -> BlockProduct:
        """``R^T = R_{i_1 j_1}^T ... R_{i_m j_m}^T`` as a new product (block order reversed, cores transposed;
        a copy, detached from this module's parameters)."""
        return self._rebuilt(self.pairs.flip(0), self.cores().detach().flip(0).mT)

    def inverse(self) -> BlockProduct:
        """``R^{-1} = R_{i_1 j_1}^{-1} ... R_{i_m j_m}^{-1}`` as a new product; each core inverted in closed form,
        ``[[a, c], [b, d]]^{-1} = [[d, -c], [-b, a]] / (ad - bc)`` (computed in float64, detached copy).

        Raises:
            SingularBlockError: a core has ``|ad - bc| <= 8 eps max(|entries|)^2`` (eps of the cores' dtype); the
                message names the block.
        """
        cores = self.cores().detach()
        wide = cores.double()
        a, c, b, d = wide[:, 0, 0], wide[:, 0, 1], wide[:, 1, 0], wide[:, 1, 1]
        det = a * d - b * c
        scale = wide.abs().amax(dim=(-2, -1)).clamp_min(torch.finfo(torch.float64).tiny)
        singular = torch.nonzero(det.abs() <= 8 * torch.finfo(cores.dtype).eps * scale**2).flatten()
        if singular.numel():
            k = int(singular[0])
            raise SingularBlockError(
                f"{type(self).__name__}.inverse: block {k} on pair {tuple(self.pairs[k].tolist())} is singular "
                f"(core {cores[k].tolist()}, det {float(det[k]):.3e}), so the product has no inverse. Keep the "
                f"cores invertible (e.g. shears, rotations, binary cores) or remove that block."
            )
        inverse = torch.stack([torch.stack([d, -c], -1), torch.stack([-b, a], -1)], -2) / det[:, None, None]
        return self._rebuilt(self.pairs.flip(0), inverse.flip(0).to(cores.dtype))

    # ------------------------------------------------------------------------------------------------- costs
    def op_count(self, terms: int | None = None) -> OpCount:
        """Additions, multiplications and shifts of one ``R x`` (rules of :mod:`lightning_ortho.transforms.costs`).

        ``terms=None``: ``+-1`` and ``0`` free, powers of two one shift, other multipliers one multiplication (a
        row whose nonzeros share one magnitude pays it once). ``terms=p``: entries must lie in ``R_p`` and each
        costs its greedy SOPOT terms as shifts plus ``terms - 1`` additions.

        Raises:
            ValueError: ``terms=p`` and an entry is not an exact sum of at most ``p`` signed powers of two.
        """
        total = OpCount()
        for core in self.cores().detach().double().cpu().tolist():
            total = total + block_cost(core, terms)
        return total

    def extra_repr(self) -> str:
        return f"n={self.n}, blocks={self.num_blocks}, layers={self.num_layers}, trainable={self.trainable}"


class BinaryBlockProduct(BlockProduct):
    """A B-transform (Rusu eq. 11): a :class:`BlockProduct` whose cores are fixed binary cores.

    Args:
        n: dimension (``>= 2``), as :class:`BlockProduct`.
        pairs: ``(m, 2)`` integer coordinates ``(i_k, j_k)`` of the blocks, as :class:`BlockProduct`.
        core_index: ``(m,)`` indices into :func:`~lightning_ortho.transforms.binary_cores.binary_cores`
            (0..15, the type ``t - 1`` of :mod:`binary_cores`; 15 is the identity). Kept as the buffer ``core_index``.
        dtype: dtype of the (fixed, non-trainable) core buffer; inputs of other dtypes use cores cast to theirs.

    :meth:`transpose` and :meth:`inverse` (equal, the product is orthonormal) stay binary via the inverse table;
    :meth:`op_count` uses the per-core counts (2 additions + 2 multiplications per G1 block, 0 per G2 block).

    Raises:
        ValueError: as :class:`BlockProduct`, or ``core_index`` is not ``(m,)`` in ``0..15``.
    """

    def __init__(
        self,
        n: int,
        pairs: torch.Tensor | Sequence[Sequence[int]],
        core_index: torch.Tensor | Sequence[int],
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        # An empty list (no blocks: the identity) has no element to infer an integer dtype from.
        index = torch.as_tensor(core_index) if len(core_index) else torch.empty(0, dtype=torch.int64)
        if index.is_floating_point() or index.dtype == torch.bool:
            raise TypeError(f"BinaryBlockProduct: core_index must hold integers, got dtype {index.dtype}.")
        index = index.detach().to(device="cpu", dtype=torch.int64)
        if index.dim() != 1 or (index.numel() and (int(index.min()) < 0 or int(index.max()) >= NUM_BINARY_CORES)):
            raise ValueError(
                f"BinaryBlockProduct: core_index must be a 1-D tensor of indices in 0..15 (one per pair), got "
                f"shape {tuple(index.shape)} with values {index.tolist()[:8]}."
            )
        cores = binary_cores(dtype or torch.get_default_dtype())[index]
        if cores.shape[0] != len(pairs):
            raise ValueError(f"BinaryBlockProduct: got {len(pairs)} pairs but {cores.shape[0]} core indices.")
        super().__init__(n, pairs, cores, trainable=False)
        self.register_buffer("core_index", index.to(self.blocks.device))

    def _cores_as(self, dtype: torch.dtype) -> torch.Tensor:
        # Rebuilt from the float64 table, so a float32 module applied to float64 input keeps full precision.
        return binary_cores(torch.float64, self.core_index.device)[self.core_index].to(dtype)

    def _rebuilt_binary(self, pairs: torch.Tensor, index: torch.Tensor) -> BinaryBlockProduct:
        return BinaryBlockProduct(self.n, pairs, index, dtype=self.blocks.dtype)

    def transpose(self) -> BinaryBlockProduct:
        """``R^T`` as a binary product: the blocks in reverse order, each core replaced by its transpose (through
        the inverse table, as the cores are orthonormal), so it stays multiplication-free like ``R``."""
        return self._rebuilt_binary(
            self.pairs.flip(0), CORE_INVERSE.to(self.core_index.device)[self.core_index.flip(0)]
        )

    def inverse(self) -> BinaryBlockProduct:
        """Exact inverse ``R^{-1} = R^T`` (binary cores are orthonormal and never singular)."""
        return self.transpose()

    def op_count(self, terms: int | None = None, *, defer_scaling: bool = False) -> OpCount:
        """Operations of one ``R x`` (``terms`` is ignored: the cores are ``+-1`` or ``+-2^{-1/2}``).

        ``defer_scaling=False``: per-core counts, 2 additions + 2 multiplications per G1 block (``B`` with ``m = 32``
        G1 blocks: 64 + 64, as in Rusu's experiments). ``defer_scaling=True``: a G1 core is ``2^{-1/2}`` times a ``+-1``
        matrix, and the factor is carried along per coordinate instead of applied (Rusu, Algorithm 3, ``M = 2^{-q/2}
        prod M_l``): a G1 block costs 2 additions when both coordinates carry the same pending power ``e`` of
        ``2^{-1/2}``; otherwise the lower one is first brought level (1 multiplication, or 1 shift when the
        difference is even). G2 blocks move the pending powers with the coordinates. At the end each coordinate
        with ``e > 0`` pays 1 multiplication (1 shift when ``e`` is even). An M-transform of ``q`` perfect-matching
        stages then costs ``nq`` additions and ``n`` multiplications (shifts for even ``q``), as the paper counts.
        """
        if not defer_scaling:
            total = OpCount()
            for k in self.core_index.tolist():
                total = total + BINARY_CORE_COSTS[k]
            return total
        pending = [0] * self.n
        total = OpCount()
        cores = binary_cores(torch.float64)
        for (i, j), k in zip(self.pairs.tolist(), self.core_index.tolist(), strict=True):
            if k in G1_INDICES:
                if pending[i] != pending[j]:
                    difference = abs(pending[i] - pending[j])
                    total = total + (OpCount(shifts=1) if difference % 2 == 0 else OpCount(multiplications=1))
                level = max(pending[i], pending[j]) + 1
                pending[i] = pending[j] = level
                total = total + OpCount(additions=2)
            elif float(cores[k, 0, 0]) == 0.0:  # an (anti-diagonal) signed swap moves the pending powers along
                pending[i], pending[j] = pending[j], pending[i]
        for e in pending:
            if e > 0:
                total = total + (OpCount(shifts=1) if e % 2 == 0 else OpCount(multiplications=1))
        return total


def frozen_transform(transform: BlockProduct) -> BlockProduct:
    """A non-trainable copy of ``transform`` (binary products stay binary)."""
    if not isinstance(transform, BlockProduct):
        raise TypeError(f"frozen_transform: transform must be a BlockProduct, got {type(transform).__name__}.")
    if isinstance(transform, BinaryBlockProduct):
        copy = BinaryBlockProduct(
            transform.n, transform.pairs.cpu(), transform.core_index.cpu(), dtype=transform.blocks.dtype
        )
    else:
        copy = BlockProduct(transform.n, transform.pairs.cpu(), transform.blocks.detach().cpu(), trainable=False)
    return copy.to(transform.blocks.device)
