"""Real-time recurrent learning: the exact forward-mode influence matrix (Williams & Zipser 1989)."""

from __future__ import annotations

import torch

from lightning_ortho.online.estimator import OnlineGradientEstimator
from lightning_ortho.online.linearization import StepLinearization
from lightning_ortho.online.state import OnlineState


class RTRL(OnlineGradientEstimator):
    """Exact RTRL (Williams & Zipser 1989): ``M_t = J^{h_t}_{h_{t-1}} M_{t-1} + J^{h_t}_{theta_t}``, ``M_0 = 0``,
    and ``dL_t/dtheta = (dL_t/dh_t) M_t``.

    The influence matrix ``M`` is ``(B, H, P)`` per stream; a step costs ``H`` forward-mode products of
    ``P`` columns, ``O(H^2 P) = O(H^4)`` for a fully connected cell. Use it as the ground truth at small
    ``H`` (its summed gradients equal backprop through time to float64 rounding: tested) and to measure the
    bias and variance of the cheaper estimators.

    Args:
        cell: any ``nn.Module`` with ``cell(x, h) -> h_new`` whose parameters all live in it (see
            :class:`~lightning_ortho.online.OnlineGradientEstimator`).
        closed_form: use the cell's closed-form Jacobian products when it has them; ``False`` forces the generic
            ``torch.func`` path.
    """

    name = "rtrl"

    def _initial_tensors(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"influence": h0.new_zeros(h0.shape[0], h0.shape[1], self.layout.size)}

    def _advance(self, lin: StepLinearization, x: torch.Tensor, state: OnlineState) -> dict[str, torch.Tensor]:
        influence = lin.state_jvp_columns(state.tensors["influence"]) + lin.parameter_jacobian()
        return {"influence": influence}

    def _gradient_flat(self, state: OnlineState, grad_h: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bh,bhp->bp", grad_h, state.tensors["influence"])
