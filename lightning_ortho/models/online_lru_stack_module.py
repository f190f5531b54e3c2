"""Online training of a stack of linear recurrent units in Lightning: the training, checkpoints and evaluation of
:class:`~lightning_ortho.models.OnlineRNNModule`, with an :class:`~lightning_ortho.online.LRUStack` in the cell's
place, trained by :class:`~lightning_ortho.online.OnlineLRUStack` (Zucchet et al. 2023)."""

from __future__ import annotations

import warnings
from typing import Literal

import torch

from lightning_ortho.models.online.carry import OnlineCarry
from lightning_ortho.models.online.readout import Readout
from lightning_ortho.models.online.stage_threads import StageThreads, check_num_threads
from lightning_ortho.models.online_rnn_module import OnlineRNNModule, _check_arguments, _no_autocast
from lightning_ortho.online.lru_stack import LRUStack, LRUStackState, OnlineLRUStack


class OnlineLRUStackModule(OnlineRNNModule):
    """An :class:`~lightning_ortho.online.LRUStack` (encoder, LRU blocks, decoder) trained online on ordered chunks
    of parallel streams by :class:`~lightning_ortho.online.OnlineLRUStack`: exact RTRL traces within each block,
    backprop between the blocks within a step (Zucchet et al. 2023; :mod:`lightning_ortho.online.lru_stack` says
    which paths the estimate keeps).

    Everything but the network is :class:`~lightning_ortho.models.OnlineRNNModule`'s, which this class extends:
    for each step ``t`` the stack advances (``y_t, state = OnlineLRUStack.step(x_t, state)``), the loss ``L_t`` of
    the stack's outputs ``y_t`` ``(b, output_size)`` (its decoder is the readout: no readout of the module's own)
    gives ``dL_t/dy_t`` in closed form, and ``OnlineLRUStack.gradient(state, dL_t/dy_t)`` (every parameter of the
    stack) is added to the update window's buffer, which reaches the parameters every ``update_every`` steps
    through one ``manual_backward``. The same normalisation (``L_t`` = the masked per-entry loss summed over the
    step's entries / ``b`` streams), chunk order, DDP, logged metrics (``train_loss``, ``val_loss``, ``test_loss``
    and ``*_bits`` for cross-entropy), checkpoints (every process's block states and traces, the next chunk, the
    open update window: fitting ``N`` chunks equals fitting ``k`` and resuming for ``N - k``, bit for bit) and
    evaluation (the stack run forward from zero states on each pass, carried across the pass's chunks).

    Outside Lightning, ``model(x, h0)`` runs the stack over ``x`` ``(B, T, input_size)`` (:meth:`forward`).

    Args:
        cell: the :class:`~lightning_ortho.online.LRUStack` to train, in its dtype and device (the argument has the
            name of :class:`~lightning_ortho.models.OnlineRNNModule`'s, so ``lightning-ortho`` fills in the data
            module's ``input_size`` as for a cell: ``--model.init_args.cell.init_args.hidden_size=64``). The
            model's ``output_size`` is the stack's, checked against the data module's when fitting.
        loss: ``"cross_entropy"`` or ``"mse"``, of the stack's outputs.
        update_every: steps per parameter update (1: fully online).
        optimizer: ``"sgd"`` or ``"adam"``.
        lr: the optimizer's learning rate.
        clip_gradient_norm: clip the norm of each update's gradient to this value (``None``: no clipping).
        num_threads: CPU threads while the Trainer runs this module, as
            :class:`~lightning_ortho.models.OnlineRNNModule`'s (``"auto"``: one thread when every width of the stack,
            ``hidden_size``, ``model_size`` and ``mlp_size``, is at most 256 on the CPU).

    Raises:
        ValueError: ``cell`` is not an :class:`~lightning_ortho.online.LRUStack`, or another argument is invalid
            (the message says what to set); when fitting, the data module's ``output_size`` is not the stack's, or as
            :class:`~lightning_ortho.models.OnlineRNNModule` (its input size or loss disagree, chunks out of order).
    """

    def __init__(
        self,
        cell: LRUStack,
        loss: Literal["cross_entropy", "mse"] = "cross_entropy",
        update_every: int = 1,
        optimizer: Literal["sgd", "adam"] = "adam",
        lr: float = 1e-3,
        clip_gradient_norm: float | None = None,
        num_threads: int | Literal["auto"] | None = "auto",
    ) -> None:
        # LightningModule's constructor, not OnlineRNNModule's: that one builds an estimator of a cell by name.
        super(OnlineRNNModule, self).__init__()
        if not isinstance(cell, LRUStack):
            raise ValueError(
                f"OnlineLRUStackModule: cell must be a lightning_ortho.online.LRUStack, got {type(cell).__name__};"
                " train a recurrent cell with OnlineRNNModule."
            )
        _check_arguments(  # OnlineRNNModule's checks of the options they share (the blocks' traces: diagonal RTRL)
            cell=cell, output_size=cell.output_size, loss=loss, estimator="diagonal_rtrl", estimator_options=None,
            update_every=update_every, optimizer=optimizer, lr=lr, seed=0, clip=clip_gradient_norm,
        )  # fmt: skip
        with warnings.catch_warnings():  # the CLI records the cell's class_path and init_args; a module is not kept
            warnings.filterwarnings("ignore", message="Attribute 'cell' is an instance of `nn.Module`")
            self.save_hyperparameters()
        if isinstance(self.hparams.get("cell"), torch.nn.Module):
            del self.hparams["cell"]
            self._hparams_initial.pop("cell", None)
        self.automatic_optimization = False
        self.num_threads = check_num_threads(num_threads)
        self.cell = cell
        # The stack's decoder is the readout: the loss reads y_t itself ("units": all of its output_size features).
        self.readout = Readout("units", cell.output_size, cell.output_size)
        self.output_size, self.loss_name, self.update_every = cell.output_size, loss, update_every
        self.estimator = OnlineLRUStack(cell)
        self._init_chunks(None)  # eager steps: OnlineLRUStack backpropagates through the blocks inside a step
        self._estimator_threads()
        self._init_evaluation()
        self.carry = OnlineCarry()
        self._trained_with = None  # no estimator options to compare on resume

    def setup(self, stage: str) -> None:
        """Check that the data module's ``output_size`` (where it has one) is the stack's, then its ``input_size``
        and ``loss`` as :class:`~lightning_ortho.models.OnlineRNNModule` does."""
        data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        found = getattr(data, "output_size", None)
        if found is not None and found != self.output_size:
            raise ValueError(
                f"OnlineLRUStackModule: {type(data).__name__} has output_size={found} but the stack has"
                f" output_size={self.output_size}; set --model.init_args.cell.init_args.output_size={found}."
            )
        super().setup(stage)

    def configure_callbacks(self) -> list:
        """The thread count of the run (``num_threads``) for the stack's widest layer, set at the stage's setup and
        given back at its end."""
        self._estimator_threads()
        stack = self.cell
        return [StageThreads(self.num_threads, max(stack.hidden_size, stack.model_size, stack.mlp_size))]

    def _fresh_state(self, streams: int) -> LRUStackState:
        return self.estimator.initial_state(streams)  # no noise: the same for every process of a DDP run

    def _zero_state(self, streams: int) -> torch.Tensor:
        """Zero states of the blocks side by side, ``(streams, layers * hidden_size)`` complex: the state an
        evaluation pass carries (:meth:`forward`)."""
        return torch.cat(self.cell.initial_states(streams), 1)

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the stack over ``x`` ``(B, T, input_size)`` from ``h0`` (zeros by default), the blocks' states side by
        side ``(B, layers * hidden_size)`` complex: the outputs ``(B, T, output_size)`` and the last states like
        ``h0``. The stack runs outside autocast, as in training.

        Raises:
            ValueError: ``h0`` is not a ``(B, layers * hidden_size)`` tensor of the stack's complex dtype.
        """
        stack = self.cell
        h = self._zero_state(x.shape[0]) if h0 is None else h0
        want = (x.shape[0], len(stack.layers) * stack.hidden_size)
        if not isinstance(h, torch.Tensor) or tuple(h.shape) != want or h.dtype != stack.layers[0].lru.state_dtype():
            got = f"{h.dtype} {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__
            raise ValueError(
                f"OnlineLRUStackModule: h0 must be the blocks' states side by side, {stack.layers[0].lru.state_dtype()}"
                f" {want} (streams, layers * hidden_size), got {got}."
            )
        x = x.to(self._input_dtype())
        states, outputs = list(h.chunk(len(stack.layers), 1)), []
        with _no_autocast(x):
            for t in range(x.shape[1]):
                y, states = stack.step(x[:, t], states)
                outputs.append(y)
        return torch.stack(outputs, 1), torch.cat(states, 1)
