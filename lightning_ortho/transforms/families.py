"""The transform families, in one table that every place choosing a family reads.

Four learners of Rusu's "Learning multiplication-free linear transformations" (arXiv 1812.03412):

* ``"b"``: B_m-DLA (Algorithm 2), ``m`` 2x2 binary blocks;
* ``"m"``: M_q-DLA (Algorithm 3), ``q`` stages of 2x2 blocks on perfect matchings (even ``n``);
* ``"shear"``: S-DLA, ``m`` shears and scalings with ``bits`` SOPOT terms (eq. 4) per value;
* ``"b4x4"``: B⊗_m-DLA, the B-transforms with ``m`` 4x4 Hadamard blocks (``n >= 4``).

Each :class:`TransformFamilySpec` names its in-memory learner (:meth:`~TransformFamilySpec.learn`, what
:func:`~lightning_ortho.transforms.compression.compress_linear` runs), its streaming learner
(:meth:`~TransformFamilySpec.streaming_learner`, one alternation per pass, what the Lightning module runs), the
hyperparameters it takes from one shared vocabulary (:data:`HYPERPARAMETERS`: ``m`` blocks, ``q`` stages, ``s``
nonzeros per code, ``bits``, ``iterations``), their defaults for an ``(out, in)`` layer, and its constraints on the
number of features ``n``. The math package never imports Lightning, and neither does this table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_ortho.transforms.b4_dla import B4x4TransformLearner, learn_b4x4_transform
from lightning_ortho.transforms.b_dla import BTransformLearner, learn_b_transform
from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.m_dla import MTransformLearner, learn_m_transform
from lightning_ortho.transforms.progress import DEFAULT_ITERATIONS, Segment, WorkPlan, plan_work
from lightning_ortho.transforms.quad_cores import COLUMN_SIGNS, PERMUTATIONS, ROW_SIGNS, QuadBlockProduct
from lightning_ortho.transforms.s_dla import ShearTransformLearner, learn_shear_transform

#: The shared vocabulary of the hyperparameters, name -> what it is (every family takes ``s`` and ``iterations``).
HYPERPARAMETERS = {
    "m": "number of blocks",
    "q": "stages",
    "s": "nonzeros per code row",
    "bits": "SOPOT terms per shear",
    "iterations": "sweeps of the learner (outer rounds for family 'm')",
}
#: The hyperparameters that only some families take.
OPTIONAL = ("m", "q", "bits")


@dataclass(frozen=True)
class TransformFamilySpec:
    """One transform family: its learners, hyperparameters, defaults and constraints.

    Attributes:
        name: the family's name (``family=...`` everywhere).
        description: one line on what the transform is made of.
        takes: which of :data:`OPTIONAL` it takes (it always takes ``s`` and ``iterations``).
        block_size: the blocks act on this many coordinates, so ``n >= block_size`` (2 or 4).
        even_features: ``n`` must be even.
        default_iterations: sweeps (outer rounds for ``"m"``) when ``iterations`` is not given.
        learner: the in-memory learner ``(Y, *, m, q, s, bits, iterations, generator, on_step) -> result`` (a
            result with ``transform``, ``codes`` and ``errors``).
        streaming: the streaming learner factory ``(n, *, m, q, s, bits, iterations, rounds, tol) ->``
            :class:`~lightning_ortho.transforms.statistics.TransformLearner`.
        defaults: ``(in_features, out_features) -> {"s": ..., "m" or "q": ...}``.
        plan: ``(m, q, iterations) ->`` the :class:`~lightning_ortho.transforms.progress.WorkPlan` of
            :meth:`learn` in the steps its ``on_step`` reports.
        as_block_product: the learned transform as a product of 2x2
            :class:`~lightning_ortho.transforms.BlockProduct`, what a
            :class:`~lightning_ortho.transforms.FactorizedLinear` holds (identity for the 2x2 families).
        max_features: the largest ``n`` the learner handles (``None``: no limit): B⊗'s exact greedy keeps a cost
            for each of the ``C(n, 4)`` quadruples (10.7 million at ``n = 128``, 174 million at 256).
    """

    name: str
    description: str
    takes: tuple[str, ...]
    block_size: int
    even_features: bool
    default_iterations: int
    learner: Callable[..., Any]
    streaming: Callable[..., Any]
    defaults: Callable[[int, int], dict[str, int]]
    plan: Callable[[int | None, int | None, int | None], WorkPlan]
    #: ``as_block_product(transform)``: the learned transform of this family as the same matrix in 2x2 blocks,
    #: a :class:`~lightning_ortho.transforms.BlockProduct` such as a
    #: :class:`~lightning_ortho.transforms.FactorizedLinear` holds (the transform itself for the 2x2 families;
    #: ``"b4x4"`` rewrites each 4x4 block as 4 to 6 2x2 blocks).
    as_block_product: Callable[[Any], BlockProduct] = lambda transform: transform
    max_features: int | None = None

    def feature_problem(self, n: int) -> str | None:
        """Why ``n`` features do not suit this family (``"needs ..."``), ``None`` when they do."""
        if n < self.block_size:
            return f"needs in_features >= {self.block_size} (a block acts on {self.block_size} coordinates)"
        if self.even_features and n % 2:
            return "needs an even in_features (its stages are perfect matchings)"
        if self.max_features is not None and n > self.max_features:
            return (
                f"needs in_features <= {self.max_features} (its exact search scans all C(n, 4) quadruples of"
                " coordinates); use family 'b' for wider layers"
            )
        return None

    def learn(self, y: torch.Tensor, **settings: Any) -> Any:
        """The in-memory learner on ``Y`` ``(N, n)`` with ``m, q, s, bits, iterations, generator, on_step``
        (``iterations=None``: :attr:`default_iterations`)."""
        settings["iterations"] = settings.get("iterations") or self.default_iterations
        return self.learner(y, **settings)

    def streaming_learner(self, n: int, **settings: Any) -> Any:
        """The streaming learner for ``n`` features with ``m, q, s, bits, iterations, rounds, tol``.

        Raises:
            ValueError: a setting the learner rejects (its message says which).
        """
        return self.streaming(n, **settings)


def _sparsity(in_features: int) -> int:
    return max(1, in_features // 8)


def _b_defaults(in_features: int, out_features: int) -> dict[str, int]:
    m = min(2 * in_features, max(in_features // 2, out_features * in_features // 16))
    return {"s": _sparsity(in_features), "m": m}


def _m_defaults(in_features: int, out_features: int) -> dict[str, int]:
    q = max(1, min(math.ceil(math.log2(max(in_features, 2))), out_features // 4 - 1))
    return {"s": _sparsity(in_features), "q": q}


def _shear_defaults(in_features: int, out_features: int) -> dict[str, int]:
    return {"s": _sparsity(in_features), "m": max(1, in_features // 2)}


def _b4x4_defaults(in_features: int, out_features: int) -> dict[str, int]:
    m = min(in_features, max(in_features // 4, out_features * in_features // 64))
    return {"s": _sparsity(in_features), "m": max(1, m)}


def _b4x4_plan(m: int | None, q: int | None, iterations: int | None) -> WorkPlan:
    """Greedy init (``m`` picks), then ``iterations`` sweeps of ``m`` re-picks, each after one pass; the stopping
    rule looks at sweeps 3 onwards (so the plan is an upper bound beyond 3 sweeps)."""
    sweeps = iterations or FAMILY_TABLE["b4x4"].default_iterations
    rounds = tuple(Segment("sweep", m or 0) for _ in range(sweeps))
    return WorkPlan((Segment("greedy", m or 0), *rounds), "block choices", 2, 2, may_stop_early=sweeps > 3)


def quad_product_as_pairs(product: QuadBlockProduct) -> BlockProduct:
    """The same matrix as a product of 2x2 blocks (exactly: every entry is ``0``, ``+-1`` or ``+-1/2``).

    A core ``H = diag(r) N_pi diag(c) / 2`` (the factorisation of :mod:`~lightning_ortho.transforms.quad_cores`) on
    ``(a_0, a_1, a_2, a_3)`` becomes the butterfly of ``N_id = H_2 (x) H_2``: ``[[c_0, c_1], [c_0, -c_1]]`` on
    ``(a_0, a_1)`` and ``[[c_2, c_3], [c_2, -c_3]]`` on ``(a_2, a_3)``, then ``[[1, 1], [1, -1]] / 2`` on
    ``(a_0, a_2)`` and on ``(a_1, a_3)`` (output ``t`` is then ``w_t . (c o x) / 2``), then at most two swaps
    ``[[0, 1], [1, 0]]`` placing ``w_pi(t)`` on row ``t``, the row signs ``r`` folded into the last 2x2 block on
    each coordinate. Blocks in the order they act (block 0 of ``product`` first).

    Returns:
        A non-trainable float64 :class:`BlockProduct` with ``D = product.matrix()`` (``4`` to ``6`` 2x2 blocks per
        4x4 block).
    """
    pairs: list[tuple[int, int]] = []
    blocks: list[list[list[float]]] = []
    half = [[0.5, 0.5], [0.5, -0.5]]
    for quad, index in zip(product.quads.tolist(), product.core_index.tolist(), strict=True):
        pi = (0, *PERMUTATIONS[index // 128])
        c = COLUMN_SIGNS[index // 16 % 8].tolist()
        r = ROW_SIGNS[index % 16].tolist()
        a = quad
        own = [
            ((a[0], a[1]), [[c[0], c[1]], [c[0], -c[1]]]),
            ((a[2], a[3]), [[c[2], c[3]], [c[2], -c[3]]]),
            ((a[0], a[2]), [row[:] for row in half]),
            ((a[1], a[3]), [row[:] for row in half]),
        ]
        at = [0, 1, 2, 3]  # at[t]: which Walsh row w_k sits on coordinate a_t
        for t in range(1, 4):
            if at[t] != pi[t]:
                u = at.index(pi[t])
                own.append(((a[t], a[u]), [[0.0, 1.0], [1.0, 0.0]]))
                at[t], at[u] = at[u], at[t]
        for t in range(4):
            if r[t] < 0:  # negate the output row on a_t of the last 2x2 block touching it
                pair, core = next(item for item in reversed(own) if a[t] in item[0])
                core[pair.index(a[t])] = [-v for v in core[pair.index(a[t])]]
        pairs += [pair for pair, _ in own]
        blocks += [core for _, core in own]
    tensor = torch.tensor(blocks, dtype=torch.float64).reshape(len(blocks), 2, 2)
    return BlockProduct(product.n, pairs if pairs else torch.empty(0, 2, dtype=torch.int64), tensor, trainable=False)


def _learn_b(y, *, m, q, s, bits, iterations, generator, on_step):  # noqa: ANN001, ANN202
    return learn_b_transform(y, m, s, iterations=iterations, generator=generator, on_step=on_step)


def _learn_m(y, *, m, q, s, bits, iterations, generator, on_step):  # noqa: ANN001, ANN202
    return learn_m_transform(y, q, s, rounds=iterations, generator=generator, on_step=on_step)


def _learn_shear(y, *, m, q, s, bits, iterations, generator, on_step):  # noqa: ANN001, ANN202
    return learn_shear_transform(y, m, s, bits=bits, iterations=iterations, generator=generator, on_step=on_step)


def _learn_b4x4(y, *, m, q, s, bits, iterations, generator, on_step):  # noqa: ANN001, ANN202
    return learn_b4x4_transform(y, m, s, iterations=iterations, generator=generator, on_step=on_step)


def _stream_b(n, *, m, q, s, bits, iterations, rounds, tol):  # noqa: ANN001, ANN202
    return BTransformLearner(n, m, s, iterations=iterations, tol=0.0 if tol is None else tol)


def _stream_m(n, *, m, q, s, bits, iterations, rounds, tol):  # noqa: ANN001, ANN202
    return MTransformLearner(n, q, s, rounds=rounds)


def _stream_shear(n, *, m, q, s, bits, iterations, rounds, tol):  # noqa: ANN001, ANN202
    return ShearTransformLearner(n, m, s, bits=bits, iterations=iterations, tol=tol)


def _stream_b4x4(n, *, m, q, s, bits, iterations, rounds, tol):  # noqa: ANN001, ANN202
    return B4x4TransformLearner(n, m, s, iterations=iterations, tol=0.0 if tol is None else tol)


def _plan_of(name: str) -> Callable[[int | None, int | None, int | None], WorkPlan]:
    return lambda m, q, iterations: plan_work(name, m, q, iterations)


#: Every family by name, in the order they are listed to users.
FAMILY_TABLE: dict[str, TransformFamilySpec] = {
    spec.name: spec
    for spec in (
        TransformFamilySpec(
            name="b",
            description="B_m-DLA: m 2x2 binary blocks (Rusu Algorithm 2)",
            takes=("m",),
            block_size=2,
            even_features=False,
            default_iterations=DEFAULT_ITERATIONS["b"],
            learner=_learn_b,
            streaming=_stream_b,
            defaults=_b_defaults,
            plan=_plan_of("b"),
        ),
        TransformFamilySpec(
            name="m",
            description="M_q-DLA: q stages of 2x2 blocks on perfect matchings (Rusu Algorithm 3)",
            takes=("q",),
            block_size=2,
            even_features=True,
            default_iterations=DEFAULT_ITERATIONS["m"],
            learner=_learn_m,
            streaming=_stream_m,
            defaults=_m_defaults,
            plan=_plan_of("m"),
        ),
        TransformFamilySpec(
            name="shear",
            description="S-DLA: m shears and scalings, bits SOPOT terms per value (Rusu eq. 4)",
            takes=("m", "bits"),
            block_size=2,
            even_features=False,
            default_iterations=DEFAULT_ITERATIONS["shear"],
            learner=_learn_shear,
            streaming=_stream_shear,
            defaults=_shear_defaults,
            plan=_plan_of("shear"),
        ),
        TransformFamilySpec(
            name="b4x4",
            description="B⊗_m-DLA: m 4x4 Hadamard blocks, 12 additions + 4 shifts each",
            takes=("m",),
            block_size=4,
            even_features=False,
            default_iterations=1,
            learner=_learn_b4x4,
            streaming=_stream_b4x4,
            defaults=_b4x4_defaults,
            plan=_b4x4_plan,
            as_block_product=quad_product_as_pairs,
            max_features=128,
        ),
    )
}
#: The family names.
FAMILIES = tuple(FAMILY_TABLE)


def family_spec(family: object, where: str) -> TransformFamilySpec:
    """The table's entry for ``family``.

    Raises:
        ValueError: ``family`` is not one of :data:`FAMILIES` (the message starts with ``where``).
    """
    if not isinstance(family, str) or family not in FAMILY_TABLE:
        raise ValueError(f"{where}: family must be one of {FAMILIES}, got {family!r}.")
    return FAMILY_TABLE[family]


def describe_families() -> str:
    """The family names grouped by block size, e.g. ``"'b', 'm' or 'shear' (2x2 blocks) or 'b4x4' (4x4 blocks)"``."""
    groups = []
    for size in sorted({spec.block_size for spec in FAMILY_TABLE.values()}):
        names = [repr(spec.name) for spec in FAMILY_TABLE.values() if spec.block_size == size]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        groups.append(f"{listed} ({size}x{size} blocks)")
    return " or ".join(groups)


def users_of(key: str) -> list[str]:
    """Names of the families that take hyperparameter ``key``."""
    return [spec.name for spec in FAMILY_TABLE.values() if key in spec.takes]


def unused_hyperparameter(spec: TransformFamilySpec, given: dict[str, object], where: str) -> str | None:
    """The message refusing the first of :data:`OPTIONAL` that is given (not ``None``) in ``given`` but not taken
    by ``spec``; ``None`` when every given one is taken."""
    for key in OPTIONAL:
        if key not in spec.takes and given.get(key) is not None:
            users = "/".join(repr(name) for name in users_of(key))
            takes = " and ".join(f"{k} ({HYPERPARAMETERS[k]})" for k in spec.takes)
            return (
                f"{where}: {key} is the {HYPERPARAMETERS[key]} of family {users} only; family {spec.name!r} takes "
                f"{takes}."
            )
    return None


def features_suiting(n: int) -> list[str]:
    """Names of the families whose constraints ``n`` features meet."""
    return [spec.name for spec in FAMILY_TABLE.values() if spec.feature_problem(n) is None]


def transform_op_count(spec: TransformFamilySpec, factorized: Any, bits: int | None) -> OpCount:
    """Operations of the transform ``T = D^T`` of a compressed layer ``factorized``: the count of the 2x2 blocks
    the layer runs (``bits`` SOPOT terms for shears; cores outside ``R_bits`` counted as multiplications). For
    B⊗ that is 8 additions + 4 shifts per 4x4 block, its butterfly, fewer than the 12 additions + 4 shifts the
    learned transform's own :meth:`op_count` gives (Rusu's count, for the block as a matrix)."""
    try:
        return factorized.transform_op_count(bits if spec.name == "shear" else None)
    except ValueError:  # cores not in R_bits: count them as multiplications
        return factorized.transform_op_count()
