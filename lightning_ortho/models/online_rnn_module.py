"""Online training of a recurrent cell in Lightning: UORO, RTRL or truncated BPTT by manual optimisation."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, Literal

import torch
from torch import nn

from lightning_ortho._lightning import pl, rank_zero_warn
from lightning_ortho.models.online.carry import OnlineCarry
from lightning_ortho.models.online.chunk import _NOTHING, CompiledSteps, GradientPlan, block_length, run_steps
from lightning_ortho.models.online.chunk import no_autocast as _no_autocast
from lightning_ortho.models.online.estimators import ESTIMATORS, build_estimator, differing_options, initial_state
from lightning_ortho.models.online.evaluation import OnlineEvaluation
from lightning_ortho.models.online.readout import (
    LOSSES,
    Chunk,
    Readout,
    bad_classes_error,
    explain_nonfinite_grad_h,
    read_chunk,
)
from lightning_ortho.models.online.readout_step import readout_step
from lightning_ortho.models.online.stage_threads import StageThreads, check_num_threads
from lightning_ortho.models.optimizers import build_optimizer
from lightning_ortho.online import OnlineState
from lightning_ortho.online.health import GRADIENT, read_failure

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
_CHECKPOINT_KEY = "online_rnn_module"


class OnlineRNNModule(OnlineEvaluation, pl.LightningModule):
    """A recurrent cell trained online on ordered chunks of parallel streams.

    Every training chunk ``(b streams, T steps)`` continues the streams of the previous one. For each step ``t``
    the estimator advances (``h_t, state = estimator.step(x_t, state)``), the readout's loss ``L_t`` gives
    ``dL_t/dh_t`` in closed form (:func:`~lightning_ortho.models.online.readout_step.readout_step`, equal to
    autograd's), and ``estimator.gradient(state, dL_t/dh_t)`` (the cell's parameters) plus the
    readout's exact gradient are added to a per-parameter buffer. Every ``update_every`` steps (a window may span
    chunks) the buffer ``g`` reaches the parameters through one ``manual_backward`` of the surrogate
    ``sum_p (p * g_p).sum()``, whose gradient is exactly ``g``: precision plugins (loss scaling) and DDP's
    all-reduce apply unchanged; then optional norm clipping, ``opt.step()``, ``opt.zero_grad()``. With
    ``update_every=1`` this is fully online; ``Trainer(max_steps=N)`` counts these updates. The readout's
    gradient is accumulated as a tensor too (not kept as a loss graph), so a window that spans chunks holds no
    autograd graph between steps and its pending part can be checkpointed.

    **Normalisation.** ``L_t = sum over the masked (stream, step) entries of step t of the per-entry loss / b``,
    ``b`` the streams of this process; a window's gradient is the sum over its steps. Under DDP each process has
    ``b = B / W`` streams and DDP averages the processes' gradients, which equals one process's gradient with all
    ``B`` streams (tested). The per-entry loss is cross-entropy in nats (class indices, or soft targets) or
    ``0.5 ||o - y||^2`` (``dl/do = o - y``); a class target of -100 is not scored (PyTorch's ``ignore_index``:
    as a false mask), any other outside ``[0, output_size)`` is refused. Logged: ``train_loss`` and ``val_loss``
    per masked entry (and ``train_bits``, ``val_bits`` = loss / ln 2 for cross-entropy); ``val_*`` is exact over
    all processes.

    **Order.** Batches carry ``chunk``, the chunk's index in its stream. The first chunk a model sees, and any
    chunk 0, starts every stream afresh (zero state); any other chunk must be the one after the previous, else
    ``training_step`` raises: the training loader must not shuffle, drop or reorder chunks.

    **Checkpoints.** The estimator state of every process (hidden states, influence approximation, noise
    generator), the next expected chunk, the position in the update window and the pending gradient buffer are
    saved in ``on_save_checkpoint`` and restored in ``on_load_checkpoint``: fitting ``N`` chunks equals fitting
    ``k`` and resuming for ``N - k``, bit for bit (the data module restores its own position). Resume with the
    same number of processes and the same estimator (another one is refused, naming both); other
    ``estimator_options`` (compared with the estimator's defaults filled in) are warned (e.g. another truncation
    ``k``: the saved window is cut to the last ``k`` steps or fills up). A resume with a smaller ``update_every``
    than the saved window already holds closes that window at its first step (warned). These apply to a model
    built in Python and ``Trainer.fit(ckpt_path=...)``: ``lightning-ortho fit --ckpt_path`` (LightningCLI) reads
    the checkpoint's hyperparameters after the command line and config, so there the checkpoint's model options
    (estimator, options, ``update_every``, ``lr``, ...) replace those given, without a warning.

    Validation and test run the cell forward (no gradient estimate, no update) from a zero state on each pass over
    the validation or test streams, carrying the state across that pass's chunks, and log ``val_loss`` /
    ``test_loss`` (and ``*_bits``); a pass whose masks score no entry logs NaN (a mean over nothing) and warns
    first. ``predict`` runs the same way over the predict streams and returns each chunk's ``outputs``,
    ``targets`` and ``mask`` (``lightning-ortho predict`` saves them joined along time; see
    :class:`~lightning_ortho.models.online.evaluation.OnlineEvaluation`).

    Args:
        cell: a recurrent cell ``cell(x (b, I), h (b, H)) -> (b, H)`` with a ``hidden_size`` attribute (and
            ``input_size``, checked against the data), e.g. ``lightning_ortho.online.TanhRNNCell``,
            ``GRUCell``, ``InfluenceBalancingCell`` or ``lightning_ortho.nn.OrthogonalRNNCell``. A cell whose state
            is complex (``complex_state = True``: ``LinearRecurrentUnit``, with ``estimator="diagonal_rtrl"``) is read
            by the readout as its real and imaginary parts; the LRU's own output map (``C``, ``D``) is not used and
            gets zero gradients.
        output_size: outputs of the readout (classes for cross-entropy).
        loss: ``"cross_entropy"`` or ``"mse"``.
        readout: ``"linear"`` (``nn.Linear(H, output_size)``) or ``"units"`` (the first ``output_size`` units
            of ``h``, no parameters).
        estimator: ``"uoro"``, ``"rtrl"`` (exact, ``O(H^4)`` per step), ``"tbptt"``, ``"kf_rtrl"`` (Kronecker-factored,
            unbiased, cells with ``z = W a`` such as ``TanhRNNCell``), ``"snap"`` (sparse RTRL, ``order`` 1 or 2) or
            ``"diagonal_rtrl"`` (exact RTRL for recurrences diagonal by construction: ``LinearRecurrentUnit``,
            element-wise cells that declare ``diagonal_recurrence = True``) or ``"rflo"`` (leaky traces of the
            immediate Jacobian, biased by design; Murray 2019). An estimator that cannot train the cell (a complex
            state for all but ``"diagonal_rtrl"``; a cell whose ``forward`` is not ``activation(W a)`` for
            ``"kf_rtrl"``) refuses it here, naming the estimators that can.
        estimator_options: keyword arguments of the estimator: ``k`` for ``tbptt``; ``projection``,
            ``rescaling``, ``eps`` for ``uoro``; ``order`` for ``snap``; ``eps`` for ``kf_rtrl``; ``tau`` for ``rflo``.
        update_every: steps per parameter update (1: fully online).
        optimizer: ``"sgd"`` or ``"adam"``.
        lr: the optimizer's learning rate.
        seed: seed of the estimator's noise (UORO), independent of the global seed.
        clip_gradient_norm: clip the norm of each update's gradient to this value (``None``: no clipping).
        num_threads: CPU threads (``torch.set_num_threads``) while the Trainer runs this module (fit, validate,
            test, predict; given back at the end, also after an error): ``"auto"`` runs on one thread for cells
            with ``hidden_size <= 256`` on the CPU, whose tiny per-step operations a thread pool slows down (many
            times over on a busy machine, where the pool's threads wait for cores;
            :mod:`~lightning_ortho.models.online.stage_threads`) and leaves torch's count otherwise; an ``int`` sets
            that many; ``None`` leaves torch's count.
        compile: run the steps of each chunk (estimator step, readout step, gradient accumulation) as one compiled
            region, ``torch.compile(fullgraph=True)``, called once per piece of a chunk between two updates (a
            window that ends inside a chunk splits it there; the updates, ``optimizer.step``, run outside). Every
            call has the same number of steps (:func:`~lightning_ortho.models.online.chunk.block_length`), so the
            chunks after the first compile nothing. Worth it on a GPU and with many streams, where each step's
            kernel launches cost more than their arithmetic; on a CPU at one stream the first chunk pays the
            compile time and each call a fixed overhead (see the online guide). Equal to the eager module to
            rounding. Estimators that draw noise run inside their ``noise_scope(state)`` where they have one.
        compile_backend: ``torch.compile``'s backend (``"inductor"``; ``"aot_eager"`` compiles in seconds, for
            tests).
        compile_mode: ``torch.compile``'s mode; ``None``: ``"reduce-overhead"`` (CUDA graphs) for the inductor on
            CUDA (if the inductor cannot capture the steps it warns and they run compiled without CUDA graphs), the
            default mode elsewhere.

    **Host reads.** A chunk's steps read nothing on the host: the mask enters as a tensor (a step where no stream
    scores adds exact zeros), streams restart by a tensor selection, the estimator records NaN/inf on the device
    (``check_every = None``) and out-of-range class targets are recorded too; both records are read together once
    per update window, before its update (and at the end of each epoch for a window still open), and the error
    names the step and the tensor (or the chunk and the classes). What remains per chunk is reading its index
    (``batch["chunk"]``) for the order check, which the stream data modules keep on the CPU
    (:meth:`~lightning_ortho.datamodules.StreamDataModule.transfer_batch_to_device`): on an accelerator it waits for
    nothing queued there.

    Raises:
        ValueError: an argument is invalid (the message says what to set), or the estimator cannot train the cell
            (the message gives the reason and names the estimators that can); when fitting, the data module's
            ``input_size``, ``output_size`` or ``loss`` disagree with the model, or chunks arrive out of order;
            ``compile=True`` with UORO's fixed rescaling whose ``alpha`` is a schedule (a compiled call counts its
            steps from 0, so that one graph serves every call).
    """

    def __init__(
        self,
        cell: nn.Module,
        output_size: int,
        loss: Literal["cross_entropy", "mse"] = "cross_entropy",
        readout: Literal["linear", "units"] = "linear",
        estimator: Literal["uoro", "rtrl", "tbptt", "kf_rtrl", "snap", "diagonal_rtrl", "rflo"] = "uoro",
        estimator_options: dict[str, Any] | None = None,
        update_every: int = 1,
        optimizer: Literal["sgd", "adam"] = "adam",
        lr: float = 1e-3,
        seed: int = 0,
        clip_gradient_norm: float | None = None,
        num_threads: int | Literal["auto"] | None = "auto",
        compile: bool = False,
        compile_backend: str = "inductor",
        compile_mode: str | None = None,
    ) -> None:
        super().__init__()
        _check_arguments(
            cell, output_size, loss, estimator, estimator_options, update_every, optimizer, lr, seed, clip_gradient_norm
        )
        with warnings.catch_warnings():  # the CLI records the cell's class_path and init_args; a module is not kept
            warnings.filterwarnings("ignore", message="Attribute 'cell' is an instance of `nn.Module`")
            self.save_hyperparameters()
        if isinstance(self.hparams.get("cell"), nn.Module):
            del self.hparams["cell"]
            self._hparams_initial.pop("cell", None)
        self.automatic_optimization = False
        self.num_threads = check_num_threads(num_threads)
        self.cell = cell
        self.readout = Readout(readout, cell.hidden_size, output_size, complex_state=_complex_state(cell))
        self.output_size, self.loss_name, self.update_every = output_size, loss, update_every
        self.estimator = build_estimator(estimator, cell, dict(estimator_options or {}), seed)
        self.estimator.check_every = None  # NaN/inf recorded on the device, read once per update window (_update)
        _check_compile(compile, compile_backend, compile_mode, self.estimator)
        self._init_chunks(CompiledSteps(compile_backend, compile_mode) if compile else None)
        self._estimator_threads()
        self._init_evaluation()  # val_* and test_* metrics, the state carried across an evaluation pass
        self.carry = OnlineCarry()  # estimator state, chunk order, update window: between steps and in checkpoints
        self._trained_with: tuple[str, dict[str, Any]] | None = None  # a loaded checkpoint's estimator and options

    def _init_chunks(self, compiled_steps: CompiledSteps | None) -> None:
        """What the training loop keeps between chunks (also for subclasses that build the module themselves)."""
        self._compiled_steps = compiled_steps
        self._plan: tuple[tuple[str, ...], GradientPlan] | None = None
        self._chunk: tuple[Chunk, int, list[torch.Tensor]] | None = None  # this chunk, its first step, its states
        self._last_train_loss: torch.Tensor | None = None
        self._bad_chunk: torch.Tensor | None = None  # see _record_bad_classes

    # -- setup -----------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Check that the data module's ``input_size``, ``output_size`` and ``loss`` (where it has them) agree."""
        data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if data is None:
            return
        found = {name: getattr(data, name, None) for name in ("input_size", "output_size", "loss")}
        cell_input = getattr(self.cell, "input_size", None)
        if found["input_size"] is not None and cell_input is not None and found["input_size"] != cell_input:
            raise ValueError(
                f"OnlineRNNModule: {type(data).__name__} has input_size={found['input_size']} but the cell has"
                f" input_size={cell_input}; set --model.init_args.cell.init_args.input_size={found['input_size']}."
            )
        if found["output_size"] is not None and found["output_size"] != self.output_size:
            raise ValueError(
                f"OnlineRNNModule: {type(data).__name__} has output_size={found['output_size']} but the model has"
                f" output_size={self.output_size}; set --model.init_args.output_size={found['output_size']}."
            )
        if found["loss"] is not None and found["loss"] != self.loss_name:
            raise ValueError(
                f"OnlineRNNModule: {type(data).__name__} is trained with loss={found['loss']!r} but the model has"
                f" loss={self.loss_name!r}; set --model.init_args.loss={found['loss']}."
            )

    def configure_callbacks(self) -> list:
        """The thread count of the run (``num_threads``), set at the stage's setup and given back at its end."""
        self._estimator_threads()
        return [StageThreads(self.num_threads, self.cell.hidden_size)]

    def _estimator_threads(self) -> None:
        # The module's count holds for the estimator's calls too: "auto" is the same rule; a count or None (the
        # user's choice, set for the stage by StageThreads) must not be lowered by the estimator's own "auto".
        self.estimator.num_threads = "auto" if self.num_threads == "auto" else None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = OPTIMIZERS[self.hparams.optimizer]
        return build_optimizer(
            type(self).__name__, optimizer, self.parameters(), lr=self.hparams.lr, alternative="optimizer='sgd'"
        )

    # -- training --------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Run one chunk through the estimator, updating the parameters every ``update_every`` steps.

        The chunk's steps read nothing on the host: the mask enters as a tensor, the estimator records NaN/inf
        (``check_every = None``) and :meth:`_update` reads the record once per update window. The chunk is split
        where a window ends; each piece runs eagerly or, with ``compile=True``, as compiled calls of
        :func:`~lightning_ortho.models.online.chunk.block_length` steps."""
        chunk = self._read(batch, check_classes=False)  # out-of-range classes: recorded, read with the window
        carry = self.carry
        self._begin_chunk(chunk)
        self._record_bad_classes(chunk)
        x = chunk.x.to(self._input_dtype())  # a complex state reads real inputs
        self._chunk = (chunk, carry.state.step, [])  # the error path finds a failing step's h, y and mask here
        block = (
            block_length(chunk.steps, self.update_every, carry.window_steps) if self._compiled_steps else chunk.steps
        )
        losses = []
        start = 0
        while start < chunk.steps:
            # this piece ends where the window does (">=": resumed with a smaller update_every, warned)
            end = min(chunk.steps, start + max(self.update_every - carry.window_steps, 1))
            for a in range(start, end, block):
                b = min(a + block, end)
                losses.append(self._steps(x[:, a:b], chunk.y[:, a:b], chunk.mask[:, a:b], chunk.streams))
            carry.window_steps += end - start
            if carry.window_steps >= self.update_every:
                self._update()
            start = end
        loss_sum = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        self._log_train_loss(loss_sum, chunk)

    def _steps(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, streams: int) -> torch.Tensor:
        """Run the steps of ``x`` ``(b, n, I)`` (eager, or compiled with ``compile=True``), adding their gradient
        to the window's buffers; return their masked loss sum (float64)."""
        carry = self.carry
        pending = self._pending_buffer()
        names = list(pending)
        plan = self._gradient_plan(names)
        buffers = [pending[n] for n in names]
        arguments = (self.estimator, self.readout, self.loss_name, x, y, mask, carry.state, buffers, plan, streams)
        if self._compiled_steps is not None:
            with self._noise_scope(carry.state):
                carry.state, buffers, loss_sum, hs = self._compiled_steps(*arguments)
            carry.pending = dict(zip(names, buffers, strict=True))
        else:
            carry.state, _, loss_sum, hs = run_steps(*arguments)
        self._chunk[2].extend(hs)
        return loss_sum

    def _noise_scope(self, state: OnlineState) -> contextlib.AbstractContextManager:
        """The context the compiled steps run in: the estimator's ``noise_scope(state)`` where it has one (an
        estimator that draws noise from the state's generator moves it into the default generator around a
        compiled call), else nothing."""
        scope = getattr(self.estimator, "noise_scope", None)
        return scope(state) if scope is not None else _NOTHING

    def _gradient_plan(self, names: list[str]) -> GradientPlan:
        key = tuple(names)
        if self._plan is None or self._plan[0] != key:
            readout = [f"readout.{n}" for n, p in self.readout.named_parameters() if p.requires_grad]
            self._plan = (key, GradientPlan(names, readout))
        return self._plan[1]

    def _log_train_loss(self, loss_sum: torch.Tensor, chunk: Chunk) -> None:
        """Log the chunk's loss per scored entry without reading it: a chunk that scores nothing logs nothing new
        (the last value stands), by a tensor selection instead of a host read of the count."""
        count = chunk.mask.sum()
        previous = self._last_train_loss
        if previous is None or previous.device != loss_sum.device:
            previous = torch.full((), math.nan, dtype=torch.float64, device=loss_sum.device)
        mean = torch.where(count > 0, loss_sum / count.clamp(min=1), previous)
        self._last_train_loss = mean
        self.log("train_loss", mean.float(), prog_bar=True, batch_size=chunk.streams, sync_dist=True)
        if self.loss_name == "cross_entropy":
            self.log("train_bits", (mean / math.log(2)).float(), batch_size=chunk.streams, sync_dist=True)

    def _pending_buffer(self) -> dict[str, torch.Tensor]:
        if self.carry.pending is None:
            self.carry.pending = {n: torch.zeros_like(p) for n, p in self.named_parameters() if p.requires_grad}
        return self.carry.pending

    def _update(self) -> None:
        """One optimizer step with the window's gradient: ``manual_backward`` of ``sum_p (p * g_p).sum()``.

        First the window's one host read: the estimator's record of NaN/inf (``estimator.check``), whose error
        names the step and the tensor (and, for a non-finite ``dL/dh``, the module's cause where it finds one)."""
        self._check_window()
        pending = self._pending_buffer()
        surrogate = sum((p * pending[n]).sum() for n, p in self.named_parameters() if n in pending)
        optimizer = self.optimizers()
        self.manual_backward(surrogate)
        optimizer.step()
        optimizer.zero_grad()
        self.carry.pending, self.carry.window_steps = None, 0

    def _record_bad_classes(self, chunk: Chunk) -> None:
        """Record (on the device, no host read) the first training chunk with scored class targets outside
        ``[0, output_size)``: ``_bad_chunk`` holds its index + 1 (0: none)."""
        if chunk.bad_classes is None:
            return
        record = self._bad_chunk
        if record is None or record.device != chunk.bad_classes.device:
            record = self._bad_chunk = torch.zeros(1, dtype=torch.int64, device=chunk.bad_classes.device)
        record.copy_(torch.where((record == 0) & chunk.bad_classes.any(), chunk.index + 1, record))

    def _check_window(self) -> None:
        """The window's one host read: the record of out-of-range class targets and the estimator's NaN/inf record,
        read together. A bad class raises (naming the values if it is in this chunk); an estimator failure raises
        ``estimator.check``'s error, or, for a non-finite ``dL/dh`` at a step of this chunk, the module's cause
        (:func:`~lightning_ortho.models.online.readout.explain_nonfinite_grad_h`) where it finds one."""
        state = self.carry.state
        records = [r for r in (self._bad_chunk, state.health) if r is not None]
        values = torch.cat(records).tolist() if records else []
        if self._bad_chunk is not None and values[0]:
            bad = values[0] - 1
            self._bad_chunk.zero_()  # raised once: a later fit of this model starts with a clear record
            here = self._chunk is not None and self._chunk[0].index == bad
            chunk = self._chunk[0] if here else None
            raise bad_classes_error(
                chunk.y if here else None, chunk.bad_classes if here else None, self.output_size, bad
            )
        if state.health is None or values[-3] == 0:
            return
        try:
            self.estimator.check(state)
        except (ValueError, FloatingPointError) as error:  # the error path: name the cause if the module can
            cause = self._explain(read_failure(state.health))
            if cause is None:
                raise
            raise cause from error

    def _explain(self, failure: tuple[int, int, int] | None) -> Exception | None:
        """The module's cause of a recorded failure of ``grad_h`` (``(step, GRADIENT, 0)``) at a step of the current
        chunk, or ``None``."""
        if failure is None or self._chunk is None or failure[1] != GRADIENT or failure[2] != 0:
            return None
        chunk, first, hs = self._chunk
        t = failure[0] - first - 1
        if not 0 <= t < len(hs):
            return None
        h, y, mask = hs[t], chunk.y[:, t], chunk.mask[:, t]
        _, grad_h, _ = readout_step(self.readout, h, y, mask, self.loss_name, chunk.streams)
        return explain_nonfinite_grad_h(
            grad_h, h, y, mask, self.readout, list(self.named_parameters()), self.global_step, self.hparams.lr
        )

    def on_train_epoch_end(self) -> None:
        """Read the records of the window still open (one host read per epoch): a failure in steps that no update
        has closed yet is raised here, not left unread when the fit ends."""
        if self.carry.state is not None and self.carry.window_steps:
            self._check_window()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Here the gradient is unscaled (16-mixed) and all-reduced (DDP): clip the update that is applied.
        if self.hparams.clip_gradient_norm is not None:
            self.clip_gradients(
                optimizer, gradient_clip_val=self.hparams.clip_gradient_norm, gradient_clip_algorithm="norm"
            )

    def _read(self, batch: dict[str, torch.Tensor], check_classes: bool = True) -> Chunk:
        return read_chunk(
            batch,
            input_size=getattr(self.cell, "input_size", None),
            output_size=self.output_size,
            loss=self.loss_name,
            check_classes=check_classes,
        )

    def _begin_chunk(self, chunk: Chunk) -> None:
        """Check that this chunk is next in order and set the estimator state it continues, resets applied."""
        carry = self.carry
        if carry.restoring:
            carry.restore(*self._rank_and_world(), self._fresh_state, self.device)
            self._warn_if_trained_with_other_options()
            if carry.window_steps >= self.update_every:
                rank_zero_warn(
                    f"OnlineRNNModule: the checkpoint's update window already holds {carry.window_steps} steps but"
                    f" update_every={self.update_every}: the first update after resuming applies the gradient of"
                    f" {carry.window_steps + 1} steps, then every {self.update_every} steps. Resume with the"
                    " update_every the checkpoint was trained with to continue exactly."
                )
        if carry.state is not None and chunk.index not in (0, carry.next_chunk):
            raise ValueError(
                f"OnlineRNNModule: training chunk {chunk.index} arrived where chunk {carry.next_chunk} was expected."
                " Online training carries the recurrent state from one chunk to the next, so chunks must arrive in"
                " time order: the training loader must not shuffle, drop or reorder them (no shuffle=True or"
                " sampler; use a StreamDataModule or an IterableDataset yielding chunks in order, num_workers=0)."
            )
        if carry.state is not None and chunk.streams != carry.state.batch_size:
            raise ValueError(
                f"OnlineRNNModule: this chunk has {chunk.streams} streams, the previous ones had"
                f" {carry.state.batch_size}; the number of streams per process must stay the same."
            )
        if carry.state is None or chunk.index == 0:
            carry.state = self._fresh_state(chunk.streams)
        carry.next_chunk = chunk.index + 1
        # Unconditionally (a stream that does not restart keeps its values): deciding would read reset on the host.
        carry.state = self.estimator.reset(carry.state, chunk.reset.to(self.device))

    def _warn_if_trained_with_other_options(self) -> None:
        """Warn (rank zero) when the checkpoint's estimator was built with other ``estimator_options``: its state
        loads (the shapes fit) but continues under options it was not made with, e.g. another truncation ``k``."""
        trained, self._trained_with = self._trained_with, None
        if trained is None or trained[0] != self.hparams.estimator:
            return  # another estimator is refused by the state's own check
        saved, mine = trained[1], dict(self.hparams.estimator_options or {})
        # Compared with the estimator's defaults filled in: {} and the defaults spelt out build the same estimator.
        differ = differing_options(trained[0], saved, mine)
        if differ:
            rank_zero_warn(
                f"OnlineRNNModule: the checkpoint was trained with estimator={trained[0]!r} and"
                f" estimator_options={saved!r}, this model has estimator_options={mine!r} ({differ}): the saved"
                " estimator state (e.g. the truncation window, UORO's rescaling) continues under the new options, so"
                " the run does not continue as the checkpoint's would. Resume with the checkpoint's"
                " estimator_options to continue exactly."
            )

    def _fresh_state(self, streams: int) -> OnlineState:
        return initial_state(self.estimator, self._zero_state(streams), *self._rank_and_world())

    def _input_dtype(self) -> torch.dtype:
        """The dtype the cell reads its inputs in: its parameters' (real also for a complex state)."""
        return next(self.cell.parameters()).dtype

    def _zero_state(self, streams: int) -> torch.Tensor:
        """Zeros ``(streams, H)`` in the state's dtype: the parameters', or its complex counterpart for a cell with a
        complex state (``complex_state = True``, e.g. ``LinearRecurrentUnit``)."""
        parameter = next(self.cell.parameters())
        dtype = parameter.dtype
        if _complex_state(self.cell):
            dtype = (torch.zeros((), dtype=dtype) * 1j).dtype  # float32 -> complex64, float64 -> complex128
        return torch.zeros(streams, self.cell.hidden_size, dtype=dtype, device=parameter.device)

    def _rank_and_world(self) -> tuple[int, int]:
        if self._trainer is None:
            return 0, 1
        return int(self.trainer.global_rank), int(self.trainer.world_size)

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the cell over ``x`` ``(B, T, I)`` from ``h0`` ``(B, H)`` (zeros by default): the readout's outputs
        ``(B, T, output_size)`` and the last state ``(B, H)``. The cell runs outside autocast."""
        h = self._zero_state(x.shape[0]) if h0 is None else h0
        x = x.to(h.real.dtype)  # a complex state reads real inputs
        outputs = []
        for t in range(x.shape[1]):
            with _no_autocast(x):
                h = self.cell(x[:, t], h)
            outputs.append(self.readout(h))
        return torch.stack(outputs, 1), h

    # -- checkpoints -----------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the carry (:class:`~lightning_ortho.models.online.carry.OnlineCarry`): every process's part."""
        checkpoint[_CHECKPOINT_KEY] = self.carry.checkpoint(*self._rank_and_world())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Take the saved carry; it is applied at the next training step, on the devices of that run."""
        if _CHECKPOINT_KEY in checkpoint:
            self.carry.load(checkpoint[_CHECKPOINT_KEY])
            trained = checkpoint.get("hyper_parameters") or {}
            if "estimator" in trained:  # compared with this model's at the resumed training's first chunk
                self._trained_with = (trained["estimator"], dict(trained.get("estimator_options") or {}))


def _complex_state(cell: nn.Module) -> bool:
    """Whether ``cell``'s state is complex (it says so with ``complex_state = True``)."""
    return bool(getattr(cell, "complex_state", False))


def _check_arguments(
    cell, output_size, loss, estimator, estimator_options, update_every, optimizer, lr, seed, clip
) -> None:
    where = "OnlineRNNModule"
    if not isinstance(cell, nn.Module) or not isinstance(getattr(cell, "hidden_size", None), int):
        raise ValueError(
            f"{where}: cell must be an nn.Module with cell(x, h) -> h_new and an int hidden_size attribute (e.g."
            f" lightning_ortho.online.TanhRNNCell), got {type(cell).__name__}."
        )
    if not any(True for _ in cell.parameters()):
        raise ValueError(f"{where}: the cell {type(cell).__name__} has no parameters to train.")
    for name, value in (("output_size", output_size), ("update_every", update_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}.")
    choices = (
        ("loss", loss, LOSSES),
        ("estimator", estimator, ESTIMATORS),
        ("optimizer", optimizer, tuple(OPTIMIZERS)),
    )
    for name, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"{where}: {name} must be one of {allowed}, got {value!r}.")
    if estimator_options is not None and not isinstance(estimator_options, dict):
        raise ValueError(
            f"{where}: estimator_options must be a dict of the estimator's keyword arguments, got {estimator_options!r}."
        )
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"{where}: lr must be a positive number, got {lr!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{where}: seed must be a non-negative integer (the estimator's noise), got {seed!r}.")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
        raise ValueError(f"{where}: clip_gradient_norm must be a positive number or None (no clipping), got {clip!r}.")


def _check_compile(compile, backend, mode, estimator) -> None:
    where = "OnlineRNNModule"
    if not isinstance(compile, bool):
        raise ValueError(f"{where}: compile must be True or False, got {compile!r}.")
    if not isinstance(backend, str) or not backend:
        raise ValueError(
            f"{where}: compile_backend must be a torch.compile backend's name, e.g. 'inductor', got {backend!r}."
        )
    if mode is not None and not isinstance(mode, str):
        raise ValueError(
            f"{where}: compile_mode must be None or a torch.compile mode, e.g. 'reduce-overhead', got {mode!r}."
        )
    alpha = getattr(estimator, "alpha", None)
    if compile and alpha is not None and not isinstance(alpha, (int, float)):
        # A compiled call counts its steps from 0 (one graph for every call), so a schedule alpha(step) cannot run.
        raise ValueError(
            f"{where}: compile=True needs a constant UORO alpha (a compiled call does not know the step number), got"
            f" a schedule {type(alpha).__name__}; use a number, or compile=False."
        )
