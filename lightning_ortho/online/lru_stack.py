"""A stack of linear recurrent units trained online (Zucchet, Meier, Schug, Mujika & Sacramento 2023, "Online
learning of long-range dependencies", NeurIPS 2023).

The network (:class:`LRUStack`): an encoder ``Linear(input_size, model_size)``, ``layers`` blocks
(:class:`LRUBlock`) and a decoder ``Linear(model_size, output_size)``. Each block is the layer of Orvieto et al.
2023 that Zucchet et al. stack, kept simple: with ``u`` the block's input ``(B, model_size)``,

    z_t = LayerNorm(u_t)                              (pre-normalisation)
    h_t = lambda * h_{t-1} + gamma * (B z_t)          (LinearRecurrentUnit, complex (B, hidden_size))
    v_t = Re(C h_t) + D * z_t                         (LinearRecurrentUnit.output)
    u'_t = u_t + W_2 GELU(W_1 v_t + b_1) + b_2        (position-wise GELU MLP, residual connection)

The online gradient (:class:`OnlineLRUStack`), Zucchet et al.'s approximation: at step ``t``, with the per-step loss
``L_t(y_t)``,

* the error reaching block ``l`` is ``delta^l_t = dL_t/dh^l_t`` backpropagated through the blocks above at step
  ``t`` only (spatial backprop: autograd inside the time step, every ``h^k_{t-1}`` a constant);
* the recurrent parameters of block ``l`` (``nu_log, theta_log, gamma_log, B_re, B_im``) get
  ``Re(conj(delta^l_t) e^l_t)`` with the exact in-block RTRL traces ``e^l_t = dh^l_t/dtheta_l``
  (:class:`~lightning_ortho.online.diagonal_rtrl.DiagonalRTRL`, closed forms
  :class:`~lightning_ortho.online.lru.LRUTraces`), which keep every path through block ``l``'s own recurrence;
* every other parameter (encoder, decoder, LayerNorms, MLPs, the LRUs' ``C`` and ``D``) gets its immediate
  gradient ``dL_t/dphi`` through step ``t`` only.

What is dropped: every path that, after leaving block ``l`` upwards at some step ``s``, runs through the recurrence
of a block above (``h^k_s -> h^k_t``, ``k > l``), and for the non-recurrent parameters feeding a recurrence (the
encoder, the LayerNorms, the MLPs below the top block) their influence on later steps. With one block the estimate
equals backprop through time for every parameter from the LRU's state upwards (its own recurrent parameters,
``C``, ``D``, the MLP, the decoder) and is the immediate gradient for the encoder and the block's LayerNorm. Memory
and time per step: the traces (``O(P_lru)`` per stream) and one forward and backward pass of the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lightning_ortho.online.diagonal_rtrl import ComplexOnlineState, DiagonalRTRL
from lightning_ortho.online.lru import LinearRecurrentUnit
from lightning_ortho.online.threads import ThreadSetting, call_thread_count, check_num_threads

#: The LRU parameters that enter its state (RTRL traces); ``C_re``, ``C_im`` and ``D`` enter only its output.
STATE_PARAMETERS = ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")


def _positive_int(owner: str, name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}.")
    return value


class LRUBlock(nn.Module):
    """One block: ``z = LayerNorm(u)``, ``h' = lru(z, h)``, ``u' = u + MLP(lru.output(h', z))`` (module docstring).

    ``forward(u, h)`` takes ``u`` ``(B, model_size)`` real and ``h`` ``(B, hidden_size)`` complex and returns
    ``(u', h')``."""

    def __init__(self, model_size: int, hidden_size: int, mlp_size: int, **ring: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(model_size)
        self.lru = LinearRecurrentUnit(model_size, hidden_size, **ring)
        self.mlp = nn.Sequential(nn.Linear(model_size, mlp_size), nn.GELU(), nn.Linear(mlp_size, model_size))

    def readout(self, u: torch.Tensor, z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``u + MLP(Re(C h) + D * z)`` ``(B, model_size)`` from the new state ``h`` and the LRU's input ``z``."""
        return u + self.mlp(self.lru.output(h, z))

    def forward(self, u: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.norm(u)
        h_new = self.lru(z, h)
        return self.readout(u, z, h_new), h_new


class LRUStack(nn.Module):
    """Encoder, ``layers`` :class:`LRUBlock` and decoder (Zucchet et al. 2023's network; module docstring).

    Args:
        input_size: features of ``x_t``.
        hidden_size: units of each LRU's complex state.
        output_size: features of ``y_t``.
        layers: number of blocks.
        model_size: width between the blocks (each LRU's input and output size); ``hidden_size`` when ``None``.
        mlp_size: hidden width of each block's MLP; ``2 * model_size`` when ``None``.
        r_min: inner radius of the LRUs' ring of initial eigenvalues (:class:`LinearRecurrentUnit`).
        r_max: outer radius of that ring.
        max_phase: largest initial phase of the eigenvalues.

    Raises:
        ValueError: a size is not a positive integer, or the ring is invalid (:class:`LinearRecurrentUnit`).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        layers: int,
        *,
        model_size: int | None = None,
        mlp_size: int | None = None,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
    ) -> None:
        super().__init__()
        model_size = hidden_size if model_size is None else model_size
        mlp_size = 2 * model_size if mlp_size is None else mlp_size
        sizes = dict(input_size=input_size, hidden_size=hidden_size, output_size=output_size, layers=layers)
        for name, value in {**sizes, "model_size": model_size, "mlp_size": mlp_size}.items():
            _positive_int("LRUStack", name, value)
        self.input_size, self.hidden_size, self.output_size = input_size, hidden_size, output_size
        self.model_size, self.mlp_size = model_size, mlp_size
        self.encoder = nn.Linear(input_size, model_size)
        ring = dict(r_min=r_min, r_max=r_max, max_phase=max_phase)
        self.layers = nn.ModuleList(LRUBlock(model_size, hidden_size, mlp_size, **ring) for _ in range(layers))
        self.decoder = nn.Linear(model_size, output_size)

    def initial_states(self, batch_size: int) -> list[torch.Tensor]:
        """Zero states, one ``(batch_size, hidden_size)`` complex tensor per block."""
        _positive_int("LRUStack.initial_states", "batch_size", batch_size)
        ref = self.decoder.weight
        dtype = self.layers[0].lru.state_dtype()
        return [torch.zeros(batch_size, self.hidden_size, dtype=dtype, device=ref.device) for _ in self.layers]

    def step(self, x: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One time step: ``x`` ``(B, input_size)``, ``states`` one ``(B, hidden_size)`` complex per block ->
        ``(y (B, output_size), new states)``, differentiable (autograd) in everything."""
        u, new = self.encoder(x), []
        for block, h in zip(self.layers, states, strict=True):
            u, h = block(u, h)
            new.append(h)
        return self.decoder(u), new

    def forward(
        self, xs: torch.Tensor, states: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The whole sequence: ``xs`` ``(T, B, input_size)`` -> ``(ys (T, B, output_size), final states)``; starts
        from zero states when ``states`` is ``None``. Autograd through it is backprop through time.

        Raises:
            ValueError: ``xs`` is not a ``(T, B, input_size)`` tensor of the parameters' dtype, or ``states`` is not
                one ``(B, hidden_size)`` tensor per block.
        """
        weight = self.encoder.weight
        if not isinstance(xs, torch.Tensor) or xs.dim() != 3 or xs.shape[2] != self.input_size or xs.shape[1] < 1:
            got = tuple(xs.shape) if isinstance(xs, torch.Tensor) else type(xs).__name__
            raise ValueError(f"LRUStack: xs must have shape (T, B >= 1, {self.input_size}) (time first), got {got}.")
        if xs.dtype != weight.dtype:
            raise ValueError(f"LRUStack: xs is {xs.dtype}, the parameters {weight.dtype}; convert one of them.")
        states = self.initial_states(xs.shape[1]) if states is None else list(states)
        want = (xs.shape[1], self.hidden_size)
        if len(states) != len(self.layers) or any(tuple(h.shape) != want for h in states):
            raise ValueError(f"LRUStack: states must be {len(self.layers)} tensors of shape {want}, one per block.")
        ys = []
        for x in xs:
            y, states = self.step(x, states)
            ys.append(y)
        return torch.stack(ys), states


class LRUStackState:
    """The online state of :class:`OnlineLRUStack`: one
    :class:`~lightning_ortho.online.diagonal_rtrl.ComplexOnlineState` per block (``h^l_t`` and its traces), plus
    the graph of the last step (until :meth:`OnlineLRUStack.gradient`; never saved).

    ``state_dict()`` holds the blocks' states; ``load_state_dict`` restores them bit-exactly, all or none.
    """

    def __init__(self, layers: list[ComplexOnlineState], pending: tuple | None = None) -> None:
        self.layers = list(layers)
        self.pending = pending  # (y_t, [h^l_t in the step's graph]) or None

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    @property
    def step(self) -> int:
        return self.layers[0].step

    @property
    def health(self) -> None:
        """No record of NaN/inf to read later (:attr:`OnlineState.health`): :class:`OnlineLRUStack` checks its
        inputs and the blocks at every call and raises from the call that meets NaN/inf."""
        return None

    @property
    def kind(self) -> str:
        """The name of the estimator that made the state, as ``OnlineState.kind``: ``OnlineLRUStack.name``."""
        return OnlineLRUStack.name

    @property
    def h(self) -> list[torch.Tensor]:
        """The blocks' states ``h^l_t``, ``(B, hidden_size)`` complex each."""
        return [s.h for s in self.layers]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": OnlineLRUStack.name, "layers": [s.state_dict() for s in self.layers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the graph of the last step is dropped (take the step's gradient first).

        Raises:
            ValueError: ``state`` is not a state_dict of an :class:`OnlineLRUStack` with as many blocks, or a block's
                state does not fit (``ComplexOnlineState.load_state_dict``: shapes, NaN/inf); this state is then left
                as it was.
        """
        where = "LRUStackState.load_state_dict"
        if not isinstance(state, dict) or state.get("kind") != OnlineLRUStack.name or "layers" not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{where}: expected LRUStackState.state_dict() (kind {OnlineLRUStack.name!r}), got {got}.")
        saved = state["layers"]
        if not isinstance(saved, list | tuple) or len(saved) != len(self.layers):
            count = len(saved) if isinstance(saved, list | tuple) else type(saved).__name__
            raise ValueError(
                f"{where}: the saved state has {count} blocks, this one {len(self.layers)}; make the state to load"
                " into with initial_state of an OnlineLRUStack of the same model."
            )
        fresh = [layer.replace() for layer in self.layers]  # loaded apart: this state is untouched on any error
        for layer, entry in zip(fresh, saved, strict=True):
            layer.load_state_dict(entry)
        self.layers, self.pending = fresh, None


class OnlineLRUStack:
    """Online training of an :class:`LRUStack` with Zucchet et al. 2023's gradient (the module docstring says which).

        online = OnlineLRUStack(model)                 # after model.double() / .to(device)
        state = online.initial_state(streams)
        y, state = online.step(x_t, state)             # x_t (B, input_size) -> y_t (B, output_size)
        grads = online.gradient(state, dL_t/dy_t)      # {name: tensor} like model.named_parameters(), summed
        online.backward(state, loss_t)                 # or: accumulate into p.grad from a loss of y_t

    ``step`` advances every block's state and traces and, when autograd is enabled, keeps the step's graph (each
    ``h^k_{t-1}`` a constant) in the returned state for ``gradient`` / ``backward``; under ``torch.no_grad()`` it only advances (evaluation).
    Summing ``gradient`` over ``t`` estimates the gradient of ``sum_t L_t``. Do not call ``loss.backward()`` on
    ``y_t`` yourself: it would give the recurrent parameters their immediate gradient only.

    Args:
        model: the :class:`LRUStack` to train (its dtype and device already set).
        closed_form: take each LRU's traces from its closed form, as
            :class:`~lightning_ortho.online.DiagonalRTRL`; ``False`` forces the generic ``torch.func`` path.

    Raises:
        TypeError: ``model`` is not an :class:`LRUStack`.

    Attributes:
        num_threads: CPU threads for each ``step``, ``gradient`` and ``backward`` call, as
            :attr:`~lightning_ortho.online.OnlineGradientEstimator.num_threads` (``"auto"``: one thread when every
            width of the model is at most 256, unless the user chose a count; an ``int``; ``None`` leaves torch's).
    """

    name = "lru_stack_online"

    def __init__(self, model: LRUStack, *, closed_form: bool = True) -> None:
        if not isinstance(model, LRUStack):
            raise TypeError(f"OnlineLRUStack: model must be an LRUStack, got {type(model).__name__}.")
        self.model = model
        self.estimators = [DiagonalRTRL(block.lru, closed_form=closed_form) for block in model.layers]
        self.recurrent = {
            f"layers.{i}.lru.{n}": (i, n) for i in range(len(model.layers)) for n in STATE_PARAMETERS
        }  # parameter name -> (block, LRU parameter name)
        self.immediate = [(n, p) for n, p in model.named_parameters() if n not in self.recurrent]
        self.num_threads = "auto"

    @property
    def num_threads(self) -> ThreadSetting:
        """CPU threads for each ``step``, ``gradient`` and ``backward`` call: ``"auto"``, a positive ``int`` or
        ``None`` (see the class docstring's Attributes). Setting another value raises ``ValueError``."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, value: ThreadSetting) -> None:
        self._num_threads = check_num_threads(value, "OnlineLRUStack")

    @contextmanager
    def _threads(self) -> Iterator[None]:
        """Run the block on :attr:`num_threads` threads (torch's count is given back on exit, also on errors)."""
        model = self.model
        width = max(model.hidden_size, model.model_size, model.mlp_size)
        count = call_thread_count(self._num_threads, width, model.encoder.weight.device)
        previous = torch.get_num_threads()
        if count is not None:
            torch.set_num_threads(count)
        try:
            yield
        finally:
            if count is not None:
                torch.set_num_threads(previous)

    def initial_state(self, batch_size: int) -> LRUStackState:
        """Zero states and traces for ``batch_size`` streams."""
        h0 = self.model.initial_states(batch_size)
        return LRUStackState([est.initial_state(h) for est, h in zip(self.estimators, h0, strict=True)])

    def step(self, x: torch.Tensor, state: LRUStackState) -> tuple[torch.Tensor, LRUStackState]:
        """Advance every stream one step: ``x`` ``(B, input_size)`` -> ``(y_t (B, output_size), new state)``.

        Raises:
            ValueError: ``state`` is not this model's (blocks, streams), or ``x`` is not a finite ``(B,
                input_size)`` tensor of the parameters' dtype and device.
            FloatingPointError: a block's state or traces overflow (from ``DiagonalRTRL.step``).
        """
        self._check_state(state, "step")
        self._check_tensor(x, "x", (state.batch_size, self.model.input_size))
        record = torch.is_grad_enabled()
        layers, hs = [], []
        with self._threads():
            u = self.model.encoder(x)
            for block, est, layer in zip(self.model.layers, self.estimators, state.layers, strict=True):
                z = block.norm(u)
                _, new = est.step(z.detach(), layer)  # h^l_t and the exact traces e^l_t (no graph)
                h = block.lru(z, layer.h) if record else new.h  # in the step's graph: h^l_{t-1} is a constant
                u = block.readout(u, z, h)
                layers.append(new)
                hs.append(h)
            y = self.model.decoder(u)
        return y, LRUStackState(layers, (y, hs) if record else None)

    def gradient(self, state: LRUStackState, grad_y: torch.Tensor) -> dict[str, torch.Tensor]:
        """The estimate of ``dL_t/dtheta`` given ``grad_y = dL_t/dy_t`` ``(B, output_size)`` for the state's last
        step, summed over the streams (no per-stream form): ``{name: tensor}`` for every parameter of the model
        (module docstring).

        Raises:
            ValueError: the state holds no step graph (stepped under ``torch.no_grad()``, reset or loaded since),
                or ``grad_y`` is not a finite ``(B, output_size)`` tensor like ``y_t``.
            FloatingPointError: an estimate is NaN/inf (from ``DiagonalRTRL.gradient``).
        """
        self._check_state(state, "gradient")
        y, hs = self._pending(state)
        self._check_tensor(grad_y, "grad_y", tuple(y.shape))
        params = [p for _, p in self.immediate]
        with self._threads():
            found = torch.autograd.grad(y, params + hs, grad_y, retain_graph=True, allow_unused=True)
            found = [torch.zeros_like(t) if g is None else g for g, t in zip(found, params + hs, strict=True)]
            errors = found[len(params) :]  # delta^l_t = dL_t/dh^l_t through the blocks above at step t
            traced = [est.gradient(s, d) for est, s, d in zip(self.estimators, state.layers, errors, strict=True)]
        grads = {name: g for (name, _), g in zip(self.immediate, found[: len(params)], strict=True)}
        for name, (block, inner) in self.recurrent.items():
            grads[name] = traced[block][inner]
        return {name: grads[name] for name, _ in self.model.named_parameters()}

    def backward(self, state: LRUStackState, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """:meth:`gradient` for a scalar ``loss`` computed from the ``y_t`` that the last :meth:`step` returned,
        added into every parameter's ``.grad`` (like ``loss.backward()``); returns the step's gradients too.

        Raises:
            ValueError: ``loss`` is not a finite scalar tensor that depends on ``y_t``, or :meth:`gradient`'s.
        """
        self._check_state(state, "backward")
        y, _ = self._pending(state)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            got = f"{tuple(loss.shape)}, requires_grad={loss.requires_grad}" if isinstance(loss, torch.Tensor) else loss
            raise ValueError(f"OnlineLRUStack.backward: loss must be a scalar tensor computed from y_t, got {got}.")
        with self._threads():
            (grad_y,) = torch.autograd.grad(loss, y, retain_graph=True, allow_unused=True)
        if grad_y is None:
            raise ValueError("OnlineLRUStack.backward: the loss does not depend on the y_t of the state's last step.")
        grads = self.gradient(state, grad_y)
        for name, p in self.model.named_parameters():
            p.grad = grads[name].clone() if p.grad is None else p.grad + grads[name]
        return grads

    def reset(self, state: LRUStackState, mask: torch.Tensor) -> LRUStackState:
        """Restart the streams where ``mask`` ``(B,)`` is true: zero states and traces in every block; the others
        are untouched. The last step's graph is dropped (take its gradient before resetting).

        Raises:
            ValueError: ``mask`` is not a boolean ``(B,)`` tensor.
        """
        self._check_state(state, "reset")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (state.batch_size,):
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(
                f"OnlineLRUStack.reset: mask must be a bool tensor of shape ({state.batch_size},), got {got}."
            )
        return LRUStackState([est.reset(s, mask) for est, s in zip(self.estimators, state.layers, strict=True)])

    # -- checks -----------------------------------------------------------------------------------------------------
    def _check_state(self, state: Any, where: str) -> None:
        if not isinstance(state, LRUStackState) or len(state.layers) != len(self.estimators):
            got = f"{len(state.layers)} blocks" if isinstance(state, LRUStackState) else type(state).__name__
            raise ValueError(
                f"OnlineLRUStack.{where}: state must be an LRUStackState of {len(self.estimators)} blocks from"
                f" initial_state, got {got}."
            )

    @staticmethod
    def _pending(state: LRUStackState) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if state.pending is None:
            raise ValueError(
                "OnlineLRUStack: this state holds no step to differentiate: it was stepped under torch.no_grad(), or"
                " reset or loaded since its step; call gradient/backward on the state that step() returned."
            )
        return state.pending

    def _check_tensor(self, value: Any, name: str, shape: tuple[int, ...]) -> None:
        weight = self.model.encoder.weight
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"OnlineLRUStack: {name} must have shape {shape} (streams, features), got {got}.")
        if value.dtype != weight.dtype or value.device != weight.device:
            raise ValueError(
                f"OnlineLRUStack: {name} is {value.dtype} on {value.device}, the model's parameters {weight.dtype} on"
                f" {weight.device}; convert one of them (e.g. model.double() for float64)."
            )
        if not value.is_meta and not bool(torch.isfinite(value).all()):  # meta: no values (shape inference)
            raise ValueError(f"OnlineLRUStack: {name} holds NaN/inf values.")
