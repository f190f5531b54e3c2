"""Kronecker-factored RTRL (Mujika, Meier & Steger 2018, "Approximating Real-Time Recurrent Learning with Random
Kronecker Factors", NeurIPS): an unbiased estimate of RTRL's influence matrix as one Kronecker product per stream.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from lightning_ortho._native.guard import real_cpu
from lightning_ortho._native.kf_rtrl import kf_rtrl_kernels, step, summed_estimate
from lightning_ortho._native.tanh_cell import TanhParameters
from lightning_ortho.online.cells import TanhRNNCell
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator
from lightning_ortho.online.linearization import (
    StepLinearization,
    factorisation_problem,
    flatten_weight,
    weight_columns,
    weight_rows,
)
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.stream_noise import StreamNoise, check_eps, check_generator
from lightning_ortho.online.uoro_fused import NOTHING_MADE, fusable_tanh_cell

__all__ = ["KFRTRL"]

_FACTORS = ("input_factor", "hidden_factor")
#: The methods of a step whose override (a subclass's own step, signs, draws or constants) keeps the PyTorch path.
_STEP_METHODS = ("_advance", "_advance_step", "_signs", "_sign_bits", "_draw", "_draw_bits", "_balance", "_ratio")
#: Sign buffers kept per estimator (one per thread, stream count and dtype; emptied when more are asked for).
_SIGN_BUFFERS = 8
#: ``H`` from which the fused step takes ``W_h A`` with BLAS (``torch.matmul``) and finishes the step in C; below
#: it the kernel's own loop is faster than the call (measured at one stream, float32 and float64).
BLAS_PRODUCT_MIN = 256
_autocast = torch.is_autocast_enabled
_CPU = torch.device("cpu")


class KFRTRL(StreamNoise, OnlineGradientEstimator):
    """KF-RTRL (Mujika et al. 2018, section 4): ``dh_t/dvec(W) ~ u_t^T (x) A_t`` for a cell with ``z_t = W a_t``.

    The cell must offer ``preactivation_input(x, h) -> a`` ``(B, n_a)``, ``preactivation(x, h) -> z``,
    ``activation(z)`` (``forward = activation o preactivation``) and
    ``preactivation_weights``, the names of the parameters that, laid side by side (a vector parameter is one
    column), make ``W`` ``(Z, n_a)`` (:class:`~lightning_ortho.online.TanhRNNCell`: ``a = [h; x; 1]``,
    ``W = [W_h W_x b]``). With ``J_t = dh_t/dh_{t-1}`` and ``D_t = dh_t/dz_t`` ``(H, Z)``, RTRL's influence obeys
    ``G_t = J_t G_{t-1} + a_t^T (x) D_t``; with ``G_{t-1} = u_{t-1}^T (x) A_{t-1}`` the right side is the sum of two
    Kronecker products ``u_{t-1}^T (x) (J_t A_{t-1}) + a_t^T (x) D_t``, which one random product replaces (Mujika et
    al. 2018, Lemma 1 and Theorem 1), with independent signs ``c1, c2`` uniform on ``{-1, +1}`` per stream::

        u_t = c1 p1 u_{t-1} + c2 p2 a_t                        (n_a,)
        A_t = (c1 / p1) J_t A_{t-1} + (c2 / p2) D_t            (H, Z)
        p1 = sqrt((||J_t A_{t-1}|| + eps) / (||u_{t-1}|| + eps)),   p2 = sqrt((||D_t|| + eps) / (||a_t|| + eps))

    (Frobenius norms). ``E[u_t^T (x) A_t | past] = u_{t-1}^T (x) J_t A_{t-1} + a_t^T (x) D_t`` for any positive
    ``p1, p2`` because ``E[c1 c2] = 0``, so the estimate is unbiased; these ``p`` minimise the variance the step adds
    (Mujika et al. 2018, Theorem 1; Marschall, Cho & Savin 2020, JMLR 21(135), section on KF-RTRL). ``eps`` guards
    the zero norms of the first step (``u_0 = 0``, ``A_0 = 0``, where ``p1 = 1``). The estimate of ``dL_t/dW`` is
    the outer product ``(A_t^T g_t) u_t^T`` ``(Z, n_a)`` with ``g_t = dL_t/dh_t``, split into the parameters of ``W``.

    With ``s_t = c1_1 ... c1_t`` the factors are ``s_t`` times those of Cooijmans & Martens's UORO without spatial
    projection (``UORO(projection="none")``, greedy iterative rescaling: ``p1 = 1 / gamma``, ``p2 = 1 / beta``)
    driven by ``tau_t = c2_t s_t``, again independent fair signs: the two estimates are the same random variable.

    Parameters outside ``W`` (a bias added after the activation, modReLU's threshold) are refused: every parameter
    of the cell must be named in ``preactivation_weights``. The estimator is this factorisation, so a cell is taken
    only when its ``forward`` is checked to be it (``activation(preactivation(x, h))`` with ``preactivation = W a``,
    at random points: :func:`~lightning_ortho.online.linearization.factorisation_problem`): a subclass that
    overrides ``forward`` (or ``preactivation`` without ``preactivation_input``), or a parametrised cell (``W`` is then
    no parameter), is refused with the reason, and the refusal names the estimators that can train it. Cost per
    stream and step: memory ``n_a + H Z``; time ``O(H^2 Z)`` for ``J_t A_{t-1}`` (``O(H^3)`` for a
    fully connected recurrence, as in the paper) plus ``O(H n_a)``.

    State entries: ``input_factor`` ``u`` ``(B, n_a)``, ``hidden_factor`` ``A`` ``(B, H, Z)``, and (as UORO)
    ``stream_ids`` / ``total_streams``.

    On a plain :class:`~lightning_ortho.online.TanhRNNCell` on the CPU (float32/float64, C-contiguous, outside
    tracing) a step is one C call (:mod:`lightning_ortho._native.kf_rtrl`: the cell, ``J_t A_{t-1}``, the norms and
    the new factors, in new tensors; ``W_h A`` from BLAS from ``H = BLAS_PRODUCT_MIN``) and so is the summed
    estimate, each parameter's into a tensor of its own; they compute what the PyTorch ops compute, to rounding,
    from the same signs. Below ``BLAS_PRODUCT_MIN`` both are tried before the template's checks, which they imply
    (:meth:`_fused_step`, :meth:`_fused_gradient`).

    Args:
        cell: a recurrent cell with the factorisation above (every parameter in ``W``).
        generator: the source of the signs: a seed (each :meth:`initial_state` starts a generator from it), a
            ``torch.Generator`` (used as is), or ``None`` (a seed drawn from torch's global generator). The
            generator lives in the state and its ``state_dict``.
        eps: added to the norms in ``p1`` and ``p2``: positive and finite (at the first step ``p1`` is
            ``sqrt(eps / eps)``; ``eps = 0`` would make it ``0 / 0``).
        closed_form: use the cell's closed-form Jacobian products when it has them.

    Raises:
        ValueError: a cell without ``preactivation_input``, ``preactivation``, ``activation`` and
            ``preactivation_weights``, with parameters outside ``W``, whose weights do not have ``Z`` rows, or whose
            ``forward`` is not the factorisation (:meth:`cell_problem`); an ``eps`` that is not a positive finite
            number; a generator that is neither a seed nor a ``torch.Generator``. At a step: ``preactivation_input``
            not of ``n_a`` entries.
    """

    name = "kf_rtrl"

    @classmethod
    def cell_problem(cls, cell: nn.Module, **options) -> str | None:
        """As :meth:`OnlineGradientEstimator.cell_problem`, and the cell's step must be ``activation(W a)`` with
        every parameter in ``W`` (the parts ``"step"`` and ``"complete"`` of
        :func:`~lightning_ortho.online.linearization.factorisation_problem`): no generic product replaces the
        Kronecker structure, so a cell without it is refused."""
        problem = super().cell_problem(cell, **options)
        if problem is None:
            reason = factorisation_problem(cell, ("step", "complete"))
            if reason is not None:
                problem = f"KFRTRL needs a cell h' = activation(z) with z = W a and every parameter in W: {reason}."
        return problem

    def __init__(
        self,
        cell: nn.Module,
        *,
        generator: int | torch.Generator | None = None,
        eps: float = 1e-7,
        closed_form: bool = True,
    ) -> None:
        super().__init__(cell, closed_form=closed_form)
        self.eps, self.generator = check_eps(eps, "KFRTRL"), check_generator(generator, "KFRTRL")
        self.weight_columns = _weight_columns(cell)
        self.inputs = sum(columns for _, columns, _ in self.weight_columns)  # n_a
        self.preactivations = _weight_rows(cell, self.weight_columns)  # Z
        # Where the C kernels (lightning_ortho._native.kf_rtrl) compute exactly this estimator, decided once here
        # (every call still checks its tensors). The step: a plain tanh cell, the closed forms, and
        # the step's methods of this class. The estimate: W = [W_h W_x b] (Z = H) in the layout's order.
        kind, rows = type(self), self.preactivations
        self._fused = (
            closed_form
            and fusable_tanh_cell(cell, self.layout)
            and type(cell).preactivation_input is TanhRNNCell.preactivation_input
            and all(getattr(kind, name) is getattr(KFRTRL, name) for name in _STEP_METHODS)
        )
        tanh_columns = [("weight_hh", rows, False), ("weight_ih", self.inputs - rows - 1, False), ("bias", 1, True)]
        self._fuses_gradient = (
            self.layout.names == tuple(name for name, _, _ in tanh_columns)
            and self.weight_columns == tanh_columns
            and kind._gradient_summed is KFRTRL._gradient_summed
            and kind._gradient_estimate is OnlineGradientEstimator._gradient_estimate
        )
        #: the tanh cell's parameters as the C step checks them (None where it does not run)
        self._tanh_parameters = TanhParameters(cell) if self._fused else None
        #: ``(h', u', A', their data_ptr()s, B, dtype)`` of the last C step: checked then (_kernel_step)
        self._made: tuple = NOTHING_MADE
        #: {(thread, total streams, dtype): bits (total, 2)}: where the C step's signs are drawn (_sign_bits)
        self._sign_buffers: dict[tuple, torch.Tensor] = {}

    def __getstate__(self) -> dict:  # copy and pickle: what was checked and the draw buffers do not travel
        return {**self.__dict__, "_made": NOTHING_MADE, "_sign_buffers": {}}

    # -- state -------------------------------------------------------------------------------------------------
    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, hidden = h0.shape
        return {
            "input_factor": h0.new_zeros(batch, self.inputs),
            "hidden_factor": h0.new_zeros(batch, hidden, self.preactivations),
        }

    def _reset_tensor(self, name: str, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return super()._reset_tensor(name, value, keep) if name in _FACTORS else value

    def _watched_tensors(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensors[name] for name in _FACTORS}

    # -- one step ----------------------------------------------------------------------------------------------
    def _signs(self, state: OnlineState, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(c1, c2)``, each ``(B,)`` in ``{-1, +1}`` of ``like``'s dtype: independent fair signs per stream
        (:meth:`~lightning_ortho.online.stream_noise.StreamNoise._draw`: the state's generator, or the
        default one under ``torch.compile`` and ``noise_scope``)."""
        _, signs = self._draw(state, like, None, (2,))
        return signs[:, 0], signs[:, 1]

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        t = state.tensors
        inputs = self.cell.preactivation_input(x, state.h).detach()  # a_t (B, n_a)
        if inputs.shape != (x.shape[0], self.inputs):
            raise ValueError(
                f"KFRTRL: {type(self.cell).__name__}.preactivation_input returned shape {tuple(inputs.shape)}, but"
                f" its preactivation_weights {[n for n, _, _ in self.weight_columns]} have {self.inputs} columns"
                f" side by side: W a needs ({x.shape[0]}, {self.inputs}); make the two agree."
            )
        propagated = lin.state_jvp_columns(t["hidden_factor"])  # J_t A_{t-1} (B, H, Z)
        local = lin.activation_jacobian()  # D_t (B, H, Z)
        c1, c2 = self._signs(state, inputs)
        p1, p2 = self._balance(t["input_factor"], propagated, inputs, local)
        input_factor = (c1 * p1)[:, None] * t["input_factor"] + (c2 * p2)[:, None] * inputs
        hidden_factor = (c1 / p1)[:, None, None] * propagated + (c2 / p2)[:, None, None] * local
        return {**t, "input_factor": input_factor, "hidden_factor": hidden_factor}

    def _fused_step(self, x: torch.Tensor, state: OnlineState) -> Advance | None:
        """On a plain tanh cell with ``H < BLAS_PRODUCT_MIN``, the whole step in one C call (:meth:`_kernel_step`),
        under the contract of :meth:`OnlineGradientEstimator._fused_step`; else ``None``: :meth:`_advance_step`
        (from ``BLAS_PRODUCT_MIN`` the step's product ``W_h A`` is a PyTorch op, which runs there, in the call
        context: autograd off, the estimator's thread count)."""
        if not self._fused or self.preactivations >= BLAS_PRODUCT_MIN:
            return None
        return self._kernel_step(x, state, False)

    def _advance_step(self, x: torch.Tensor, state: OnlineState) -> Advance:
        """One step (see :meth:`OnlineGradientEstimator._advance_step`) where :meth:`_fused_step` did not take it:
        on a plain tanh cell with ``H >= BLAS_PRODUCT_MIN``, ``W_h A`` from BLAS and the rest of the step in one C
        call (:meth:`_kernel_step`), where it applies; else the cell's linearisation and :meth:`_advance` (which name
        what is wrong, if anything)."""
        if self._fused and self.preactivations >= BLAS_PRODUCT_MIN:
            advance = self._kernel_step(x, state, True)
            if advance is not None:
                return advance
        return super()._advance_step(x, state)

    def _kernel_step(self, x: torch.Tensor, state: OnlineState, blas_product: bool) -> Advance | None:
        """The whole step in one C call (:func:`lightning_ortho._native.kf_rtrl.step`: the cell, ``J A``, the
        norms, ``p1``, ``p2`` and the new factors, into new tensors, with the verdict: the sum of ``x``, ``h'``,
        ``u'`` and ``A'``), with the signs :meth:`_signs` draws (:meth:`_sign_bits`, drawn only once every check has
        passed), or ``None``. It answers only where every tensor it reads is C-contiguous, of ``x``'s dtype
        (float32/float64) and of the cell's sizes (``x`` ``(B, I)``, ``h`` ``(B, H)``, ``u`` ``(B, n_a)``, ``A``
        ``(B, H, H)``), a real CPU tensor, nothing tracing and the kernels on and built
        (:func:`~lightning_ortho._native.kf_rtrl.kf_rtrl_kernels`), and (``blas_product``: ``W_h A`` from
        ``torch.matmul``, to be called under ``no_grad``) no CPU autocast: the template's checks of ``x`` and more.

        A step at one stream is a few microseconds of arithmetic, so what was checked is remembered: the state
        tensors the last call made (held until the next one) pass while they are the very tensors passed in, at the
        same addresses, for a step of the same ``B`` and dtype; the parameters as
        :class:`~lightning_ortho._native.tanh_cell.TanhParameters` remembers them. ``x`` is checked at every call."""
        if not isinstance(x, torch.Tensor):
            return None
        kernels = kf_rtrl_kernels(x)  # (first: declines while compiling, before any other call on x)
        if kernels is None or x.dim() != 2 or not x.is_contiguous() or (blas_product and _autocast("cpu")):
            return None
        batch, inputs = x.shape
        dtype, rows, h, tensors = x.dtype, self.preactivations, state.h, state.tensors
        input_factor, hidden_factor = tensors["input_factor"], tensors["hidden_factor"]
        if inputs != self.inputs - rows - 1:
            return None
        made = self._made
        fits = (
            h is made[0] and input_factor is made[1] and hidden_factor is made[2] and batch == made[6]
            and dtype is made[7]
        )  # fmt: skip
        if fits:  # made here, checked then: still at their memory (no set_, resize_)?
            pointers = h.data_ptr(), input_factor.data_ptr(), hidden_factor.data_ptr()
            fits = pointers == made[3:6]
        if not fits:
            if not (
                isinstance(h, torch.Tensor)  # (the others: real_cpu below)
                and h.dtype is dtype
                and input_factor.dtype is dtype
                and hidden_factor.dtype is dtype
                and h.shape == (batch, rows)
                and input_factor.shape == (batch, self.inputs)
                and hidden_factor.shape == (batch, rows, rows)
                and h.is_contiguous()
                and input_factor.is_contiguous()
                and hidden_factor.is_contiguous()
                and real_cpu(h, input_factor, hidden_factor)
            ):
                return None
            pointers = h.data_ptr(), input_factor.data_ptr(), hidden_factor.data_ptr()
        addresses = self._tanh_parameters.addresses(dtype)
        if addresses is None:
            return None
        weight_hh = self.cell._parameters["weight_hh"] if blas_product else None
        h_new, input_new, hidden_new, verdict, *made_pointers = step(
            kernels, (*addresses, x.data_ptr(), *pointers), h, input_factor, hidden_factor,
            self._sign_bits(state, x), self.eps, (batch, rows, inputs), weight_hh,
        )  # fmt: skip
        self._made = (h_new, input_new, hidden_new, *made_pointers, batch, dtype)
        return Advance(h_new, {**tensors, "input_factor": input_new, "hidden_factor": hidden_new}, None, verdict)

    def _sign_bits(self, state: OnlineState, like: torch.Tensor) -> torch.Tensor:
        """The bits ``b`` ``(B, 2)`` in ``{0, 1}`` of the signs ``(c1, c2) = 2 b - 1`` that :meth:`_signs` draws, in
        ``like``'s dtype on the CPU: the draw of :meth:`~StreamNoise._draw_bits` (the same generator, the same
        numbers, cut to the state's rows), without its conversion to signs, which the C step does (one call fewer),
        drawn into a buffer of this thread's (``random_(0, 2)``: what ``randint`` runs on the tensor it allocates,
        without the allocation); the caller reads it before this thread draws again."""
        streams = total, rows = self._rows(state)
        key = (threading.get_ident(), total, like.dtype)
        bits = self._sign_buffers.get(key)
        if bits is None:
            if len(self._sign_buffers) >= _SIGN_BUFFERS:  # threads come and go: keep a few
                self._sign_buffers.clear()
            with torch.inference_mode(False):  # a normal tensor: drawn into in and out of inference mode alike
                bits = self._sign_buffers[key] = like.new_empty(total, 2)
        self._draw_bits(state, like, None, (2,), into=(None, bits), streams=streams)
        return bits if rows is None else bits[rows]

    def _balance(
        self, input_factor: torch.Tensor, propagated: torch.Tensor, inputs: torch.Tensor, local: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p1, p2)``, each ``(B,)``: ``p1 = sqrt((||J A|| + eps) / (||u|| + eps))`` and
        ``p2 = sqrt((||D|| + eps) / (||a|| + eps))``, the variance-minimising constants (Mujika et al. 2018,
        Theorem 1), from ``u_{t-1}`` ``(B, n_a)``, ``J_t A_{t-1}`` ``(B, H, Z)``, ``a_t`` ``(B, n_a)``, ``D_t``
        ``(B, H, Z)``."""
        return self._ratio(_norms(propagated), _norms(input_factor)), self._ratio(_norms(local), _norms(inputs))

    def _ratio(self, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
        """``sqrt((n + eps) / (d + eps))`` of per-stream norms ``(B,)``."""
        return torch.sqrt((numerator + self.eps) / (denominator + self.eps))

    # -- the estimate ------------------------------------------------------------------------------------------
    def _fused_gradient(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[dict[str, torch.Tensor], float] | None:
        """Where ``W = [W_h W_x b]`` (a tanh cell's layout) ``sum_b (A_b^T g_b) u_b^T`` in one C call that writes
        each parameter's estimate into a tensor of its own, with the sum of ``grad_h`` and of the estimate as the
        verdict (:func:`lightning_ortho._native.kf_rtrl.summed_estimate`), where ``grad_h`` is a C-contiguous
        float32/float64 real CPU tensor of the state's ``h``'s shape and dtype, ``u`` and ``A`` are too and of the
        cell's sizes (those the C step made pass as checked then: :meth:`_kernel_step`), and the kernels run; else
        ``None``: :meth:`_gradient_summed` in the template."""
        if not self._fuses_gradient or not isinstance(grad_h, torch.Tensor):
            return None
        kernels = kf_rtrl_kernels(grad_h)  # (first: declines while compiling, before any other call on grad_h)
        if kernels is None or grad_h.dim() != 2 or not grad_h.is_contiguous():
            return None
        batch, hidden = grad_h.shape
        dtype, rows, h, tensors = grad_h.dtype, self.preactivations, state.h, state.tensors
        input_factor, hidden_factor = tensors["input_factor"], tensors["hidden_factor"]
        made = self._made
        fits = (
            h is made[0] and input_factor is made[1] and hidden_factor is made[2] and batch == made[6]
            and dtype is made[7] and hidden == rows
        )  # fmt: skip
        if fits:  # made by the C step, checked then: still at their memory?
            input_pointer, hidden_pointer = input_factor.data_ptr(), hidden_factor.data_ptr()
            fits = input_pointer == made[4] and hidden_pointer == made[5]
        if not fits:
            if not (
                hidden == rows
                and isinstance(h, torch.Tensor)
                and h.dtype is dtype
                and input_factor.dtype is dtype
                and hidden_factor.dtype is dtype
                and h.shape == grad_h.shape
                and input_factor.shape == (batch, self.inputs)
                and hidden_factor.shape == (batch, rows, rows)
                and input_factor.is_contiguous()
                and hidden_factor.is_contiguous()
                and real_cpu(h, input_factor, hidden_factor)  # (h: of grad_h's device, the CPU)
            ):
                return None
            input_pointer, hidden_pointer = input_factor.data_ptr(), hidden_factor.data_ptr()
        sizes = (batch, hidden, self.inputs - rows - 1)
        return summed_estimate(kernels, hidden_pointer, input_pointer, grad_h, sizes, self.layout.names)

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        t = state.tensors
        row = torch.einsum("bh,bhz->bz", grad_h, t["hidden_factor"])  # A_t^T g_t (B, Z)
        return flatten_weight(self.layout, self.weight_columns, row[:, :, None] * t["input_factor"][:, None, :], 1)

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        t = state.tensors
        row = torch.einsum("bh,bhz->bz", grad_h, t["hidden_factor"])
        # sum_b (A^T g)_b u_b^T, (Z, n_a)
        return flatten_weight(self.layout, self.weight_columns, row.T @ t["input_factor"], lead=0)


def _weight_columns(cell: nn.Module) -> list[tuple[str, int, bool]]:
    """``[(name, columns, is_vector)]`` of the parameters of ``W`` in ``preactivation_weights`` order (the cell was
    checked by :meth:`KFRTRL.cell_problem`)."""
    return weight_columns(cell)


def _weight_rows(cell: nn.Module, columns: list[tuple[str, int, bool]]) -> int:
    """``Z``, the rows every parameter of ``W`` shares."""
    return weight_rows(cell)


def _norms(value: torch.Tensor) -> torch.Tensor:
    """Per-stream Frobenius norms ``(B,)`` of ``(B, ...)``."""
    return torch.linalg.vector_norm(value.flatten(1), dim=1)
