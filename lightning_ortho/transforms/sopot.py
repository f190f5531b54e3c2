"""Sums of signed powers of two (SOPOT): Rusu eq. (4) and Algorithm 1.

``R_p = { sum_{t=1}^p s_t 2^{v_t} : s_t in {-1, 0, +1}, v_t in Z }``. Multiplying by an element of ``R_p`` takes
``p`` shifts and ``p - 1`` additions, so a transform whose coefficients lie in ``R_p`` needs no multiplier.

What the paper leaves open and what this module does (inferred from the author's MATLAB ``nearestpow2sum``):

* exponents are unbounded (``v_t`` is any integer the floating-point type can hold; the paper's 8-bit storage
  would suggest ``-128..127``, which only matters for values below ``2^-128``), one more than the dtype's largest
  included: near the top of the range the nearest power of two can be ``2^(emax+1)`` (``2^16`` for float16),
  which overflows the dtype although the expansion is finite (``65504 = 2^16 - 2^5``); it is used as a term, and
  only a one-term value that would be ``2^(emax+1)`` itself is clamped to ``2^emax`` (with a warning);
* each step rounds the residual's magnitude to the nearer of ``2^(a-1)`` and ``2^a`` with ``a = ceil(log2|r|)``,
  in linear distance; an exact tie goes to the smaller power ``2^(a-1)``; ``ceil(log2|r|)`` is computed exactly
  from ``frexp``, not from a rounded logarithm;
* the greedy loop stops early once ``|r| <= tol`` (``tol = 1e-6`` in the code), so a value may use fewer than
  ``p`` terms; the cost counts only the terms used.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

#: The early-stopping tolerance of Algorithm 1 (``|x - x_hat| <= 1e-6``), as in the author's code.
SOPOT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class SOPOTResult:
    """Greedy SOPOT expansion of a tensor ``x`` of shape ``S`` with at most ``p`` terms.

    Attributes:
        values: ``S``, the quantised values ``x_hat = sum_t signs[..., t] * 2 ** exponents[..., t]``.
        error: ``S``, the quantisation error ``x - x_hat``.
        signs: ``S + (p,)``, ``+-1`` for the terms used, ``0`` for unused terms (``int64``).
        exponents: ``S + (p,)``, the exponents ``v_t`` (``0`` where the term is unused; ``int64``).
        shifts: ``S``, the shifts to multiply by ``x_hat``: one per term used (``int64``).
        additions: ``S``, the additions: ``max(terms used - 1, 0)`` (``int64``).
    """

    values: torch.Tensor
    error: torch.Tensor
    signs: torch.Tensor
    exponents: torch.Tensor
    shifts: torch.Tensor
    additions: torch.Tensor

    @property
    def terms_used(self) -> torch.Tensor:
        """``S``, the number of nonzero terms of each value (``int64``)."""
        return self.shifts


def _check_terms(terms: object, where: str) -> int | None:
    if terms is None or (isinstance(terms, float) and terms == math.inf):
        return None
    if not isinstance(terms, int) or isinstance(terms, bool) or terms < 1:
        raise ValueError(
            f"{where}: terms must be a positive integer (the p of R_p) or None / math.inf for full precision, "
            f"got {terms!r}."
        )
    return terms


def _check_input(x: object, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: x must be a torch.Tensor, got {type(x).__name__}.")
    if not x.is_floating_point():
        raise TypeError(
            f"{where}: x must be a floating-point tensor, got dtype {x.dtype}. Convert it, e.g. x.double()."
        )
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{where}: x contains NaN or infinite values; SOPOT expansions exist only for finite numbers.")
    return x


def _nearest_power_exponent(magnitude: torch.Tensor) -> torch.Tensor:
    """Exponent ``v in {a - 1, a}``, ``a = ceil(log2 m)``, whose ``2^v`` is nearest to ``m > 0`` (tie: ``a - 1``)."""
    mantissa, exponent = torch.frexp(magnitude)  # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    a = torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.int64)  # exact ceil(log2 m)
    low = torch.ldexp(torch.ones_like(magnitude), a - 1)
    high = 2 * low
    return torch.where(high - magnitude < magnitude - low, a, a - 1)


def sopot_with_cost(x: torch.Tensor, terms: int, *, tol: float = SOPOT_TOLERANCE) -> SOPOTResult:
    """Algorithm 1 (greedy SOPOT) elementwise, with the expansion and its cost per value.

    ``r <- x, x_hat <- 0``; for ``t = 1..p``: ``s_t = sign(r)``, ``a = ceil(log2|r|)``, ``v_t`` the one of
    ``{a - 1, a}`` with ``2^v_t`` nearest to ``|r|`` (tie: ``a - 1``), ``x_hat <- x_hat + s_t 2^v_t``,
    ``r <- x - x_hat``; stop once ``|r| <= tol``. Example: ``1/sqrt(2) -> 0.5, 0.75, 0.71875`` for ``p = 1, 2, 3``.

    Accuracy: each term divides the residual by at least 3, so ``|x - x_hat| <= |x| / 3^p`` until the early stop,
    for every finite ``x`` of every dtype. Top of the range: a term may be ``2^(emax+1)`` (``emax`` the dtype's
    largest exponent, e.g. 15 for float16), computed without overflow, and every expansion of two or more terms is
    finite (its partial sums after the first stay below the largest finite value). The one exception is a
    one-term value equal to ``2^(emax+1)`` (``p = 1`` and ``|x| > 1.5 * 2^emax``, e.g. 60000 in float16): it is not
    representable, so it is clamped to ``sign(x) 2^emax``, the best finite power of two (relative error up to 1/2),
    and a ``RuntimeWarning`` says so. Outputs are always finite.

    Args:
        x: any shape ``S``, floating point; computed in its own dtype (powers of two are exact in it).
        terms: ``p >= 1``, the maximum number of terms.
        tol: early-stopping tolerance on ``|r|`` (``0`` runs all ``p`` steps unless ``r`` is exactly zero).

    Returns:
        :class:`SOPOTResult` (values, error, signs, exponents, shifts, additions).

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``terms`` is not a positive integer (use :func:`sopot` for ``terms=None``), or ``x`` holds NaN/inf.

    Warns:
        RuntimeWarning: some one-term values were clamped to ``2^emax`` (see Accuracy).
    """
    x = _check_input(x, "sopot_with_cost")
    p = _check_terms(terms, "sopot_with_cost")
    if p is None:
        raise ValueError("sopot_with_cost: terms=None (full precision) has no finite expansion; call sopot(x, None).")
    x = x.detach()
    # In the top binade, |x| >= 2^emax, the nearest power of two can be 2^(emax + 1), which overflows the dtype
    # although the expansion is finite (65504 = 2^16 - 2^5 in float16): run the loop on x / 2 there (exact, and
    # every residual of such an x is a multiple of its ulp, far from the subnormals) and double the result.
    emax = math.frexp(torch.finfo(x.dtype).max)[1] - 1  # largest power of two of the dtype: 2^emax
    top = math.ldexp(1.0, emax)
    halve = x.abs() >= top
    work = torch.where(halve, x * 0.5, x)
    estimate = torch.zeros_like(x)
    residual = work.clone()
    signs = torch.zeros((*x.shape, p), dtype=torch.int64, device=x.device)
    exponents = torch.zeros((*x.shape, p), dtype=torch.int64, device=x.device)
    for t in range(p):
        active = torch.where(halve, residual.abs() > tol / 2, residual.abs() > tol)
        if not bool(active.any()):
            break
        magnitude = torch.where(active, residual.abs(), torch.ones_like(residual))
        v = torch.where(active, _nearest_power_exponent(magnitude), 0)
        s = torch.where(active, torch.sign(residual), torch.zeros_like(residual))
        estimate = estimate + s * torch.ldexp(torch.ones_like(x), v)
        residual = work - estimate
        signs[..., t] = s.to(torch.int64)
        exponents[..., t] = v + (halve & active).to(torch.int64)
    estimate = torch.where(halve, estimate * 2, estimate)
    # Only a single term can overflow (p = 1, or a tolerance >= the top binade's ulp): no expansion with more
    # terms exceeds the largest finite value. The best finite one-term value is then sign(x) 2^emax.
    overflow = torch.isinf(estimate)
    if bool(overflow.any()):
        count = int(overflow.sum())
        warnings.warn(
            f"sopot: {count} value(s) of {x.dtype} above 1.5 * 2^{emax} have the nearest power of two "
            f"2^{emax + 1}, which overflows {x.dtype}; with one term they are clamped to 2^{emax} = {top:.6g} "
            f"(relative error up to 1/2 instead of 1/3). Use terms >= 2 or a wider dtype for the usual accuracy.",
            RuntimeWarning,
            stacklevel=2,
        )
        estimate = torch.where(overflow, torch.sign(x) * top, estimate)
        signs[overflow] = 0
        signs[..., 0] = torch.where(overflow, torch.sign(x).to(torch.int64), signs[..., 0])
        exponents[overflow] = 0
        exponents[..., 0] = torch.where(overflow, emax, exponents[..., 0])
    used = (signs != 0).sum(-1)
    return SOPOTResult(
        values=estimate,
        error=x - estimate,
        signs=signs,
        exponents=exponents,
        shifts=used,
        additions=(used - 1).clamp_min(0),
    )


def sopot(x: torch.Tensor, terms: int | None, *, tol: float = SOPOT_TOLERANCE) -> torch.Tensor:
    """Quantise ``x`` elementwise to ``R_p`` with Algorithm 1; ``terms=None`` (``p = inf``) returns ``x`` itself.

    Shapes: ``x`` any shape -> same shape and dtype. Not differentiable (a piecewise-constant map); use a
    straight-through estimator (``x + (sopot(x, p) - x).detach()``) to train through it.

    Outputs are finite for every finite input; near the top of the dtype's range see :func:`sopot_with_cost`
    (Accuracy): two or more terms keep the usual bound ``|x - x_hat| <= |x| / 3^p``, one term may be clamped to
    the largest power of two of the dtype (with a ``RuntimeWarning``).

    Args:
        x: floating-point values, any shape.
        terms: ``p``, the most signed powers of two per value; ``None`` (or ``math.inf``) for full precision.
        tol: stop adding terms once the remainder is at most this, as :func:`sopot_with_cost`.

    Raises:
        TypeError: ``x`` is not a floating-point tensor (as :func:`sopot_with_cost`).
        ValueError: ``terms`` is neither a positive integer nor ``None``/``math.inf``, or ``x`` holds NaN/inf.
    """
    if _check_terms(terms, "sopot") is None:
        _check_input(x, "sopot")
        return x
    return sopot_with_cost(x, terms, tol=tol).values


def sopot_terms_needed(value: float, max_terms: int) -> int | None:
    """Number of greedy SOPOT terms that represent ``value`` exactly, or ``None`` if more than ``max_terms`` are needed.

    Runs Algorithm 1 in float64 with ``tol = 0``. Used by the operation counts of SOPOT-coefficient blocks.
    """
    result = sopot_with_cost(torch.tensor(float(value), dtype=torch.float64), max_terms, tol=0.0)
    if float(result.error) != 0.0:
        return None
    return int(result.shifts)
