"""Refit the code values and bias of ``y ~ C (D^T x) + b`` by least squares on a layer's inputs, only where the
inputs determine them.

Setting (one output row at a time, float64): inputs ``X`` ``(N, n)``, the dense layer ``f(x) = W x + b0``, a
dictionary ``D`` ``(n, n)`` and the no-data codes ``c0`` on a fixed support ``S`` of ``s`` entries (from the
Frobenius fit ``W ~ C D^T``). With ``t = D^T x`` the refit minimises over the support's values ``c`` and the bias
``b`` the squared output error on the data,

    E(c, b) = sum_i ( f(x_i) - c . t_i[S] - b )^2,

whose unknowns are ``s + 1`` per row. Centring, ``t = t_c + mu_t``, splits it: the mean output fixes
``b + c . mu_t[S]`` (always determined), and the codes solve ``G c = g`` with ``G = T_c[:, S]^T T_c[:, S]``
(``s x s``), which is determined only when the centred data have rank ``s`` on the support. Fewer distinct inputs
(one row, identical rows, inputs on a low-dimensional affine subspace) leave a set of exact minimisers; the
least-squares optimum there is not unique and an arbitrary one (e.g. zero codes and a constant layer) fits the data
while wrecking every other input.

Among all minimisers this returns the one closest to the no-data fit ``(c0, b0)`` in the metric the no-data fit
itself uses: ``||W - C D^T||_F^2`` is the output error for isotropic unit inputs (``E[x] = 0``, ``E[x x^T] = I``),
under which a change ``(dc, db)`` of one row moves the output by

    E_x (dc . (D^T x)[S] + db)^2 = dc^T (D^T D)[S, S] dc + db^2.

So directions the data determine are fitted exactly, and the undetermined ones change only as much as the exact
fit requires (none at all when the data say nothing about them). With data of full centred rank this is the plain
least-squares refit. Numerically, an eigen-direction of ``G`` with eigenvalue at most
``max(N, s) eps trace(T[:, S]^T T[:, S])`` (uncentred: the rounding level of the centring) is undetermined.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Refit:
    """Output of :func:`refit_on_data`.

    Attributes:
        codes: ``(out, n)`` refit codes (zero off the support).
        bias: ``(out,)`` refit bias.
        undetermined_rows: number of output rows whose ``s`` code values the data do not determine.
        data_rank: rank of the centred data ``X - mean(X)`` (same tolerance as for the rows).
    """

    codes: torch.Tensor
    bias: torch.Tensor
    undetermined_rows: int
    data_rank: int


def refit_on_data(
    data: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dictionary: torch.Tensor,
    codes: torch.Tensor,
    support: torch.Tensor,
) -> Refit:
    """Least-squares codes and bias on ``data``, closest to the no-data fit where under-determined (module docstring).

    Args:
        data: ``(N, n)`` inputs of the layer (float64). weight: ``(out, n)`` ``W``. bias: ``(out,)`` ``b0`` or
            ``None`` (zero). dictionary: ``(n, n)`` dense ``D`` (invertible). codes: ``(out, n)`` no-data codes
            ``c0`` (zero off the support). support: ``(out, s)`` int64 column indices of each row's support.

    Returns:
        :class:`Refit`. The refit layer is ``x -> codes (D^T x) + bias``.
    """
    count, n = data.shape
    s = support.shape[1]
    eps = torch.finfo(torch.float64).eps
    mean = data.mean(0)
    centered = data - mean
    t_c = centered @ dictionary  # (N, n): rows D^T (x - mu)
    mu_t = mean @ dictionary  # (n,): D^T mu
    residual = weight - codes @ dictionary.T  # R = W - C0 D^T: the no-data fit's error, f(x) - fit(x) = R x
    gram = t_c.T @ t_c  # (n, n)
    cross = t_c.T @ (centered @ residual.T)  # (n, out): centred T^T (R x_i), per output row
    mean_residual = residual @ mean  # (out,): the mean output error of the no-data fit

    # Scale of the uncentred moments on each support: centring rounds at eps times it, so below it is noise.
    raw_diagonal = gram.diagonal() + count * mu_t.square()
    scale = max(count, s) * eps * raw_diagonal[support].sum(1)  # (out,)
    g_ss = gram[support[:, :, None], support[:, None, :]]  # (out, s, s)
    values, vectors = torch.linalg.eigh(g_ss)  # ascending eigenvalues (out, s), eigenvectors (out, s, s)
    determined = values > scale[:, None]
    g_rows = cross.T.gather(1, support)  # (out, s)
    projected = (vectors.transpose(1, 2) @ g_rows[..., None])[..., 0]
    w_known = torch.where(determined, projected / torch.where(determined, values, 1.0), 0.0)

    # Undetermined directions: minimise dc^T P dc + (beta - m . dc)^2 with dc = V w and w's determined part fixed
    # (P = (D^T D)[S, S], m = mu_t[S], beta = mean residual: db = beta - m . dc keeps the mean output exact).
    p_full = dictionary.T @ dictionary
    p_ss = vectors.transpose(1, 2) @ p_full[support[:, :, None], support[:, None, :]] @ vectors
    m_rows = (vectors.transpose(1, 2) @ mu_t[support][..., None])[..., 0]  # (out, s)
    free = ~determined
    system = p_ss + m_rows[:, :, None] * m_rows[:, None, :]
    both_free = free[:, :, None] & free[:, None, :]
    eye = torch.eye(s, dtype=system.dtype).expand_as(system)
    system = torch.where(both_free, system, eye)  # determined rows/columns: identity, right-hand side zero
    beta = mean_residual - (m_rows * w_known).sum(1)
    rhs = -(p_ss @ w_known[..., None])[..., 0] + m_rows * beta[:, None]
    w_free = torch.linalg.solve(system, torch.where(free, rhs, 0.0)[..., None])[..., 0]
    w = w_known + torch.where(free, w_free, 0.0)
    delta_codes = (vectors @ w[..., None])[..., 0]  # (out, s)
    delta_bias = mean_residual - (mu_t[support] * delta_codes).sum(1)

    new_codes = codes.clone()
    new_codes.scatter_(1, support, codes.gather(1, support) + delta_codes)
    new_bias = (bias if bias is not None else torch.zeros_like(mean_residual)) + delta_bias
    data_values = torch.linalg.eigvalsh(gram)
    data_rank = int((data_values > max(count, n) * eps * float(raw_diagonal.sum())).sum())
    return Refit(new_codes, new_bias, int(free.any(1).sum()), data_rank)
