"""Validation, test and predict of :class:`~lightning_ortho.models.OnlineRNNModule`: the cell run forward over
held-out streams, no gradient estimate, no update."""

from __future__ import annotations

import math

import torch
import torchmetrics

from lightning_ortho._lightning import rank_zero_warn
from lightning_ortho.models.online.readout import Chunk
from lightning_ortho.online.losses import masked_loss_sum

#: The evaluation stages and the name of their pass in messages.
STAGES = {"val": "validation", "test": "test", "predict": "predict"}


class StreamPass:
    """The hidden state carried across the chunks of one evaluation pass, from a zero state at chunk 0."""

    def __init__(self, stage: str) -> None:
        self.stage, self.h, self.next = stage, None, 0

    def start(self, chunk: Chunk, zero: torch.Tensor) -> torch.Tensor:
        """The state ``(b, H)`` that ``chunk`` starts from (``zero`` at chunk 0, resets applied).

        Raises:
            ValueError: the chunk is not the one after the previous (the loader must yield them in order).
        """
        if self.h is not None and chunk.index not in (0, self.next):
            raise ValueError(
                f"OnlineRNNModule: {STAGES[self.stage]} chunk {chunk.index} arrived where chunk {self.next} was"
                f" expected; the {STAGES[self.stage]} loader must yield its chunks in order."
            )
        if self.h is None or chunk.index == 0:
            self.h = zero
        self.next = chunk.index + 1
        return torch.where(chunk.reset[:, None], torch.zeros_like(self.h), self.h)


class OnlineEvaluation:
    """Mixin of :class:`~lightning_ortho.models.OnlineRNNModule` (which provides ``_read``, ``_zero_state``,
    ``forward`` and ``loss_name``) for the evaluation stages.

    **Validation** and **test** run the cell forward from a zero state on each pass over the data module's
    validation or test streams, carrying the state across that pass's chunks, and log ``val_loss`` / ``test_loss``
    per masked entry (and ``*_bits`` = loss / ln 2 for cross-entropy), exact over all processes. A pass whose
    masks score no entry logs NaN and warns first. **Predict** runs the same way over the predict streams and
    returns, per chunk, ``outputs`` ``(b, T, output_size)``, ``targets`` and ``mask``;
    :meth:`prediction_record` joins the chunks along time (what ``lightning-ortho predict`` saves).
    """

    def _init_evaluation(self) -> None:
        for stage in ("val", "test"):
            setattr(self, f"{stage}_loss", torchmetrics.MeanMetric())
            setattr(self, f"{stage}_bits", torchmetrics.MeanMetric())
            setattr(self, f"{stage}_count", torchmetrics.SumMetric())  # masked entries scored, over all processes
        self._passes = {stage: StreamPass(stage) for stage in STAGES}

    def _run_chunk(self, batch: dict[str, torch.Tensor], stage: str) -> tuple[Chunk, torch.Tensor]:
        chunk = self._read(batch)
        stream_pass = self._passes[stage]
        outputs, stream_pass.h = self(chunk.x, stream_pass.start(chunk, self._zero_state(chunk.streams)))
        return chunk, outputs

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str) -> None:
        chunk, outputs = self._run_chunk(batch, stage)
        loss_sum = sum(
            masked_loss_sum(outputs[:, t], chunk.y[:, t], chunk.mask[:, t], self.loss_name) for t in range(chunk.steps)
        )
        count = int(chunk.mask.sum())
        loss, bits = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_bits")
        loss.update(loss_sum / max(count, 1), weight=count)
        getattr(self, f"{stage}_count").update(count)
        # Logged from the step (every step, every process: the same keys everywhere under DDP), so Lightning
        # reduces them before any on_*_epoch_end hook: a callback reading callback_metrics there sees this pass's
        # value, as for any metric logged in validation_step.
        self.log(f"{stage}_loss", loss, prog_bar=stage == "val", on_epoch=True, batch_size=chunk.streams)
        if self.loss_name == "cross_entropy":
            bits.update(loss_sum / max(count, 1) / math.log(2), weight=count)
            self.log(f"{stage}_bits", bits, on_epoch=True, batch_size=chunk.streams)

    def _end_pass(self, stage: str) -> None:
        """Warn when the pass scored no entry: its ``*_loss`` (and ``*_bits``) is then NaN, a mean over nothing.

        The warning comes before ModelCheckpoint or EarlyStopping read the NaN (they run at the end of validation;
        EarlyStopping's ``check_finite`` stops training on it, ModelCheckpoint ranks it last). It is given once (by
        the process of rank zero: the count is over all processes) and not in Lightning's sanity check, whose few
        chunks may all lie in the task's warm-up although the full validation pass does not.
        """
        counter = getattr(self, f"{stage}_count")
        scored = int(counter.compute())  # over all processes (a collective under DDP, once per pass)
        counter.reset()
        if scored == 0 and not self.trainer.sanity_checking:
            name = STAGES[stage]
            rank_zero_warn(
                f"OnlineRNNModule: {name} scored no entry: the mask of every {name} step is false (e.g. the"
                f" {name} chunks are shorter than the task's warm-up, such as AddingTaskDataModule's max(t1, t2)"
                f" steps), so {stage}_loss is NaN for this pass. Give {name} more or longer chunks (val_chunks,"
                f" chunk_length), or do not monitor {stage}_loss."
            )

    def on_validation_epoch_start(self) -> None:
        self._passes["val"] = StreamPass("val")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """The cell forward from a zero state at the pass's first chunk; the loss per masked entry."""
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:  # noqa: D102
        self._end_pass("val")

    def on_test_epoch_start(self) -> None:
        self._passes["test"] = StreamPass("test")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """As validation, on the test streams: ``test_loss`` (and ``test_bits``)."""
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:  # noqa: D102
        self._end_pass("test")

    def on_predict_epoch_start(self) -> None:
        self._passes["predict"] = StreamPass("predict")

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        """The chunk's ``outputs`` ``(b, T, output_size)`` (the readout's, before any softmax), with its
        ``targets`` (``(b, T)`` or ``(b, T, output_size)``) and ``mask`` ``(b, T)``; the state carries on."""
        chunk, outputs = self._run_chunk(batch, "predict")
        return {"outputs": outputs, "targets": chunk.y, "mask": chunk.mask}

    def prediction_record(self, outputs: list[dict[str, torch.Tensor]], targets: list) -> dict[str, torch.Tensor]:
        """The chunks joined along time: ``outputs`` ``(streams, steps, output_size)``, ``targets``, ``mask``."""
        return {key: torch.cat([o[key] for o in outputs], 1) for key in ("outputs", "targets", "mask")}

    def prediction_summary(self, record: dict[str, torch.Tensor], reduce) -> str:
        """The loss per masked entry (and bits for cross-entropy) over every stream of every process."""
        outputs, targets, mask = record["outputs"], record["targets"], record["mask"]
        loss_sum = sum(
            masked_loss_sum(outputs[:, t], targets[:, t], mask[:, t], self.loss_name).double()
            for t in range(outputs.shape[1])
        )
        total, count = reduce(torch.stack([torch.as_tensor(loss_sum, dtype=torch.float64), mask.sum().double()]))
        loss = float(total / count) if count > 0 else math.nan
        bits = f", {loss / math.log(2):.4f} bits" if self.loss_name == "cross_entropy" else ""
        return f"loss {loss:.4f}{bits} per scored entry over {int(count)} scored (stream, step) entries"
