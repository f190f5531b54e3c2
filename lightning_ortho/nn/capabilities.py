"""The capabilities code outside a layer looks for (the monitors of :mod:`lightning_ortho.callbacks`, the Glow
callbacks), as ``typing.Protocol`` classes checkable with ``isinstance``.

A module has a capability when it has the method (``isinstance`` checks the name only, as Python's
``@runtime_checkable`` protocols do): a user's layer needs no base class to be measured. Our layers that have one are
listed in the tests (``tests/nn/test_capabilities.py``), so renaming a method fails a test instead of silently
dropping those layers from the monitors. Nothing here imports Lightning.

Shapes: ``x`` and ``y`` are a layer's batch, ``(..., d)`` for a map of vectors, ``(N, C, H, W)`` for a 1x1
convolution.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "HasDenseJacobian",
    "HasInverse",
    "HasInverseWithResult",
    "HasInvertibilityMargin",
    "HasJacobianSigns",
    "HasLogAbsDetJacobian",
    "HasMatrix",
    "HasNewtonInverse",
    "Reconstructs",
]


@runtime_checkable
class HasLogAbsDetJacobian(Protocol):
    """``log_abs_det_jacobian(x) -> (...)``: ``log|det J|`` of the map at each row of ``x`` (ours: Lemma 1 of
    :class:`~lightning_ortho.nn.AuxiliaryReflection`); ``torch.distributions`` / Pyro transforms take ``(x, y)``."""

    def log_abs_det_jacobian(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...


@runtime_checkable
class HasDenseJacobian(Protocol):
    """``jacobian(x) -> (..., d, d)``: the Jacobian of the map at each row of ``x`` ``(..., d)`` (Theorem 3 for an
    auxiliary reflection)."""

    def jacobian(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasJacobianSigns(Protocol):
    """``jacobian_signs(x) -> (N, H, W)``: ``sign det J_g`` at every pixel of ``x`` ``(N, C, H, W)`` (our 1x1
    convolutions)."""

    def jacobian_signs(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasInverse(Protocol):
    """``inverse(y) -> x`` with ``forward(x) == y`` (or ``forward(x)[0] == y`` for a flow layer)."""

    def inverse(self, y: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasNewtonInverse(Protocol):
    """``newton_inverse(y) -> NewtonResult``: the inverse by Newton's method with its per-row iterations, residuals
    and convergence flags (:class:`~lightning_ortho.nn.AuxiliaryReflection`)."""

    def newton_inverse(self, y: torch.Tensor, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class HasInverseWithResult(Protocol):
    """``inverse_with_result(y, raise_on_failure=...) -> (x, NewtonResult | None)``: the inverse and, where it is
    iterative, its Newton result (our 1x1 convolutions)."""

    def inverse_with_result(self, y: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]: ...


@runtime_checkable
class Reconstructs(Protocol):
    """``reconstruct(x) -> decode(encode(x))`` (a :class:`~lightning_ortho.flows.Glow`)."""

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasInvertibilityMargin(Protocol):
    """``invertibility_margin() -> float``: Theorem 2's ``3/2 lambda_min(W) - lambda_max(W)``, positive for a
    provably invertible layer (raises ``ValueError`` where the theorem does not apply)."""

    def invertibility_margin(self) -> float: ...


@runtime_checkable
class HasMatrix(Protocol):
    """``matrix() -> (d, d)``: the dense matrix of a linear map (an orthogonal map's ``Q``)."""

    def matrix(self) -> torch.Tensor: ...
