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
least-squares refit.

Numerics. The inputs as stored are the data: converted to float64 they are exact, whatever dtype they came in
(float16 inputs near 300 are multiples of 0.25 that vary by about 1, and that variation determines the codes like
any other), so the tolerance models only the float64 arithmetic of the refit, not the inputs' dtype. The data are
first scaled by an exact power of two (largest entry in ``[0.5, 1)``), so squares neither overflow nor underflow for
inputs of any magnitude; the codes do not depend on it and the bias is scaled back exactly. They are centred in two
passes (subtract the mean, then the mean of what is left), so a large common offset does not leave the first mean's
rounding in every centred row: with unit roundoff ``eps`` (float64) and the naive summation bound for the means, the
computed centred data are the exact ``X_c`` plus ``E`` with

    ||E||_F <= eps ((N + 3) ||X_c||_F + eps N (N + 2) sqrt(N n) max|x_ij|)

(the second term: the rounding of the subtracted first mean, itself at most ``N eps max|x_ij|``), and the product
``X_c D`` adds at most ``n eps ||X_c||_F ||D||_F``. In a direction ``v`` that the exact data do not determine
(``T_c v = 0``) the computed ``v^T G v`` is then at most ``||(E D + dT) v||^2 + (rounding of the Gram product) <=
(||E||_F + n eps ||X_c||_F)^2 ||D||_F^2 + max(N, n) eps trace(G)``, which is the tolerance: an eigen-direction
with eigenvalue at most that is undetermined, and one above it carries more than rounding. One tolerance serves the
whole data (``data_rank``, the rank of ``X_c``) and every row's ``s x s`` block ``G[S, S]``: a principal submatrix's
``k``-th eigenvalue is at most ``G``'s (Cauchy interlacing), so no row counts more determined directions than
``data_rank``. ``N(0, 1)`` inputs plus ``10^12`` have centred values exact to ``eps`` of their own size and
determine all codes; inputs on a 3-dimensional affine subspace plus ``10^8``, stored in float64, lie off it by
their rounding (``~10^-8``), whose Gram eigenvalues are below what float64 Gram products resolve: rank 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Refit:
    """Output of :func:`refit_on_data`.

    Attributes:
        codes: ``(out, n)`` refit codes (zero off the support).
        bias: ``(out,)`` refit bias.
        undetermined_rows: number of output rows whose ``s`` code values the data do not determine.
        data_rank: rank of the centred data ``X - mean(X)`` (the same tolerance as for the rows).
        support_rank: the smallest rank of the centred data on one row's support, ``T_c[:, S]`` (at most
            ``min(s, data_rank)``; below ``s`` exactly when some row is undetermined).
    """

    codes: torch.Tensor
    bias: torch.Tensor
    undetermined_rows: int
    data_rank: int
    support_rank: int


#: Rows per unknown of an output row (its ``s`` code values and the bias) below which the refit is warned about: with
#: fewer than ``2 (s + 1)`` rows a least-squares fit of ``s + 1`` unknowns (nearly) interpolates them, so its error on
#: them (``output_error``) is near zero whatever it does to other inputs.
ROWS_PER_UNKNOWN = 2


def refit_warning(refit: Refit, rows: int, s: int, out: int, output_error: float) -> str | None:
    """The warning a refit on ``rows`` inputs deserves, or ``None``: some output rows undetermined (centred rank
    below ``s`` on their support; they keep the no-data codes in the other directions), or fewer than
    ``ROWS_PER_UNKNOWN (s + 1)`` rows. Either way ``output_error`` (percent, on these rows) is in-sample on too
    few rows and says little about other inputs, which the message says with the figure."""
    advice = "Pass more distinct inputs (hundreds) or data=None."
    if refit.undetermined_rows:
        if rows > refit.data_rank + 1:  # the rows are not what limits the rank: the inputs vary in few directions
            advice = (
                f"The {rows} rows vary in only {refit.data_rank} directions (inputs that are constant, such as "
                "features a ReLU always zeroes, add none), so more rows like them will not help; where those "
                "directions never vary in use, the refit is exact on the data the layer sees."
            )
        return (
            f"compress_linear: data has {rows} row{'s' * (rows != 1)} of centred rank {refit.data_rank} (as low as "
            f"{refit.support_rank} on an output row's support), which do not determine the s={s} code values of "
            f"{refit.undetermined_rows} of the {out} output rows (each needs centred rank {s} on its support: at "
            f"least {s + 1} distinct rows in general position). Those rows were refit only in the directions the "
            f"data determine, the rest keep the no-data codes; output_error={output_error:.3g}% is in-sample on "
            f"these rows and says little about other inputs. {advice}"
        )
    if rows < ROWS_PER_UNKNOWN * (s + 1):
        return (
            f"compress_linear: data has {rows} rows for the s + 1 = {s + 1} unknowns of each output row (s code "
            f"values and the bias); with fewer than {ROWS_PER_UNKNOWN * (s + 1)} rows ({ROWS_PER_UNKNOWN} per "
            f"unknown) the least-squares refit (nearly) interpolates them, so output_error={output_error:.3g}% is "
            f"in-sample on too few rows and says nothing about other inputs (their error may be far above the "
            f"no-data fit's). {advice}"
        )
    return None


def times_power_of_two(tensor: torch.Tensor, exponent: int) -> torch.Tensor:
    """``tensor * 2^exponent``, exact unless the result leaves the dtype's normal range (two half steps, so that
    neither factor overflows for ``|exponent|`` up to about 2000)."""
    half = exponent // 2
    tensor = torch.ldexp(tensor, torch.tensor(half, dtype=tensor.dtype))
    return torch.ldexp(tensor, torch.tensor(exponent - half, dtype=tensor.dtype))


def relative_square_error(target: torch.Tensor, approximation: torch.Tensor) -> float:
    """``100 ||target - approximation||_F^2 / ||target||_F^2`` (percent), computed after an exact power-of-two scaling
    of both, so that outputs of any magnitude (``1e160``, ``1e-170``) neither overflow nor underflow in the squares.
    ``0`` when both are zero, ``inf`` when only the target is."""
    largest = float(torch.maximum(target.abs().max(), approximation.abs().max())) if target.numel() else 0.0
    if largest == 0:
        return 0.0
    exponent = -math.frexp(largest)[1]
    target, approximation = times_power_of_two(target, exponent), times_power_of_two(approximation, exponent)
    error, energy = float((target - approximation).square().sum()), float(target.square().sum())
    return 100 * error / energy if energy > 0 else math.inf


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
        data: ``(N, n)`` inputs of the layer (float64, finite). weight: ``(out, n)`` ``W``. bias: ``(out,)`` ``b0``
            or ``None`` (zero). dictionary: ``(n, n)`` dense ``D`` (invertible). codes: ``(out, n)`` no-data codes
            ``c0`` (zero off the support). support: ``(out, s)`` int64 column indices of each row's support.

    Returns:
        :class:`Refit`. The refit layer is ``x -> codes (D^T x) + bias``.
    """
    count, n = data.shape
    s = support.shape[1]
    eps = torch.finfo(torch.float64).eps
    # An exact power-of-two scale 2^-e (largest entry in [0.5, 1)): squares stay in range for any magnitude; the
    # codes are invariant, the bias terms are scaled back by 2^e at the end.
    largest = float(data.abs().max())
    exponent = math.frexp(largest)[1] if largest > 0 else 0
    x = times_power_of_two(data, -exponent)
    mean = x.mean(0)
    centered = x - mean
    correction = centered.mean(0)  # the first mean's rounding (~eps |offset|), seen against the centred values
    mean, centered = mean + correction, centered - correction
    t_c = centered @ dictionary  # (N, n): rows D^T (x - mu)
    mu_t = mean @ dictionary  # (n,): D^T mu
    residual = weight - codes @ dictionary.T  # R = W - C0 D^T: the no-data fit's error, f(x) - fit(x) = R x
    gram = t_c.T @ t_c  # (n, n)
    cross = t_c.T @ (centered @ residual.T)  # (n, out): centred T^T (R x_i), per output row
    mean_residual = residual @ mean  # (out,): the mean output error of the no-data fit (scaled by 2^-e)

    # Below the tolerance an eigenvalue is rounding of the refit's own float64 arithmetic (module docstring): the
    # centring and the product by D, mapped through D, plus the Gram product's. The stored inputs are exact data.
    centred_norm = math.sqrt(float(centered.square().sum()))
    offset_rounding = eps * count * (count + 2) * math.sqrt(count * n) * float(x.abs().max())
    centring_error = eps * ((count + n + 3) * centred_norm + offset_rounding)
    tolerance = centring_error**2 * float(dictionary.square().sum()) + max(count, n) * eps * float(gram.trace())
    g_ss = gram[support[:, :, None], support[:, None, :]]  # (out, s, s)
    values, vectors = torch.linalg.eigh(g_ss)  # ascending eigenvalues (out, s), eigenvectors (out, s, s)
    determined = values > tolerance
    g_rows = cross.T.gather(1, support)  # (out, s)
    projected = (vectors.transpose(1, 2) @ g_rows[..., None])[..., 0]
    w_known = torch.where(determined, projected / torch.where(determined, values, 1.0), 0.0)

    # Undetermined directions: minimise dc^T P dc + (beta - m . dc)^2 over the free part of w (dc = V w, the
    # determined part fixed; P = V^T (D^T D)[S, S] V, m = V^T mu_t[S], beta = the mean residual left by w_known:
    # db = beta - m . dc keeps the mean output exact). Normal equations (P_ff + m_f m_f^T) w_f = a + m_f beta with
    # a = -(P w_known)_f, solved by Sherman-Morrison in the scaled units (m = 2^e m', beta = 2^e beta'), so that a
    # large offset (m m^T ~ |x|^2) cannot overflow: w_f = y + h (beta' - m'_f . y) / (2^-2e + m'_f . h) with
    # P_ff y = a, P_ff h = m'_f.
    p_full = dictionary.T @ dictionary
    p_ss = vectors.transpose(1, 2) @ p_full[support[:, :, None], support[:, None, :]] @ vectors
    m_rows = (vectors.transpose(1, 2) @ mu_t[support][..., None])[..., 0]  # (out, s), scaled by 2^-e
    free = ~determined
    both_free = free[:, :, None] & free[:, None, :]
    eye = torch.eye(s, dtype=p_ss.dtype).expand_as(p_ss)
    p_free = torch.where(both_free, p_ss, eye)  # determined rows/columns: identity, right-hand sides zero there
    a = torch.where(free, -(p_ss @ w_known[..., None])[..., 0], 0.0)
    m_free = torch.where(free, m_rows, 0.0)
    if not bool(torch.isfinite(p_free).all()):
        raise ValueError(
            "refit_on_data: the dictionary's Gram matrix on a support is not finite (a dictionary with NaN or inf, "
            f"or inputs that overflow): max |D| = {float(dictionary.abs().max()):.3g}."
        )
    # P_ff is symmetric positive definite (a principal block of D^T D in an orthonormal basis, identity elsewhere):
    # Cholesky, which also keeps away from the batched LU of large stacks
    factor, info = torch.linalg.cholesky_ex(p_free)
    if bool((info == 0).all()):
        solved = torch.cholesky_solve(torch.stack([a, m_free], -1), factor)  # (out, s, 2): y and h
    else:  # numerically indefinite (an ill-conditioned D): the general solver
        solved = torch.linalg.solve(p_free, torch.stack([a, m_free], -1))
    y, h = solved[..., 0], solved[..., 1]
    beta = mean_residual - (m_rows * w_known).sum(1)
    inverse_square_scale = math.ldexp(1.0, -2 * exponent) if -2 * exponent < 1000 else math.inf  # 2^-2e
    denominator = inverse_square_scale + (m_free * h).sum(1)  # zero only where m_f = 0, so h = 0 (no change)
    factor = torch.where(denominator > 0, (beta - (m_free * y).sum(1)) / denominator, 0.0)
    w = w_known + torch.where(free, y + h * factor[:, None], 0.0)
    delta_codes = (vectors @ w[..., None])[..., 0]  # (out, s)
    delta_bias = times_power_of_two(mean_residual - (mu_t[support] * delta_codes).sum(1), exponent)

    new_codes = codes.clone()
    new_codes.scatter_(1, support, codes.gather(1, support) + delta_codes)
    new_bias = (bias if bias is not None else torch.zeros_like(mean_residual)) + delta_bias
    data_rank = int((torch.linalg.eigvalsh(gram) > tolerance).sum())
    support_rank = int(determined.sum(1).min()) if determined.numel() else 0
    return Refit(new_codes, new_bias, int(free.any(1).sum()), data_rank, support_rank)
