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

SpectralMethod = Literal["auto", "eigh", "power"]

LAYER = "AuxiliaryReflection"

#: Largest ``d`` for which ``sigma_max(V V^T)`` is computed exactly (``eigh``) under ``spectral_method="auto"``.
EXACT_SPECTRAL_MAX_DIM = 512


def check_spectral_options(spectral_method: str, spectral_margin: float, layer: str) -> None:
    """Raise ``ValueError`` for an unknown ``spectral_method`` or a negative ``spectral_margin``."""
    if spectral_method not in get_args(SpectralMethod):
        choices = ", ".join(repr(m) for m in get_args(SpectralMethod))
        raise ValueError(f"{layer}: spectral_method must be one of {choices}, got {spectral_method!r}.")
    if not spectral_margin >= 0:
        raise ValueError(f"{layer}: spectral_margin must be >= 0, got {spectral_margin!r}.")


class InvertibleAuxiliaryWeight(nn.Module):
    """``W = I + V V^T / (2 (1 + margin) sigma_max(V V^T))`` (Theorem 2) from a free ``(d, d)`` parameter ``V``.

    Args:
        d: size of the square ``V`` and ``W``.
        spectral_method: how ``sigma_max(V V^T)`` is found: ``"eigh"`` (exact), ``"power"`` (power iteration with
            a persistent vector, one step per training forward, as in spectral normalisation) or ``"auto"``
            (exact for ``d <= 512``). Power iteration can underestimate ``sigma_max``; :func:`theorem2_margin`
            always reports the exact margin.
        spectral_margin: the relative safety factor ``m`` on ``sigma_max``.

    ``V`` (``factor``) starts ``U(-1/sqrt(d), 1/sqrt(d))`` (Appendix B.3). ``sigma_max`` keeps its gradient
    through the Rayleigh quotient of the top eigenvector (the gradient of the top eigenvalue). ``V = 0`` gives
    ``W = I`` (never a division by zero).

    Raises:
        ValueError: unknown ``spectral_method`` or negative ``spectral_margin``.
    """

    def __init__(self, d: int, spectral_method: SpectralMethod = "auto", spectral_margin: float = 1e-3) -> None:
        super().__init__()
        check_spectral_options(spectral_method, spectral_margin, "InvertibleAuxiliaryWeight")
        self.d = d
        self.spectral_margin = float(spectral_margin)
        if spectral_method == "auto":
            spectral_method = "eigh" if d <= EXACT_SPECTRAL_MAX_DIM else "power"
        self.spectral_method = spectral_method
        bound = 1.0 / math.sqrt(d)
        self.factor = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))
        self.register_buffer("power_vector", nn.functional.normalize(torch.randn(d), dim=0))

    def _scale(self, sigma: torch.Tensor) -> torch.Tensor:
        return 2.0 * (1.0 + self.spectral_margin) * torch.clamp(sigma, min=torch.finfo(sigma.dtype).tiny)

    def sigma_max(self, gram: torch.Tensor) -> torch.Tensor:
        """``sigma_max(V V^T)`` (its largest eigenvalue, as it is positive semi-definite), with gradient."""
        if self.spectral_method == "eigh":
            return torch.linalg.eigvalsh(gram)[-1]
        with torch.no_grad():
            vector = self.power_vector.to(gram.dtype)
            if self.training:
                vector = nn.functional.normalize(gram @ vector, dim=0)
                self.power_vector.copy_(vector)
        return vector @ gram @ vector  # gradient through the Rayleigh quotient, vector held fixed

    def _gram(self) -> torch.Tensor:
        # A NaN V would reach the eigensolver, which fails with a LAPACK message that names nothing.
        check_finite(self.factor, name="the Theorem-2 factor V (constraint.factor)", layer=LAYER)
        factor = self.factor.float() if self.factor.dtype in LOW_PRECISION else self.factor  # eigh has no half
        return factor @ factor.mT

    def forward(self) -> torch.Tensor:
        """``(d, d)``: ``W`` (float32 when ``V`` is float16/bfloat16). Raises ``ValueError`` if ``V`` holds NaN/inf."""
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
            sigma = top @ gram @ top
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
    """Load-state-dict pre-hook: version 0.1 stored a Theorem-2 layer's ``V`` and power vector as ``factor`` and
    ``power_vector``; they now live in its ``constraint`` module. Old checkpoints keep loading."""
    renames = {"factor": "constraint.factor", "power_vector": "constraint.power_vector"}
    for old, new in renames.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
