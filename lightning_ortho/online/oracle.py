"""Oracle quantities of UORO's variance analysis (Cooijmans & Martens 2019, the oracle rescalings), computed by
backprop on a fixed sequence.

On one stream with fixed parameters and loss gradients ``delta_s = dL_s/dh_s`` along the noise-free
trajectory, the fixed-``Q`` estimator's total estimate ``g = sum_t b^(t)T Q u u^T Q^{-1} S^(t) J`` has

* mean: the true gradient (``E[Q u u^T Q^{-1}] = I``);
* total variance (their eq. 6.5, Gaussian ``u``): ``tr Cov(g) = V(Q) + sum_{s,t} <v_{t,s}, v_{s,t}>`` with
  ``V(Q) = sum_{s,t} tr(sum_r b_r^(s) b_r^(t)T Q_r Q_r^T) tr(sum_{q <= min(s,t)} J_q J_q^T (Q_q Q_q^T)^{-1})`` and
  ``v_{t,s} = sum_{q <= s} J_q^T b_q^(t)``;
* at the preactivation of a cell ``z = W a`` (``J_q J_q^T = ||a_q||^2 I``) and ``Q_r = alpha_r Q0``:
  ``V = tr(B Q0 Q0^T) tr((Q0 Q0^T)^{-1})`` with ``B = sum_{q,r} (alpha_r^2 / alpha_q^2) ||a_q||^2 c_qr c_qr^T``,
  ``c_qr = sum_{s >= max(q,r)} b_r^(s)``; ``Q0 = B^{-1/4}`` minimises it (``V = tr(B^{1/2})^2``) and the
  optimal ``alpha`` given ``Q0`` is the fixed point of their Section 7 (:func:`optimal_alpha`).

``b_r^(s) = J^{L_s}_{z_r}`` is the gradient of ``L_s`` with respect to the cut vertex at step ``r`` and
``J_q = J^{z_q}_{theta_q}`` the immediate Jacobian there. These need future gradients, so they are oracle
quantities: use them to study and tune the estimator on a window where backprop is affordable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call, jacrev

from lightning_ortho.online.linearization import (
    ParameterLayout,
    _Method,
    activation_reads_parameters,
    factorisation_problem,
)


@dataclass
class OracleTerms:
    """Backprop quantities of one stream over ``T`` steps at a cut vertex of size ``Z``.

    Attributes:
        b: ``(T, T, Z)``, ``b[s, r] = J^{L_s}_{z_r}`` (zero for ``r > s``).
        jacobians: ``(T, Z, P)``, ``J_q = J^{z_q}_{theta_q}``.
        inputs: ``(T, A)`` the preactivation inputs ``a_q`` (``z_q = W a_q``) or ``None``.
        gradient: ``(P,)`` the exact gradient of ``sum_s L_s`` (equals ``sum_{s, r} J_r^T b[s, r]``).
    """

    b: torch.Tensor
    jacobians: torch.Tensor
    inputs: torch.Tensor | None
    gradient: torch.Tensor


def oracle_terms(
    cell: nn.Module,
    xs: torch.Tensor,
    h0: torch.Tensor,
    loss_gradients: torch.Tensor,
    cut: Literal["state", "preactivation"] = "preactivation",
) -> OracleTerms:
    """Compute :class:`OracleTerms` by backprop through the unrolled cell.

    Args:
        cell: the recurrent cell; for ``cut="preactivation"`` it needs ``preactivation`` and ``activation`` whose
            composition is its ``forward`` (checked at random points) and no parameter acting after the
            preactivation; the inputs ``a`` are kept where ``preactivation = W a`` holds of it.
        xs: ``(T, I)`` inputs of one stream.
        h0: ``(H,)`` initial state.
        loss_gradients: ``(T, H)`` the fixed ``delta_s = dL_s/dh_s`` (``L_s = delta_s . h_s`` to first order).
        cut: the cut vertex ``z``: ``"state"`` (``z = h``) or ``"preactivation"``.

    Raises:
        ValueError: shapes disagree, or the cell cannot be cut at its preactivation.
    """
    steps = xs.shape[0]
    if xs.dim() != 2 or h0.dim() != 1 or loss_gradients.shape != (steps, h0.shape[0]):
        raise ValueError(
            f"oracle_terms: need xs (T, I), h0 (H,) and loss_gradients (T, H); got {tuple(xs.shape)},"
            f" {tuple(h0.shape)}, {tuple(loss_gradients.shape)}."
        )
    layout = ParameterLayout(cell)
    params = {n: p.detach() for n, p in cell.named_parameters()}
    if cut == "preactivation":
        if not (hasattr(cell, "preactivation") and hasattr(cell, "activation")):
            raise ValueError(f"oracle_terms: {type(cell).__name__} has no preactivation/activation; use cut='state'.")
        problem = factorisation_problem(cell, ("step",), layout, (xs.shape[1], h0.shape[0]))
        if problem is not None:
            raise ValueError(
                f"oracle_terms: cut='preactivation' needs forward = activation(preactivation): {problem}; use"
                " cut='state'."
            )
        first_z = functional_call(
            _Method(cell, "preactivation"), {f"cell.{k}": v for k, v in params.items()}, (xs[:1], h0[None])
        )
        if activation_reads_parameters(cell, first_z.detach()):
            raise ValueError(
                f"oracle_terms: {type(cell).__name__}.activation reads parameters, so the preactivation is not a cut"
                " vertex for them; use cut='state'."
            )
    elif cut != "state":
        raise ValueError(f"oracle_terms: cut must be 'state' or 'preactivation', got {cut!r}.")

    def step_to_cut(p: dict[str, torch.Tensor], x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        method = "preactivation" if cut == "preactivation" else "forward"
        if method == "forward":
            return functional_call(cell, p, (x[None], h[None]))[0]
        return functional_call(_Method(cell, method), {f"cell.{k}": v for k, v in p.items()}, (x[None], h[None]))[0]

    def cut_to_state(z: torch.Tensor) -> torch.Tensor:
        if cut == "state":
            return z
        return functional_call(_Method(cell, "activation"), {f"cell.{k}": v for k, v in params.items()}, (z[None],))[0]

    # the inputs a of z = W a only where that holds of the cell (else preactivation_b_matrix refuses the terms)
    sizes = (xs.shape[1], h0.shape[0])
    linear = cut == "preactivation" and factorisation_problem(cell, ("linear",), layout, sizes) is None
    with torch.enable_grad():
        zs, hs, h = [], [], h0.detach()
        jacobians, inputs = [], []
        for t in range(steps):
            jac = jacrev(step_to_cut)(params, xs[t], h)
            jacobians.append(layout.flatten(jac, lead=1))
            if linear:
                inputs.append(cell.preactivation_input(xs[t][None], h[None])[0].detach())
            # dL_s/dz_r is taken as the gradient with respect to a zero perturbation added at z_r.
            perturbation = h0.new_zeros(jacobians[-1].shape[0]).requires_grad_(True)
            z = step_to_cut(params, xs[t], h) + perturbation
            h = cut_to_state(z)
            zs.append(perturbation)
            hs.append(h)
        size = zs[0].shape[0]
        b = h0.new_zeros(steps, steps, size)
        for s in range(steps):
            grads = torch.autograd.grad(hs[s], zs[: s + 1], loss_gradients[s], retain_graph=True)
            for r, g in enumerate(grads):
                b[s, r] = g
    jacobians_t = torch.stack(jacobians)
    gradient = torch.einsum("srz,rzp->p", b, jacobians_t)
    return OracleTerms(b, jacobians_t, torch.stack(inputs) if inputs else None, gradient)


def total_variance(terms: OracleTerms, rescaling: torch.Tensor) -> torch.Tensor:
    """``tr Cov(g)`` of the fixed-``Q`` estimator with Gaussian noise (Cooijmans & Martens 2019, eq. 6.5),
    ``rescaling`` = ``Q`` ``(T, Z, Z)`` (one ``Q_t`` per step) or ``(Z, Z)`` (the same every step). Returns a 0-d
    tensor."""
    b, jac = terms.b, terms.jacobians
    steps, _, size = b.shape
    q = rescaling.expand(steps, size, size) if rescaling.dim() == 2 else rescaling
    qq = q @ q.transpose(1, 2)  # Q_r Q_r^T
    qq_inv = torch.linalg.inv(qq)
    # left[s, t] = sum_r b_r^(s)T Q_r Q_r^T b_r^(t);  right[s, t] = sum_{q <= min(s,t)} tr(J_q J_q^T (Q_q Q_q^T)^{-1})
    left = torch.einsum("srz,rzy,try->st", b, qq, b)
    per_step = torch.einsum("qzp,qyp,qyz->q", jac, jac, qq_inv)
    cumulative = torch.cumsum(per_step, 0)
    index = torch.minimum(torch.arange(steps)[:, None], torch.arange(steps)[None, :])
    v_q = (left * cumulative[index]).sum()
    # v[t, s] = sum_{q <= s} J_q^T b_q^(t)
    contributions = torch.einsum("tqz,qzp->tqp", b, jac)
    v = torch.cumsum(contributions, dim=1)  # v[t, s]
    fixed = torch.einsum("tsp,stp->", v, v)
    return v_q + fixed


def preactivation_b_matrix(terms: OracleTerms, alpha: torch.Tensor | None = None) -> torch.Tensor:
    """Cooijmans & Martens 2019, Section 7: ``B = sum_{q,r} (alpha_r^2 / alpha_q^2) ||a_q||^2 c_qr c_qr^T``, ``(Z, Z)``.

    Raises:
        ValueError: the terms have no preactivation inputs (cut the cell at a preactivation ``z = W a``).
    """
    if terms.inputs is None:
        raise ValueError(
            "preactivation_b_matrix: needs terms of a cell with z = W a (oracle_terms cut='preactivation')."
        )
    steps = terms.b.shape[0]
    alpha = terms.b.new_ones(steps) if alpha is None else torch.as_tensor(alpha, dtype=terms.b.dtype)
    c = _future_sums(terms.b)  # c[q, r] (T, T, Z)
    weights = (alpha[None, :] ** 2 / alpha[:, None] ** 2) * terms.inputs.square().sum(1)[:, None]  # (q, r)
    return torch.einsum("qr,qrz,qry->zy", weights, c, c)


def _future_sums(b: torch.Tensor) -> torch.Tensor:
    """``c[q, r] = sum_{s >= max(q, r)} b[s, r]``, ``(T, T, Z)``."""
    steps = b.shape[0]
    tail = torch.flip(torch.cumsum(torch.flip(b, [0]), 0), [0])  # tail[m, r] = sum_{s >= m} b[s, r]
    index = torch.maximum(torch.arange(steps)[:, None], torch.arange(steps)[None, :])  # max(q, r)
    return tail[index, torch.arange(steps)[None, :]]


def optimal_q0(b_matrix: torch.Tensor, ridge: float = 0.0) -> torch.Tensor:
    """``Q0 = (B + ridge I)^{-1/4}`` (Cooijmans & Martens 2019, Section 7), the minimiser of
    ``tr(B Q0 Q0^T) tr((Q0 Q0^T)^{-1})``.

    Raises:
        ValueError: ``B`` is not symmetric positive definite (add a ``ridge``).
    """
    sym = 0.5 * (b_matrix + b_matrix.T) + ridge * torch.eye(b_matrix.shape[0], dtype=b_matrix.dtype)
    values, vectors = torch.linalg.eigh(sym)
    if values.min() <= 0:
        raise ValueError(f"optimal_q0: B has eigenvalue {values.min().item():.3g} <= 0; pass ridge > 0.")
    return vectors @ torch.diag(values**-0.25) @ vectors.T


def optimal_alpha(terms: OracleTerms, q0: torch.Tensor | None = None, iterations: int = 200) -> torch.Tensor:
    """The optimal ``alpha`` ``(T,)`` given ``Q0`` (Cooijmans & Martens 2019, Section 7): ``x = alpha^2`` iterates
    ``x_k^2 = (sum_r K_kr x_r) / (sum_q K_qk / x_q)`` with ``K_qr = ||a_q||^2 ||Q0^T c_qr||^2``; normalised to
    geometric mean 1 (``V`` does not depend on a common scale)."""
    if terms.inputs is None:
        raise ValueError("optimal_alpha: needs terms of a cell with z = W a (oracle_terms cut='preactivation').")
    c = _future_sums(terms.b)
    projected = c if q0 is None else c @ q0
    k = terms.inputs.square().sum(1)[:, None] * projected.square().sum(-1)  # (q, r)
    x = terms.b.new_ones(k.shape[0])
    for _ in range(iterations):
        x = torch.sqrt((k @ x) / (k.T @ (1 / x)).clamp_min(torch.finfo(x.dtype).tiny))
        x = x / torch.exp(torch.log(x).mean())
    return torch.sqrt(x)


def preactivation_variance(terms: OracleTerms, q0: torch.Tensor | None, alpha: torch.Tensor | None) -> torch.Tensor:
    """``V(Q) = tr(B Q0 Q0^T) tr((Q0 Q0^T)^{-1})`` at the preactivation (the ``Q``-dependent part of 6.5)."""
    b_matrix = preactivation_b_matrix(terms, alpha)
    size = b_matrix.shape[0]
    m = torch.eye(size, dtype=b_matrix.dtype) if q0 is None else q0 @ q0.T
    return torch.trace(b_matrix @ m) * torch.trace(torch.linalg.inv(m))
