"""UORO's step on :class:`~lightning_ortho.nn.OrthogonalRNNCell` in one pass over its closed-form linearisation.

The :class:`~lightning_ortho.online.uoro_fused.FusedStep` protocol (``fits``, ``gir``, ``commit``, ``fixed``), for the
cut vertex ``h`` (Tallec & Ollivier's UORO, the default projection): the estimator draws the noise and checks the
result; this object computes, with the products of
:class:`~lightning_ortho.online.orthogonal_linearization.OrthogonalStepLinearization`::

    gamma = sqrt((||w_tilde|| + eps) / (||J h_tilde|| + eps)),  beta = sqrt((||nu^T J_theta|| + eps) / (||nu|| + eps))
    h_tilde' = gamma J h_tilde + beta tau nu,                     w_tilde' = w_tilde / gamma + (tau / beta) nu^T J_theta

(Cooijmans & Martens 2019, greedy iterative rescaling), or the fixed rescaling ``Q_t = alpha_t Q0``. The
parameter block ``nu^T J_theta`` is never materialised for an auxiliary reflection: its norm comes from the
factors of its outer products and it is added to ``w_tilde`` block by block.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_ortho.online.linearization import ParameterLayout
from lightning_ortho.online.orthogonal_linearization import OrthogonalStepLinearization, has_closed_form


def fusable_orthogonal_cell(cell: nn.Module, projection: str) -> bool:
    """Whether :class:`OrthogonalUOROStep` runs UORO on ``cell`` with ``projection``: an ``OrthogonalRNNCell`` with
    a closed form (:func:`~lightning_ortho.online.orthogonal_linearization.has_closed_form`), cut at ``h``."""
    return projection == "state" and has_closed_form(cell)


class OrthogonalUOROStep:
    """One UORO step (cut vertex ``h``) of an :class:`~lightning_ortho.nn.OrthogonalRNNCell` for ``B`` streams.

    Args:
        cell: the cell (checked with :func:`fusable_orthogonal_cell` by the caller); its parameters are read at
            every call, so optimiser updates between steps are seen.
        projection: ``"state"`` only (the cut ``{z, h}`` of ``"preactivation"`` has ``2 H`` noise entries).
        eps: GIR's ``eps`` (added to both norms of each ratio).

    Raises:
        ValueError: another projection.
    """

    def __init__(self, cell: nn.Module, projection: str, eps: float) -> None:
        if projection != "state":
            raise ValueError(f"OrthogonalUOROStep: projection must be 'state', got {projection!r}.")
        self.cell, self.eps = cell, eps
        self.layout = ParameterLayout(cell)
        self._views: tuple | None = None

    @classmethod
    def fits(cls, cell: nn.Module, projection: str, layout: ParameterLayout) -> bool:
        """Cut at ``h`` of an orthogonal cell with a closed form (:func:`fusable_orthogonal_cell`)."""
        return fusable_orthogonal_cell(cell, projection)

    def gir(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        nu: torch.Tensor,
        tau: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple, None]:
        """The step with greedy iterative rescaling, up to its update of ``w_tilde``: ``(h', h_tilde', 1 / gamma,
        pending, None)`` (no sum of ``h_tilde'`` comes for free: the estimator takes it) from ``x`` ``(B, I)``, ``h``, ``h_tilde`` ``(B, H)``, ``w_tilde`` ``(B, P)`` (read only), the noise
        ``nu`` ``(B, H)`` and the signs ``tau`` ``(B, 1)``; :meth:`commit` then updates ``w_tilde`` in place.

        A NaN/inf in ``x`` reaches ``h_tilde'`` through ``||x||`` and ``beta``, a NaN in ``h'`` is copied into its
        row, an overflowed ``w_tilde`` arrives through ``gamma``: a finite ``h_tilde'`` means a finite step.
        """
        lin = OrthogonalStepLinearization(self.cell, x, h, self.layout)
        propagated = lin.state_jvp(h_tilde)
        norm = torch.linalg.vector_norm
        norms = (norm(w_tilde, dim=1), lin.vjp_norm("parameter", nu), norm(propagated, dim=1), norm(nu, dim=1))
        norms = torch.stack(norms, 1).add_(self.eps)
        ratio = norms[:, :2].div(norms[:, 2:]).sqrt_()  # (B, 2): gamma, beta
        gamma, beta = ratio[:, :1], ratio[:, 1:]
        h_tilde_new = torch.addcmul(propagated.mul_(gamma), beta * tau, nu)
        h_tilde_new = _carry_nonfinite(h_tilde_new, lin.h_new)
        return (
            lin.h_new,
            h_tilde_new,
            gamma.reciprocal(),
            (lin, nu, tau.div(beta)[:, 0]),
            None,
        )

    def commit(
        self, w_tilde: torch.Tensor, inverse_gamma: torch.Tensor, pending: tuple, h: torch.Tensor, x: torch.Tensor
    ) -> None:
        """``w_tilde <- w_tilde / gamma + (tau / beta) nu^T J_theta`` in place, with what :meth:`gir` returned."""
        lin, nu, scale = pending
        w_tilde.mul_(inverse_gamma)
        if not (lin.transition.factored and w_tilde.dtype == lin.dtype):
            lin.vjp_accumulate("parameter", w_tilde, nu, scale)
            return
        # The auxiliary reflection: three outer products per stream written into cached views of w_tilde (UORO
        # updates the same tensor in place at every step).
        g, bias, f = lin._blocks("parameter", nu)
        bias_block, input_block, weight_block = self._blocks_of(w_tilde, lin.transition.name)
        column = scale[:, None]
        bias_block.addcmul_(bias, column)
        input_block.addcmul_(g.mul(column)[:, :, None], x[:, None, :])
        weight_block.addcmul_(f.mul(column)[:, :, None], h[:, None, :], value=-1.0)  # the W block is -f h^T

    def _blocks_of(self, w_tilde: torch.Tensor, weight: str) -> tuple[torch.Tensor, ...]:
        """The bias, input-kernel and ``W`` blocks of ``w_tilde`` as views, kept while it is the same tensor."""
        if torch.compiler.is_compiling():  # views of a traced tensor are not kept on the object
            return tuple(self.layout.block(w_tilde, name) for name in ("bias", "input_kernel.weight", weight))
        if self._views is None or self._views[0] is not w_tilde:
            blocks = tuple(self.layout.block(w_tilde, name) for name in ("bias", "input_kernel.weight", weight))
            self._views = (w_tilde, blocks)
        return self._views[1]

    def fixed(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        h_tilde: torch.Tensor,
        w_tilde: torch.Tensor,
        scaled: torch.Tensor,
        dual: torch.Tensor,
        alpha: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step with a fixed rescaling ``Q_t = alpha Q0``: ``(h', h_tilde', w_tilde')`` (new tensors) from
        ``scaled = Q0 u`` and ``dual = Q0^{-T} u`` ``(B, H)`` for ``u = tau nu``::

            h_tilde' = J h_tilde + alpha Q0 u,        w_tilde' = w_tilde + (u^T Q0^{-1} J_theta) / alpha
        """
        lin = OrthogonalStepLinearization(self.cell, x, h, self.layout)
        h_tilde_new = lin.state_jvp(h_tilde).add_(scaled, alpha=alpha)
        w_tilde_new = w_tilde.clone()
        lin.vjp_accumulate("parameter", w_tilde_new, dual, torch.full_like(dual[:, 0], 1 / alpha))
        return lin.h_new, _carry_nonfinite(h_tilde_new, lin.h_new), w_tilde_new


def _carry_nonfinite(h_tilde: torch.Tensor, h_new: torch.Tensor) -> torch.Tensor:
    """``h_tilde`` with NaN where ``h_new`` holds NaN/inf (in place: ``+ 0 * h_new``). The estimator checks
    ``h_tilde`` only; a NaN bias or input weight makes modReLU's slope 0 (``sign(NaN) = 0``), so without this a NaN
    state would leave ``h_tilde`` finite."""
    return h_tilde.add_(h_new, alpha=0)
