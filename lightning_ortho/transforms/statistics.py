"""Sufficient statistics of the transform learners, and the protocol that lets them learn from a stream of batches.

Every alternation of the paper's learners (Algorithms 2 and 3, the S-DLA sweep) touches the data only through
sums over samples. With batch-first data ``Y`` ``(N, n)`` and codes ``X`` ``(N, n)`` (``Y ~ X D^T``) they are

    gram        = Y^T Y        (n, n)   the principal directions for the SVD initialisation,
    cross       = Y^T X        (n, n)   the paper's Z = Y_p X_p^T (eq. 9),
    code_gram   = X^T X        (n, n)   the paper's W = X_p X_p^T (shears and O-transforms),
    data_energy = ||Y||_F^2,   code_energy = ||X||_F^2,   count = N.

Sums over disjoint batches (or processes) add up, so a learner can stream its data once per alternation,
accumulate :class:`TransformStatistics` batch by batch, all-reduce them across processes and update the transform
at the end: the result is the same as with all the data in memory, up to the order of floating-point additions.
The in-memory learners (:func:`~lightning_ortho.transforms.learn_b_transform` and friends) are this loop over one
batch (:func:`fit_in_memory`), so both routes run the same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

#: Dtype of the accumulated sums (the alternations compare costs that differ in the last digits of float32).
STATISTICS_DTYPE = torch.float64
#: Features of larger magnitude than ``2**MAX_EXPONENT`` (about 1e120) or nonzero and smaller than its inverse would
#: push sums of squares out of float64's normal range (overflow to inf, or into denormals that lose the digits the
#: alternations compare).
MAX_EXPONENT = 400


@dataclass
class TransformStatistics:
    """Running sums of one alternation (see the module docstring); all float64 tensors on one device.

    ``gram`` is accumulated only when ``with_gram``; ``cross``/``code_gram``/``code_energy`` only for batches that
    carry codes. Use :meth:`zeros`, :meth:`add` per batch, :meth:`all_reduce` across processes.
    """

    gram: torch.Tensor
    cross: torch.Tensor
    code_gram: torch.Tensor
    data_energy: torch.Tensor
    code_energy: torch.Tensor
    count: torch.Tensor

    @classmethod
    def zeros(cls, n: int, device: torch.device | str | None = None) -> TransformStatistics:
        """Empty sums for ``n`` features."""
        square = {"dtype": STATISTICS_DTYPE, "device": device}
        return cls(
            gram=torch.zeros(n, n, **square),
            cross=torch.zeros(n, n, **square),
            code_gram=torch.zeros(n, n, **square),
            data_energy=torch.zeros((), **square),
            code_energy=torch.zeros((), **square),
            count=torch.zeros((), **square),
        )

    @property
    def n(self) -> int:
        """The number of features ``n`` (the side of the ``(n, n)`` sums)."""
        return int(self.gram.shape[0])

    def add(self, data: torch.Tensor, codes: torch.Tensor | None, *, with_gram: bool = False) -> None:
        """Add one batch: ``data`` ``(B, n)`` and its ``codes`` ``(B, n)`` (``None`` while no transform exists).

        Raises:
            ValueError: shapes are not ``(B, n)`` with this ``n``, or ``data``/``codes`` hold NaN/inf (a clear
                message instead of statistics that silently turn every later transform into NaN).
        """
        if data.dim() != 2 or data.shape[1] != self.n:
            raise ValueError(f"TransformStatistics.add: data must be (B, {self.n}), got {tuple(data.shape)}.")
        y = data.detach().to(device=self.gram.device, dtype=STATISTICS_DTYPE)
        if not bool(torch.isfinite(y).all()):
            raise ValueError(
                "TransformStatistics.add: a batch holds NaN or inf features; clean the data module's output "
                "(or its normalisation) before learning a transform."
            )
        largest = float(y.abs().max()) if y.numel() else 0.0
        if largest > 2.0**MAX_EXPONENT or 0 < largest < 2.0**-MAX_EXPONENT:
            raise ValueError(
                f"TransformStatistics.add: features of magnitude {largest:.3g} would overflow or underflow the float64 "
                f"sums of squares; rescale the features (e.g. standardise them): the learned transform does not "
                f"depend on their scale."
            )
        self.data_energy += y.square().sum()
        self.count += y.shape[0]
        if with_gram:
            self.gram += y.T @ y
        if codes is None:
            return
        if codes.shape != data.shape:
            raise ValueError(
                f"TransformStatistics.add: codes must have the data's shape {tuple(data.shape)}, got "
                f"{tuple(codes.shape)}."
            )
        x = codes.detach().to(device=self.gram.device, dtype=STATISTICS_DTYPE)
        if not bool(torch.isfinite(x).all()):
            raise ValueError("TransformStatistics.add: the codes hold NaN or inf (the transform is not finite).")
        self.cross += y.T @ x
        self.code_gram += x.T @ x
        self.code_energy += x.square().sum()

    def all_reduce(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every sum by ``reduce_sum`` of it (e.g. a DDP all-reduce); all sums travel in one tensor."""
        parts = [getattr(self, f.name) for f in fields(self)]
        flat = reduce_sum(torch.cat([p.reshape(-1) for p in parts]))
        offset = 0
        for f, part in zip(fields(self), parts, strict=True):
            size = part.numel()
            setattr(self, f.name, flat[offset : offset + size].view_as(part).clone())
            offset += size

    def error(self, dictionary: torch.Tensor) -> float:
        """``100 ||Y - X D^T||_F^2 / ||Y||_F^2`` from the sums: ``||Y||^2 - 2 tr(D^T Z) + tr(D W D^T)``, for any
        ``(n, n)`` dictionary ``D`` (orthonormal or not).

        Raises:
            ValueError: ``||Y||^2 = 0`` (no data, or only zeros): the relative error is undefined.
        """
        if float(self.data_energy) <= 0:
            raise ValueError(
                "TransformStatistics.error: every feature of the pass is zero, so the relative error "
                "100 ||Y - X D^T||^2 / ||Y||^2 is undefined and no transform can be learned; check the data (e.g. "
                "patches of a flat image with their mean removed are all zero)."
            )
        d = dictionary.to(device=self.cross.device, dtype=STATISTICS_DTYPE)
        residual = self.data_energy - 2 * (d * self.cross).sum() + ((d @ self.code_gram) * d).sum()
        return float(100 * residual / self.data_energy)


def principal_basis(gram: torch.Tensor) -> torch.Tensor:
    """The paper's SVD initialisation from ``gram = Y^T Y``: the right singular vectors of batch-first ``Y``
    (the paper's ``U``) as the columns of an ``(n, n)`` orthonormal matrix, by decreasing singular value.

    Made deterministic, so every process and every route (streamed or in memory) starts from the same basis:
    ``torch.linalg.eigh`` in float64, columns sorted by decreasing eigenvalue, each column's sign fixed so its
    entry of largest magnitude is positive; magnitudes within a relative ``1e-6`` of the largest are ties, won by
    the first entry (an antisymmetric vector of mirror-symmetric data has two equal largest entries of opposite
    signs, and an exact argmax let BLAS rounding choose the sign). Eigenvalues that are (nearly) equal leave their
    eigenvectors undetermined; the basis is then only as deterministic as ``eigh``.
    """
    values, vectors = torch.linalg.eigh(gram.to(STATISTICS_DTYPE))
    vectors = vectors[:, values.argsort(descending=True, stable=True)]
    magnitude = vectors.abs()
    pivot = (magnitude >= magnitude.amax(dim=0) * (1 - 1e-6)).to(torch.int8).argmax(dim=0)  # first tied entry
    signs = torch.sign(vectors[pivot, torch.arange(vectors.shape[1], device=vectors.device)])
    return vectors * torch.where(signs == 0, torch.ones_like(signs), signs)


class TransformLearner(Protocol):
    """One alternation per pass over the data (the protocol the Lightning module and :func:`fit_in_memory` drive).

    Per pass: ``encode(y)`` for every batch (the codes of this pass; ``None`` would mean none are needed), the sums
    collected in :class:`TransformStatistics` (with ``gram`` when ``needs_gram``), then ``update(statistics)``
    once, which returns the error of the pass's codes under the transform that produced them (percent; ``None``
    when the pass had no codes) and sets ``finished`` when the algorithm has stopped. ``code(y)`` gives the best codes under
    the current transform (for validation), ``dictionary()`` its dense float64 ``(n, n)`` matrix, ``transform()``
    the fast product and ``op_count()`` its operation count as the paper counts it for the family.
    """

    n: int
    finished: bool

    @property
    def needs_gram(self) -> bool:
        """Whether this pass must accumulate ``gram = Y^T Y`` (``TransformStatistics.add(..., with_gram=True)``):
        true until a pass has given the principal basis, the SVD initialisation."""

    def encode(self, data: torch.Tensor) -> torch.Tensor | None:
        """The codes of one batch for this pass, to accumulate with it in :class:`TransformStatistics`.

        Which codes depends on the pass: ``T_s(Y)`` (the ``s`` entries of largest magnitude of each row) before
        any transform, ``T_s(Y V)`` in the principal basis ``V`` for the greedy initialisation, then the codes
        under the current transform ``D``. Unlike :meth:`code`, these are the codes the next :meth:`update`
        needs, not necessarily the best ones under ``D``.

        Args:
            data: ``(B, n)`` a batch of samples, batch-first.

        Returns:
            ``(B, n)`` float64 codes, or ``None`` when this pass needs none (then only ``data`` is added).
        """

    def code(self, data: torch.Tensor) -> torch.Tensor:
        """The best ``s``-sparse codes of a batch under the current transform ``D`` (for validation and
        prediction): ``X`` with ``Y ~ X D^T``.

        Args:
            data: ``(B, n)`` samples.

        Returns:
            ``(B, n)`` float64 codes, ``s`` nonzeros per row.
        """

    def dictionary(self) -> torch.Tensor:
        """The dense float64 ``(n, n)`` matrix ``D`` of :meth:`transform` (the identity before the first
        transform), with which ``Y ~ X D^T``."""

    def transform(self, dtype: torch.dtype = torch.float64) -> Any:
        """The current transform as a fast product of blocks (a :class:`~lightning_ortho.transforms.BlockProduct`
        or one of its binary / 4x4 forms), the identity before the first transform.

        Args:
            dtype: dtype of the product's blocks.
        """

    def op_count(self) -> Any:
        """The operations of one product ``D x`` with the current transform, as the paper counts them for the
        family: an :class:`~lightning_ortho.transforms.OpCount` (additions, multiplications, shifts)."""

    def update(self, statistics: TransformStatistics) -> float | None:
        """End of a pass: the algorithm's next step from the pass's sums (all-reduced across processes first).

        Args:
            statistics: the sums of every batch of the pass with the codes of :meth:`encode` (and ``gram`` when
                :attr:`needs_gram` was true).

        Returns:
            The relative error ``100 ||Y - X D^T||_F^2 / ||Y||_F^2`` (percent) of the pass's codes under the
                transform that produced them, or ``None`` when the pass had no codes. Sets ``finished`` when the
                algorithm has stopped.

        Raises:
            RuntimeError: the learner has already finished (ours).
        """

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the learner (plain Python values and tensors), for checkpoints."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a learner of the same family and settings, in place.

        Args:
            state: what :meth:`state_dict` returned.
        """


class PassLearner:
    """What the three learners share: ``n``, ``s``, the principal ``basis`` (``None`` until the first pass has
    given the Gram matrix, hence ``needs_gram``), ``finished``, the cached dense ``dictionary()`` of
    ``transform()``, and a ``state_dict`` of the attributes named in ``STATE`` (lists copied) for checkpoints."""

    #: Attributes that make up the learner's state, besides ``basis`` and ``finished``.
    STATE: tuple[str, ...] = ()

    def __init__(self, n: int, s: int) -> None:
        self.n, self.s = n, s
        self.basis: torch.Tensor | None = None
        self.finished = False
        self._dense: torch.Tensor | None = None

    @property
    def needs_gram(self) -> bool:
        return self.basis is None

    def transform(self, dtype: torch.dtype = torch.float64) -> Any:
        raise NotImplementedError

    def dictionary(self) -> torch.Tensor:
        """The dense float64 ``(n, n)`` matrix of :meth:`transform` (cached until the transform changes)."""
        if self._dense is None:
            self._dense = self.transform().matrix()
        return self._dense

    def _changed(self) -> None:
        self._dense = None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (plain Python values and tensors)."""
        return {
            name: list(value) if isinstance(value, list) else value
            for name in ("basis", "finished", *self.STATE)
            for value in (getattr(self, name),)
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("basis", "finished", *self.STATE):
            value = state[name]
            setattr(self, name, list(value) if isinstance(value, list) else value)
        self._changed()


def fit_in_memory(learner: TransformLearner, data: torch.Tensor, max_passes: int = 10_000) -> list[float | None]:
    """Run ``learner`` on ``data`` ``(N, n)`` as one batch per pass until it finishes; returns each pass's error.

    The data is first scaled by a power of two (exact) so its largest entry is in ``[0.5, 1)``: the transform is
    the same for data of any magnitude; codes computed afterwards with ``learner.code`` use the original scale.

    Args:
        learner: a :class:`TransformLearner`, fresh.
        data: ``(N, n)`` data, one batch per pass.
        max_passes: most passes before giving up.

    Raises:
        RuntimeError: the learner did not finish within ``max_passes`` passes.
    """
    # The learners are scale-invariant: an exact power-of-two rescaling keeps the sums of squares in range for
    # data of any magnitude (the transform is the same; the errors are relative).
    largest = float(data.detach().abs().max()) if data.numel() else 0.0
    if largest > 0:
        data = torch.ldexp(data.detach().to(STATISTICS_DTYPE), torch.tensor(-math.frexp(largest)[1]))
    errors: list[float | None] = []
    for _ in range(max_passes):
        if learner.finished:
            return errors
        statistics = TransformStatistics.zeros(data.shape[1], data.device)
        statistics.add(data, learner.encode(data), with_gram=learner.needs_gram)
        errors.append(learner.update(statistics))
    if not learner.finished:
        raise RuntimeError(f"fit_in_memory: the learner did not finish within {max_passes} passes.")
    return errors
