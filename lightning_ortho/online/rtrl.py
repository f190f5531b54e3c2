"""Real-time recurrent learning: the exact forward-mode influence matrix (Williams & Zipser 1989)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho._native.rtrl import rtrl_gradient_kernel, rtrl_tanh_kernels, summed_estimate, tanh_step
from lightning_ortho.online.estimator import Advance, OnlineGradientEstimator
from lightning_ortho.online.linearization import StepLinearization
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.uoro_fused import fusable_tanh_cell


class RTRL(OnlineGradientEstimator):
    """Exact RTRL (Williams & Zipser 1989): ``M_t = J^{h_t}_{h_{t-1}} M_{t-1} + J^{h_t}_{theta_t}``, ``M_0 = 0``,
    and ``dL_t/dtheta = (dL_t/dh_t) M_t``.

    The influence matrix ``M`` is ``(B, H, P)`` per stream; a step costs ``H`` forward-mode products of
    ``P`` columns, ``O(H^2 P) = O(H^4)`` for a fully connected cell. Use it as the ground truth at small
    ``H`` (its summed gradients equal backprop through time to float64 rounding: tested) and to measure the
    bias and variance of the cheaper estimators.

    On a plain :class:`~lightning_ortho.online.TanhRNNCell` (``closed_form=True``) a step is
    ``M' = diag(d) (W_h M + dz/dtheta)`` with ``d = 1 - h'^2`` and the ``H + I + 1`` nonzeros of each row of
    ``dz/dtheta`` (``dz_i/dW_h[i, j] = h_j``, ``dz_i/dW_x[i, j] = x_j``, ``dz_i/db_i = 1``) added in place: one GEMM
    ``W_h M`` and, on float32/float64 CPU tensors, one C pass (:mod:`lightning_ortho._native.rtrl`) for the cell's
    step, the immediate entries, the scaling and the NaN/inf verdict; elsewhere (under ``torch.compile``, with
    ``native_kernels(False)``, on other devices) the same as a few PyTorch ops. The summed estimate is one pass
    over ``M`` in C for any cell where the kernels run, else one GEMV.

    Args:
        cell: any ``nn.Module`` with ``cell(x, h) -> h_new`` whose parameters all live in it (see
            :class:`~lightning_ortho.online.OnlineGradientEstimator`).
        closed_form: use the cell's closed-form Jacobian products when it has them; ``False`` forces the generic
            ``torch.func`` path.
    """

    name = "rtrl"

    def __init__(self, cell: nn.Module, *, closed_form: bool = True) -> None:
        super().__init__(cell, closed_form=closed_form)
        # The tanh cell's own step (decided once: a plain TanhRNNCell whose closed form applies); its parameters are
        # read at every call, so optimiser updates between steps are seen.
        self._tanh = closed_form and fusable_tanh_cell(cell, self.layout)

    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"influence": h0.new_zeros(h0.shape[0], h0.shape[1], self.layout.size)}

    def _advance_step(self, x: torch.Tensor, state: OnlineState) -> Advance:
        """One step (see :meth:`OnlineGradientEstimator._advance_step`): on a plain tanh cell whose shapes fit,
        :meth:`_tanh_step`; else the cell's linearisation and :meth:`_advance`."""
        if self._tanh:
            params = self.cell._parameters  # a dictionary lookup each, where Module.__getattr__ costs a microsecond
            # a parametrisation registered since moves a weight out of _parameters: then the generic path
            weight_hh, weight_ih, bias = params.get("weight_hh"), params.get("weight_ih"), params.get("bias")
            h, influence, layout = state.h, state.tensors["influence"], self.layout
            shapes = layout.shapes  # ((H, H), (H, I), (H,)): what the kernel reads, whatever was assigned since
            hidden = shapes[0][0]
            if (
                weight_hh is not None
                and weight_ih is not None
                and bias is not None
                and (weight_hh.shape, weight_ih.shape, bias.shape) == shapes
                and x.shape[1] == shapes[1][1]
                and h.shape[1] == hidden
                and influence.shape == (h.shape[0], hidden, layout.size)
            ):
                return self._tanh_step(x, state, weight_hh, weight_ih, bias)
        return super()._advance_step(x, state)

    def _tanh_step(
        self,
        x: torch.Tensor,
        state: OnlineState,
        weight_hh: torch.Tensor,
        weight_ih: torch.Tensor,
        bias: torch.Tensor,
    ) -> Advance:
        """The step of ``h' = tanh(W_h h + W_x x + b)`` and ``M' = diag(d) (W_h M + dz/dtheta)``, ``d = 1 - h'^2``,
        from ``x`` ``(B, I)`` and the state's ``h`` ``(B, H)`` and ``M`` ``(B, H, P)`` (shapes checked by the caller):
        the GEMM and one C pass where every tensor is a C-contiguous real CPU tensor of one float dtype (the verdict
        from that pass), else PyTorch ops. Fresh tensors: ``M`` is only read.

        Raises:
            ValueError: the cell's step returned another dtype than the state's (CPU autocast).
        """
        h, influence = state.h, state.tensors["influence"]
        dtype = h.dtype
        if (
            x.dtype is dtype
            and influence.dtype is dtype
            and weight_hh.dtype is dtype
            and weight_ih.dtype is dtype
            and bias.dtype is dtype
            and x.is_contiguous()
            and h.is_contiguous()
            and influence.is_contiguous()
            and weight_hh.is_contiguous()
            and weight_ih.is_contiguous()
            and bias.is_contiguous()
        ):
            kernel = rtrl_tanh_kernels(h, x, influence, weight_hh, weight_ih, bias)
            if kernel is not None:
                h_new, influence_new, verdict = tanh_step(kernel, weight_hh, weight_ih, bias, x, h, influence)
                return Advance(h_new, {"influence": influence_new}, None, verdict)
        h_new = torch.tanh(torch.addmm(bias, h, weight_hh.T).addmm_(x, weight_ih.T))
        self._check_step_output(h_new, state)
        batch, hidden = h.shape
        inputs = x.shape[1]
        influence_new = torch.bmm(weight_hh.expand(batch, hidden, hidden), influence)  # W_h M (see tanh_step)
        # dz/dtheta's nonzeros, on the diagonals of the (B, H_i, H_i, .) views of the blocks of each row i
        input_block, bias_block = hidden * hidden, hidden * (hidden + inputs)
        rows_hh = influence_new[:, :, :input_block].view(batch, hidden, hidden, hidden)
        torch.diagonal(rows_hh, 0, 1, 2).add_(h[:, :, None])  # [b, j, i] = dz_i/dW_h[i, j] = h_j
        rows_ih = influence_new[:, :, input_block:bias_block].view(batch, hidden, hidden, inputs)
        torch.diagonal(rows_ih, 0, 1, 2).add_(x[:, :, None])  # [b, j, i] = dz_i/dW_x[i, j] = x_j
        torch.diagonal(influence_new[:, :, bias_block:], 0, 1, 2).add_(1)  # dz_i/db_i = 1
        slope = 1 - h_new.square()  # d = 1 - h'^2
        return Advance(h_new, {"influence": influence_new.mul_(slope[:, :, None])})

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        influence = lin.state_jvp_columns(state.tensors["influence"]) + lin.parameter_jacobian()
        return {"influence": influence}

    def _gradient_estimate(self, state: OnlineState, grad_h: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        """``(sum_b grad_h_b^T M_b (P,), verdict)``: one C pass over ``M`` with the sum of ``grad_h`` and the estimate
        as the verdict, where both are C-contiguous real CPU tensors of one float dtype; else one GEMV and ``None``."""
        influence = state.tensors["influence"]
        if (
            grad_h.dtype is influence.dtype
            and grad_h.is_contiguous()
            and influence.is_contiguous()
            and influence.shape[:2] == grad_h.shape
        ):
            kernel = rtrl_gradient_kernel(influence, grad_h)
            if kernel is not None:
                return summed_estimate(kernel, influence, grad_h)
        return self._gradient_summed(state, grad_h), None

    def _gradient_summed(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        # sum_b grad_h_b^T M_b as one GEMV (1, B H) x (B H, P): no (B, P) temporary
        influence = state.tensors["influence"]
        if not influence.is_contiguous():  # the generic step's layout, which the reshape would copy
            return super()._gradient_summed(state, grad_h)
        size = influence.shape[-1]
        return torch.matmul(grad_h.reshape(1, -1), influence.reshape(-1, size)).reshape(size)

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bh,bhp->bp", grad_h, state.tensors["influence"])
