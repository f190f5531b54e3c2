"""Theorem 2's provably invertible auxiliary weight ``W = I + V V^T / (2 (1 + m) sigma_max(V V^T))``.

Theorem 2 ("One Reflection Suffice", Appendix A.2.1): ``f(x) = H(W x) x`` is invertible on all of ``R^d`` when
``W`` is symmetric with ``3/2 lambda_min(W) > lambda_max(W)``. With ``W = I + V V^T / (2 sigma)`` and
``sigma >= sigma_max(V V^T)`` the eigenvalues of ``W`` lie in ``[1, 3/2]``; the safety factor ``1 + m`` (``m > 0``)
makes the inequality strict when ``V`` is rank deficient, where the paper's ``1/2`` would make it an equality.

:class:`InvertibleAuxiliaryWeight` is the module that owns the free ``V`` (``factor``) and computes ``W``; an
:class:`~lightning_ortho.nn.AuxiliaryReflection` built with ``invertible=True`` holds one as ``constraint``.
(It is deliberately not a ``torch.nn.utils.parametrize`` parametrisation: PyTorch refuses to pickle parametrised
modules, and ``ddp_spawn`` pickles the model to start its processes.)
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

from lightning_ortho.nn._checks import LOW_PRECISION, check_finite
from lightning_ortho.nn.symmetric_eigenbasis import SymmetricEigenbasis

SpectralMethod = Literal["auto", "eigh", "upper_bound"]

LAYER = "AuxiliaryReflection"

#: Largest ``d`` for which ``sigma_max(V V^T)`` is computed exactly (``eigh``) under ``spectral_method="auto"``;
#: above it, a certified upper bound.
EXACT_SPECTRAL_MAX_DIM = 512


def check_spectral_options(spectral_method: str, spectral_margin: float, layer: str) -> None:
    """Raise ``ValueError`` for an unknown ``spectral_method`` or a negative ``spectral_margin``."""
    if spectral_method == "power":
        raise ValueError(
            f"{layer}: spectral_method='power' was removed: power iteration underestimates sigma_max(V V^T) until it "
            "converges, and an underestimate breaks Theorem 2 (the layer was not invertible). Use 'eigh' (exact) "
            "or 'upper_bound' (min(||V V^T||_F, max row sum), O(d^2), provably invertible but a narrower spectrum)."
        )
    if spectral_method not in get_args(SpectralMethod):
        choices = ", ".join(repr(m) for m in get_args(SpectralMethod))
        raise ValueError(f"{layer}: spectral_method must be one of {choices}, got {spectral_method!r}.")
    if not spectral_margin >= 0:
        raise ValueError(f"{layer}: spectral_margin must be >= 0, got {spectral_margin!r}.")


class InvertibleAuxiliaryWeight(nn.Module):
    """``W = I + V V^T / (2 (1 + margin) sigma_max(V V^T))`` (Theorem 2) from a free ``(d, d)`` parameter ``V``.

    Args:
        d: size of the square ``V`` and ``W``.
        spectral_method: what ``W`` divides by; Theorem 2 holds at every call as long as it is at least
            ``sigma_max(V V^T)``: ``"eigh"``, the exact top eigenvalue (one ``eigvalsh``, O(d^3));
            ``"upper_bound"``, ``min(||V V^T||_F, max_i sum_j |(V V^T)_ij|)``, a certified upper bound in O(d^2)
            after the Gram matrix (exact for rank one; larger otherwise, which narrows ``W``'s spectrum towards
            ``I`` but never breaks invertibility); ``"auto"``, exact for ``d <= 512``, the bound above.
            (Power iteration, as in spectral normalisation, underestimates until it converges, so it is not offered.)
        spectral_margin: the relative safety factor ``m`` on ``sigma_max``.

    ``V`` (``factor``) starts ``U(-1/sqrt(d), 1/sqrt(d))`` (Appendix B.3). ``sigma_max`` keeps its gradient
    (through the top eigenvalue, or the bound). ``V = 0`` gives ``W = I`` (never a division by zero). The
    module has no state besides ``V``: computing ``W`` never changes anything.

    Raises:
        ValueError: unknown ``spectral_method`` or negative ``spectral_margin``.
    """

    def __init__(self, d: int, spectral_method: SpectralMethod = "auto", spectral_margin: float = 1e-3) -> None:
        super().__init__()
        check_spectral_options(spectral_method, spectral_margin, "InvertibleAuxiliaryWeight")
        self.d = d
        self.spectral_margin = float(spectral_margin)
        if spectral_method == "auto":
            spectral_method = "eigh" if d <= EXACT_SPECTRAL_MAX_DIM else "upper_bound"
        self.spectral_method = spectral_method
        bound = 1.0 / math.sqrt(d)
        self.factor = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))

    def _scale(self, sigma: torch.Tensor) -> torch.Tensor:
        return 2.0 * (1.0 + self.spectral_margin) * torch.clamp(sigma, min=torch.finfo(sigma.dtype).tiny)

    def sigma_max(self, gram: torch.Tensor) -> torch.Tensor:
        """``sigma_max(V V^T)`` (its largest eigenvalue, as it is positive semi-definite) or, for
        ``"upper_bound"``, a certified upper bound of it; with gradient."""
        if self.spectral_method == "eigh":
            return torch.linalg.eigvalsh(gram)[-1]
        frobenius = torch.linalg.matrix_norm(gram)  # sqrt(sum lambda_i^2) >= lambda_max
        gershgorin = gram.abs().sum(-1).max()  # every eigenvalue lies in a Gershgorin disc
        return torch.minimum(frobenius, gershgorin)

    def _gram(self) -> torch.Tensor:
        # A NaN V would reach the eigensolver, which fails with a LAPACK message that names nothing.
        check_finite(self.factor, name="the Theorem-2 factor V (constraint.factor)", layer=LAYER)
        factor = self.factor.float() if self.factor.dtype in LOW_PRECISION else self.factor  # eigh has no half
        return factor @ factor.mT

    def forward(self) -> torch.Tensor:
        """``(d, d)``: ``W`` (float32 when ``V`` is float16/bfloat16).

        Raises:
            ValueError: ``V`` holds NaN/inf.
        """
        gram = self._gram()
        eye = torch.eye(self.d, dtype=gram.dtype, device=gram.device)
        return eye + gram / self._scale(self.sigma_max(gram))

    def weight_and_eigenbasis(self) -> tuple[torch.Tensor, SymmetricEigenbasis]:
        """``W`` and its eigendecomposition from one ``eigh`` of ``V V^T``: same eigenvectors, eigenvalues
        ``1 + mu / (2 (1 + m) sigma_max)``; with ``spectral_method="eigh"`` the same ``eigh`` gives ``sigma_max``."""
        gram = self._gram()
        mu, vectors = torch.linalg.eigh(gram.detach())
        if self.spectral_method == "eigh":
            top = vectors[:, -1]
            sigma = top @ gram @ top  # the top eigenvalue, with its gradient (vector held fixed)
        else:
            sigma = self.sigma_max(gram)
        scale = self._scale(sigma)
        eye = torch.eye(self.d, dtype=gram.dtype, device=gram.device)
        return eye + gram / scale, SymmetricEigenbasis(1.0 + mu / scale.detach(), vectors)

    def extra_repr(self) -> str:
        return f"d={self.d}, spectral_method={self.spectral_method!r}, spectral_margin={self.spectral_margin}"


@torch.no_grad()
def theorem2_margin(weight: torch.Tensor) -> float:
    """``3/2 lambda_min(W) - lambda_max(W)`` of a symmetric ``(d, d)`` ``W`` from an exact eigensolver.

    Positive means ``f(x) = H(W x) x`` is provably invertible on ``R^d`` (Theorem 2).

    Raises:
        ValueError: ``W`` holds NaN/inf, or is not symmetric (Theorem 2 does not apply).
    """
    weight = weight.detach()
    check_finite(weight, name="W", layer=f"{LAYER}.invertibility_margin")
    if not torch.allclose(weight, weight.mT, rtol=1e-5, atol=1e-6):
        raise ValueError(
            f"{LAYER}.invertibility_margin: Theorem 2 needs a symmetric W; this W is not. "
            "Use AuxiliaryReflection(d, invertible=True) for a provably invertible layer."
        )
    eigenvalues = torch.linalg.eigvalsh(0.5 * (weight + weight.mT))
    return float(1.5 * eigenvalues[0] - eigenvalues[-1])


def rename_legacy_theorem2_keys(state_dict: dict, prefix: str, *args) -> None:
    """Load-state-dict pre-hook: version 0.1 stored a Theorem-2 layer's ``V`` as ``factor`` (now in its
    ``constraint`` module) and a power-iteration vector, which no longer exists. Old checkpoints keep loading."""
    if prefix + "factor" in state_dict and prefix + "constraint.factor" not in state_dict:
        state_dict[prefix + "constraint.factor"] = state_dict.pop(prefix + "factor")
    for stale in ("power_vector", "constraint.power_vector"):
        state_dict.pop(prefix + stale, None)
