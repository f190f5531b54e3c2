"""The capabilities code outside a layer looks for (the monitors of :mod:`lightning_ortho.callbacks`, the Glow
callbacks), as ``typing.Protocol`` classes checkable with ``isinstance``.

A module has a capability when its class defines the method (anywhere in its MRO, as a callable that is not an
``nn.Module``): a user's layer needs no base class to be measured. Unlike a plain ``@runtime_checkable`` protocol
(``hasattr``), an instance attribute or a submodule of that name is not a capability: ``nn.Module`` answers
``hasattr`` for its submodules, so an autoencoder with a decoder submodule named ``inverse`` is not invertible.

Two declarations (class attributes or properties that are ``True``) tell the monitors that a statistic is constant by
construction, so it is not logged (and is said once in the end-of-fit notes instead): ``jacobian_sign_is_fixed``
(the sign of ``det J`` is the same for every input and every value of the parameters; read by
:func:`jacobian_sign_is_fixed`) and ``log_abs_det_is_zero`` (``log|det J| = 0`` always: an orthogonal or
volume-preserving map; :func:`log_abs_det_is_zero`). Our layers that have one are
listed in the tests (``tests/nn/test_capabilities.py``), so renaming a method fails a test instead of silently
dropping those layers from the monitors. Nothing here imports Lightning.

Shapes: ``x`` and ``y`` are a layer's batch, ``(..., d)`` for a map of vectors, ``(N, C, H, W)`` for a 1x1
convolution.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

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
    "jacobian_sign_is_fixed",
    "log_abs_det_is_zero",
]


def defines_method(cls: type, name: str) -> bool:
    """Whether the class ``cls`` defines (or inherits) ``name`` as a method: a callable class attribute (a function,
    a static or class method, a callable object) that is not an ``nn.Module``. Instance attributes and submodules
    do not count."""
    try:
        value = inspect.getattr_static(cls, name)
    except AttributeError:
        return False
    if isinstance(value, (staticmethod, classmethod)):
        return True
    return callable(value) and not isinstance(value, (nn.Module, type))


class _CapabilityMeta(type(Protocol)):
    """``isinstance(x, P)`` / ``issubclass(C, P)`` for a capability ``P``: the class defines every method of ``P``
    (:func:`defines_method`), whatever its instance holds."""

    def __instancecheck__(cls, instance: object) -> bool:
        return cls.__subclasscheck__(type(instance))

    def __subclasscheck__(cls, other: type) -> bool:
        methods = [n for n, v in vars(cls).items() if not n.startswith("_") and inspect.isfunction(v)]
        return isinstance(other, type) and all(defines_method(other, name) for name in methods)


def jacobian_sign_is_fixed(module: object) -> bool:
    """Whether ``module`` declares ``jacobian_sign_is_fixed = True``: the sign of its ``det J`` cannot change (our
    LU and Householder 1x1 convolutions, a Theorem-2 ``AuxiliaryReflection(invertible=True)``), so a fraction of
    negative determinants is constant by construction."""
    return getattr(module, "jacobian_sign_is_fixed", False) is True


def log_abs_det_is_zero(module: object) -> bool:
    """Whether ``module`` declares ``log_abs_det_is_zero = True``: ``log|det J| = 0`` for every input (an orthogonal
    1x1 convolution, a squeeze)."""
    return getattr(module, "log_abs_det_is_zero", False) is True


@runtime_checkable
class HasLogAbsDetJacobian(Protocol, metaclass=_CapabilityMeta):
    """``log_abs_det_jacobian(x) -> (...)``: ``log|det J|`` of the map at each row of ``x`` (ours: Lemma 1 of
    :class:`~lightning_ortho.nn.AuxiliaryReflection`); ``torch.distributions`` / Pyro transforms take ``(x, y)``."""

    def log_abs_det_jacobian(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...


@runtime_checkable
class HasDenseJacobian(Protocol, metaclass=_CapabilityMeta):
    """``jacobian(x) -> (..., d, d)``: the Jacobian of the map at each row of ``x`` ``(..., d)`` (Theorem 3 for an
    auxiliary reflection)."""

    def jacobian(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasJacobianSigns(Protocol, metaclass=_CapabilityMeta):
    """``jacobian_signs(x) -> (N, H, W)``: ``sign det J_g`` at every pixel of ``x`` ``(N, C, H, W)`` (our 1x1
    convolutions)."""

    def jacobian_signs(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasInverse(Protocol, metaclass=_CapabilityMeta):
    """``inverse(y) -> x`` with ``forward(x) == y`` (or ``forward(x)[0] == y`` for a flow layer)."""

    def inverse(self, y: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasNewtonInverse(Protocol, metaclass=_CapabilityMeta):
    """``newton_inverse(y) -> NewtonResult``: the inverse by Newton's method with its per-row iterations, residuals
    and convergence flags (:class:`~lightning_ortho.nn.AuxiliaryReflection`)."""

    def newton_inverse(self, y: torch.Tensor, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class HasInverseWithResult(Protocol, metaclass=_CapabilityMeta):
    """``inverse_with_result(y, raise_on_failure=...) -> (x, NewtonResult | None)``: the inverse and, where it is
    iterative, its Newton result (our 1x1 convolutions)."""

    def inverse_with_result(self, y: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]: ...


@runtime_checkable
class Reconstructs(Protocol, metaclass=_CapabilityMeta):
    """``reconstruct(x) -> decode(encode(x))`` (a :class:`~lightning_ortho.flows.Glow`)."""

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasInvertibilityMargin(Protocol, metaclass=_CapabilityMeta):
    """``invertibility_margin() -> float``: Theorem 2's ``3/2 lambda_min(W) - lambda_max(W)``, positive for a
    provably invertible layer (raises ``ValueError`` where the theorem does not apply)."""

    def invertibility_margin(self) -> float: ...


@runtime_checkable
class HasMatrix(Protocol, metaclass=_CapabilityMeta):
    """``matrix() -> (d, d)``: the dense matrix of a linear map (an orthogonal map's ``Q``)."""

    def matrix(self) -> torch.Tensor: ...
