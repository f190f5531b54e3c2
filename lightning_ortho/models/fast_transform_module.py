"""Learn a multiplication-free fast transform from the batches of any data module (one alternation per epoch)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import torch

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning
from lightning_ortho._lightning import pl
from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.families import FAMILIES, FAMILY_TABLE, describe_families
from lightning_ortho.transforms.patches import image_patches
from lightning_ortho.transforms.quad_cores import QuadBlockProduct
from lightning_ortho.transforms.statistics import TransformLearner, TransformStatistics

#: The family names of :data:`~lightning_ortho.transforms.families.FAMILY_TABLE` (a ``Literal`` for the CLI).
TransformFamily = Literal[FAMILIES]  # type: ignore[valid-type]
FeatureMode = Literal["flatten", "patches"]


def make_learner(
    family: str,
    n: int,
    *,
    m: int,
    q: int,
    s: int,
    bits: int | None,
    iterations: int,
    rounds: int,
    tol: float | None,
) -> TransformLearner:
    """The streaming learner of ``family`` for ``n`` features (see :class:`FastTransformModule` for the arguments),
    from :data:`~lightning_ortho.transforms.families.FAMILY_TABLE`.

    Raises:
        ValueError: an unknown family, or a setting the family's learner rejects (its message says which).
    """
    if family not in FAMILY_TABLE:
        raise ValueError(f"family must be {describe_families()}, got {family!r}.")
    settings = {"m": m, "q": q, "s": s, "bits": bits, "iterations": iterations, "rounds": rounds}
    return FAMILY_TABLE[family].streaming_learner(n, **settings, tol=tol)


#: Deprecated argument names of :class:`FastTransformModule` -> the family vocabulary's names, with their defaults.
_RENAMED_SETTINGS = {"blocks": ("m", 32), "stages": ("q", 8), "sparsity": ("s", 4)}


def _renamed_settings(new: dict[str, int], old: dict[str, int | None]) -> tuple[int, ...]:
    """``(m, q, s)`` from the new names, with any old name given (``blocks``, ``stages``, ``sparsity``) taking its
    place with a ``LightningOrthoDeprecationWarning``.

    Raises:
        ValueError: an old name and its new name both given, with different values.
    """
    new = dict(new)
    for old_name, value in old.items():
        if value is None:
            continue
        name, default = _RENAMED_SETTINGS[old_name]
        warnings.warn(
            f"FastTransformModule: {old_name!r} is deprecated and will be removed in the next release; use {name!r} "
            f"(the vocabulary shared with compress_linear and TransformCompression): {name}={value}.",
            LightningOrthoDeprecationWarning,
            stacklevel=4,
        )
        if new[name] not in (default, value):
            raise ValueError(
                f"FastTransformModule: {old_name}={value} and {name}={new[name]} disagree; give {name} only."
            )
        new[name] = value
    return new["m"], new["q"], new["s"]


def _codes_from_held_transform(learner: TransformLearner) -> bool:
    """Whether the learner's pass codes (``encode``) are the best codes under the transform it holds. Not in the
    pass after the principal basis ``V`` is found and before any block exists: that pass codes ``T_s(Y V)`` (the
    greedy initialisation of every family's learner) while the held transform is still the identity."""
    return getattr(learner, "basis", None) is None or learner.transform().num_blocks > 0


def _error_sums(y: torch.Tensor, learner: TransformLearner) -> torch.Tensor:
    """``[||Y - X D^T||^2, ||Y||^2]`` (float64) of a batch ``Y`` ``(B, n)`` with ``X = learner.code(Y)`` under the
    held ``D``."""
    codes = learner.code(y)
    y64 = y.detach().to(device=codes.device, dtype=torch.float64)
    residual = y64 - codes @ learner.dictionary().to(codes.device).T
    return torch.stack([residual.square().sum(), y64.square().sum()])


def _relative_error(sums: torch.Tensor) -> float:
    """``100 sums[0] / sums[1]`` (NaN when nothing was summed)."""
    return 100 * float(sums[0] / sums[1]) if float(sums[1]) > 0 else math.nan


class FastTransformModule(pl.LightningModule):
    """Learns a fast transform ``D`` (B_m-, M_q-, S- or B⊗_m-DLA) and sparse codes from any data module's batches.

    Every training epoch is one alternation of the chosen algorithm: the batches are turned into features ``Y``
    ``(B, n)``, coded with the current transform, and only their sums are kept (:class:`TransformStatistics`:
    ``Y^T Y``, ``Z = Y^T X``, ``W = X^T X``, ``||Y||^2``). After the last batch of the epoch the sums are
    all-reduced across processes and the transform is updated from them; a DDP run therefore learns the same
    transform as one process on the same data (DistributedSampler pads an uneven split with repeated samples,
    which then count twice). No gradient is involved: the optimizer is a no-op that counts updates
    (``global_step`` = number of transform updates), and Trainer options about gradients do not apply. Training stops by itself when the algorithm has converged; ``max_epochs`` must allow enough passes
    (B, B⊗ and shear: 3 + sweeps; M: 2 + rounds).

    Args:
        family: ``"b"`` (binary blocks, Algorithm 2), ``"m"`` (perfect-matching stages, Algorithm 3),
            ``"shear"`` (shears and scalings, S-DLA) or ``"b4x4"`` (4x4 Hadamard blocks, B⊗_m-DLA; ``n >= 4``):
            :data:`~lightning_ortho.transforms.families.FAMILY_TABLE`.
        m: number of blocks for ``"b"``, ``"shear"`` and ``"b4x4"`` (the vocabulary of
            :data:`~lightning_ortho.transforms.families.FAMILY_TABLE`, shared with
            :func:`~lightning_ortho.transforms.compress_linear` and ``TransformCompression``).
        q: number of stages for ``"m"``.
        s: nonzeros per code.
        bits: SOPOT terms of each shear value (``None``: exact values); ``"shear"`` only.
        iterations: maximum number of sweeps (``"b"``, ``"shear"``, ``"b4x4"``).
        rounds: outer rounds of ``"m"``.
        tol: convergence threshold on the error change, in percent (``None``: shear sweeps run all ``iterations``,
            as the paper's fixed ``K``; B and B⊗ treat it as 0).
        features: ``"flatten"`` (each input flattened to a vector, for vectors or patches) or ``"patches"`` (images
            ``(B, C, H, W)`` cut into non-overlapping ``patch_size`` patches, each patch's mean removed when
            ``remove_mean``).
        patch_size: side of the square patches for ``features="patches"``.
        remove_mean: remove each patch's mean, for ``features="patches"``.
        blocks: deprecated name of ``m`` (warns ``LightningOrthoDeprecationWarning``; removed in the next release).
        stages: deprecated name of ``q`` (warns ``LightningOrthoDeprecationWarning``; removed in the next release).
        sparsity: deprecated name of ``s`` (warns ``LightningOrthoDeprecationWarning``; removed in the next release).

    Logs, for the transform ``D`` the module holds during the epoch (:meth:`transform`, logged before the epoch's
    update replaces it): ``train_error`` (percent, ``100 ||Y - X D^T||^2 / ||Y||^2`` over the epoch's training
    batches, ``X`` the best codes under ``D``: ``T_s(Y D)``, OMP for shears; ``D = I`` until the first blocks are
    learned, even in the epoch whose statistics are taken in the PCA basis), ``additions``, ``multiplications`` and
    ``shifts`` of one application of ``D``; and ``val_error``, the same error of the updated transform on the
    validation batches.

    The learned transform is :meth:`transform` (a :class:`~lightning_ortho.transforms.BlockProduct`, a
    :class:`~lightning_ortho.transforms.quad_cores.QuadBlockProduct` for ``"b4x4"``); the
    learner's state is part of the module's ``state_dict`` (extra state), so a run resumed from an end-of-epoch
    checkpoint learns exactly what the uninterrupted run learns, and ``ddp_spawn`` returns the learned transform.

    Raises:
        ValueError: a bad family or feature mode, or settings the learner rejects (at the first batch, when
            ``n`` is known); features that are not 2-d after extraction or hold NaN/inf.
    """

    def __init__(
        self,
        family: TransformFamily = "b",
        m: int = 32,
        q: int = 8,
        s: int = 4,
        bits: int | None = 1,
        iterations: int = 10,
        rounds: int = 1,
        tol: float | None = 1e-5,
        features: FeatureMode = "flatten",
        patch_size: int = 8,
        remove_mean: bool = True,
        blocks: int | None = None,
        stages: int | None = None,
        sparsity: int | None = None,
    ) -> None:
        super().__init__()
        m, q, s = _renamed_settings(
            {"m": m, "q": q, "s": s}, {"blocks": blocks, "stages": stages, "sparsity": sparsity}
        )
        if family not in FAMILY_TABLE:
            raise ValueError(f"FastTransformModule: family must be {describe_families()}, got {family!r}.")
        if features not in ("flatten", "patches"):
            raise ValueError(f"FastTransformModule: features must be 'flatten' or 'patches', got {features!r}.")
        self.save_hyperparameters(ignore=["blocks", "stages", "sparsity"])
        # Saved under m, q, s only, also where LightningCLI hands over the parsed config (old names included).
        for saved in (self.hparams, getattr(self, "_hparams_initial", None)):
            if saved is not None:
                for old_name in _RENAMED_SETTINGS:
                    saved.pop(old_name, None)
                saved.update(m=m, q=q, s=s)
        self.automatic_optimization = False
        # torch's DistributedDataParallel refuses to wrap a module without a parameter that requires a gradient,
        # and this module learns in closed form. One scalar that no loss ever touches lets DDP strategies wrap it
        # (no backward runs, so DDP never all-reduces it); the statistics are all-reduced explicitly instead.
        self.ddp_anchor = torch.nn.Parameter(torch.zeros(()))
        self.learner: TransformLearner | None = None
        self._statistics: TransformStatistics | None = None
        self._held: torch.Tensor | None = None  # error sums of the held transform when the pass codes otherwise
        self._validation: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------------------ features
    def features(self, batch: Any) -> torch.Tensor:
        """``Y`` ``(B, n)`` of a batch: its first element (inputs) flattened or cut into patches."""
        inputs = batch[0] if isinstance(batch, list | tuple) else batch
        if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point():
            raise ValueError(
                f"FastTransformModule: the batch's inputs must be a floating-point tensor, got "
                f"{type(inputs).__name__ if not isinstance(inputs, torch.Tensor) else inputs.dtype}."
            )
        if self.hparams.features == "patches":
            return image_patches(inputs, self.hparams.patch_size, remove_mean=self.hparams.remove_mean)
        return inputs.flatten(1)

    def _ensure_learner(self, n: int) -> TransformLearner:
        if self.learner is None:
            h = self.hparams
            self.learner = make_learner(
                h.family,
                n,
                m=h.m,
                q=h.q,
                s=h.s,
                bits=h.bits,
                iterations=h.iterations,
                rounds=h.rounds,
                tol=h.tol,
            )
        return self.learner

    # ------------------------------------------------------------------------------------------------ training
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """A no-op optimizer whose ``step`` marks each update of the transform.

        The transform is updated in closed form from the epoch's sums; nothing is trained by gradients. Lightning
        counts ``global_step`` in optimizer steps and its ModelCheckpoint saves only when ``global_step`` has
        moved, so one ``step()`` per update (SGD with ``lr=0`` on a parameter that never has a gradient) keeps
        step-based logic working: ``global_step`` is the number of transform updates.
        """
        return torch.optim.SGD([self.ddp_anchor], lr=0.0)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        y = self.features(batch)
        learner = self._ensure_learner(y.shape[1])
        if learner.finished:
            return None
        if self._statistics is None:
            self._statistics = TransformStatistics.zeros(y.shape[1], y.device)
            self._held = None if _codes_from_held_transform(learner) else torch.zeros(2, dtype=torch.float64)
        self._statistics.add(y, learner.encode(y), with_gram=learner.needs_gram)
        if self._held is not None:  # this pass codes in another basis: measure the held transform separately
            self._held = self._held.to(y.device) + _error_sums(y, learner)
        # The update runs here, after the pass's last batch, rather than in on_train_epoch_end: validation and
        # the end-of-epoch checkpoint (callbacks run before the module's epoch-end hook) then see the new state.
        if batch_idx + 1 == self.trainer.num_training_batches:
            self._end_of_pass()
        return None

    def _end_of_pass(self) -> None:
        assert self.learner is not None and self._statistics is not None
        statistics, self._statistics = self._statistics, None
        reduce_sum = lambda flat: self.trainer.strategy.reduce(flat, reduce_op="sum")  # noqa: E731
        statistics.all_reduce(reduce_sum)
        # Logged before the update: the error and cost of the transform the module holds now, which produced
        # this pass's codes, except in the pass that codes in the PCA basis (then measured on the side).
        if self._held is not None:
            held, self._held = reduce_sum(self._held), None
            error = _relative_error(held)
        else:
            error = statistics.error(self.learner.dictionary())
        self.log("train_error", error, on_step=False, on_epoch=True, prog_bar=True, sync_dist=False)
        count = self.learner.op_count()
        for name in ("additions", "multiplications", "shifts"):
            self.log(name, float(getattr(count, name)), on_step=False, on_epoch=True, sync_dist=False)
        self.learner.update(statistics)
        self.optimizers().step()  # counts the update (see configure_optimizers); no parameter changes
        if self.learner.finished:
            self.trainer.should_stop = True

    def on_train_epoch_start(self) -> None:
        self._statistics = None
        self._held = None

    def on_train_epoch_end(self) -> None:
        # A loader without a length (an IterableDataset) never reveals its last batch to training_step: the
        # pass ends here instead (after validation and the callbacks' epoch-end hooks, so those see the
        # transform of the previous pass).
        if self._statistics is not None:
            self._end_of_pass()

    # ---------------------------------------------------------------------------------------------- validation
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        y = self.features(batch)
        sums = _error_sums(y, self._ensure_learner(y.shape[1]))
        self._validation = sums if self._validation is None else self._validation + sums

    def on_validation_epoch_end(self) -> None:
        if self._validation is None:
            return
        sums, self._validation = self._validation, None
        error = _relative_error(self.trainer.strategy.reduce(sums, reduce_op="sum"))
        self.log("val_error", error, prog_bar=True, sync_dist=False)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """The error of the held transform on the test batches: ``test_error`` (percent, as ``val_error``)."""
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        if self._validation is not None:
            sums, self._validation = self._validation, None
            error = _relative_error(self.trainer.strategy.reduce(sums, reduce_op="sum"))
            self.log("test_error", error, sync_dist=False)

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        """For the batch's feature rows ``Y`` ``(P, n)`` (:meth:`features`): ``codes`` ``X`` ``(P, n)`` (the best
        ``s``-sparse codes under the held ``D``), ``squared_error`` ``||y - D x||^2`` and ``squared_norm``
        ``||y||^2`` ``(P,)``, in float64."""
        y = self.features(batch)
        learner = self._ensure_learner(y.shape[1])
        codes = learner.code(y)
        y64 = y.detach().to(device=codes.device, dtype=torch.float64)
        residual = y64 - codes @ learner.dictionary().to(codes.device).T
        return {"codes": codes, "squared_error": residual.square().sum(1), "squared_norm": y64.square().sum(1)}

    def prediction_record(self, outputs: list[dict[str, torch.Tensor]], targets: list) -> dict[str, torch.Tensor]:
        """What ``lightning-ortho predict`` saves: the rows of every batch's :meth:`predict_step`, joined."""
        return {key: torch.cat([o[key] for o in outputs]) for key in outputs[0]}

    def prediction_summary(self, record: dict[str, torch.Tensor], reduce) -> str:
        """``100 sum ||y - D x||^2 / sum ||y||^2`` (percent, as ``val_error``) over every row of every process."""
        sums = torch.stack([record["squared_error"].sum(), record["squared_norm"].sum()]).double()
        error, rows = _relative_error(reduce(sums)), int(reduce(torch.tensor([float(len(record["codes"]))]).double()))
        return f"error {error:.2f} % (100 ||Y - X D^T||^2 / ||Y||^2) over {rows} rows"

    # ------------------------------------------------------------------------------------------------- results
    def transform(self, dtype: torch.dtype = torch.float32) -> BlockProduct | QuadBlockProduct:
        """The learned transform ``D`` (identity before the first update).

        Raises:
            RuntimeError: nothing has been learned yet (no batch seen, so ``n`` is unknown).
        """
        if self.learner is None:
            raise RuntimeError("FastTransformModule.transform: no data seen yet; run trainer.fit first.")
        return self.learner.transform(dtype)

    # The learner's state is the module's "extra state": it travels in state_dict, so checkpoints and the weights
    # ddp_spawn hands back to the main process both carry the learned transform.
    def get_extra_state(self) -> dict[str, Any]:
        if self.learner is None:
            return {}
        return {"n": self.learner.n, "learner": self.learner.state_dict()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state:
            self.learner = None
            self._ensure_learner(state["n"]).load_state_dict(state["learner"])
