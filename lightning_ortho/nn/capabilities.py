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

    def log_abs_det_jacobian(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``log|det J|`` of the map at each sample of a batch ``x``: ``(N, ...) -> (N,)``.

        :class:`~lightning_ortho.callbacks.JacobianDeterminantMonitor` calls it as ``log_abs_det_jacobian(x)``, or
        as ``log_abs_det_jacobian(x, y)`` with ``y`` the first output of ``forward(x)`` when the method has two
        positional parameters without defaults (the ``torch.distributions`` / Pyro convention). A result of more
        than one dimension is summed over everything but the first (a ``(N, T)`` result gives ``(N,)``); a scalar
        counts for every sample.

        Args:
            *args: ``x`` (``(..., d)`` for a map of vectors), or ``(x, y)``.
            **kwargs: options of the implementation (the monitor passes none).

        Returns:
            ``(N,)`` (or any ``(N, ...)``, summed per sample): ``log|det J(x_i)|``.
        """


@runtime_checkable
class HasDenseJacobian(Protocol, metaclass=_CapabilityMeta):
    """``jacobian(x) -> (..., d, d)``: the Jacobian of the map at each row of ``x`` ``(..., d)`` (Theorem 3 for an
    auxiliary reflection)."""

    def jacobian(self, x: torch.Tensor) -> torch.Tensor:
        """The dense Jacobian of the map at each row: ``(..., d) -> (..., d, d)``, ``J[..., i, j] = d f_i / d x_j``.

        :class:`~lightning_ortho.callbacks.JacobianDeterminantMonitor` takes the sign of ``det J`` from it (for ``d``
        up to its ``max_autograd_dim``) and, for ``d <= 128``, ``log|det J|`` too, by ``slogdet``, instead of
        calling ``log_abs_det_jacobian``; a result of another shape than ``(*x.shape, d)`` is ignored.

        Args:
            x: ``(..., d)`` inputs.

        Returns:
            ``(..., d, d)``: one Jacobian per row of ``x``.
        """


@runtime_checkable
class HasJacobianSigns(Protocol, metaclass=_CapabilityMeta):
    """``jacobian_signs(x) -> (N, H, W)``: ``sign det J_g`` at every pixel of ``x`` ``(N, C, H, W)`` (our 1x1
    convolutions)."""

    def jacobian_signs(self, x: torch.Tensor) -> torch.Tensor:
        """``sign det J_g`` (-1, 0 or 1) of the per-pixel map ``g`` at every pixel: ``(N, C, H, W) -> (N, H, W)``.

        :class:`~lightning_ortho.callbacks.JacobianDeterminantMonitor` logs the fraction of pixels whose sign is
        ``<= 0`` and takes the product over each sample's pixels as the sign of the whole layer's ``det J``.

        Args:
            x: ``(N, C, H, W)`` images.

        Returns:
            ``(N, H, W)`` (any ``(N, ...)`` works: the monitor flattens all but the first dimension).
        """


@runtime_checkable
class HasInverse(Protocol, metaclass=_CapabilityMeta):
    """``inverse(y) -> x`` with ``forward(x) == y`` (or ``forward(x)[0] == y`` for a flow layer)."""

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``x`` with ``forward(x) == y`` (``forward(x)[0] == y`` for a flow layer), of ``x``'s shape.

        :class:`~lightning_ortho.callbacks.InvertibilityMonitor` calls ``inverse(f(x))`` on its probe in eval mode
        without gradients and logs the round-trip error; an exception counts as lost invertibility (a
        :class:`~lightning_ortho.nn.NewtonInverseError` also counts its failed solves), never as a crash.

        Args:
            y: an output of ``forward``.

        Returns:
            The preimage, of the shape of the input that gave ``y``.
        """


@runtime_checkable
class HasNewtonInverse(Protocol, metaclass=_CapabilityMeta):
    """``newton_inverse(y) -> NewtonResult``: the inverse by Newton's method with its per-row iterations, residuals
    and convergence flags (:class:`~lightning_ortho.nn.AuxiliaryReflection`)."""

    def newton_inverse(self, y: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """The inverse of ``y`` by Newton's method, with a per-row report, without raising on non-convergence.

        :class:`~lightning_ortho.callbacks.InvertibilityMonitor` prefers it to :meth:`HasInverse.inverse`, calls it
        as ``newton_inverse(y)`` and reads ``x``, ``converged`` and ``iterations`` of the result
        (``newton_failures`` is the number of rows with ``converged == False``).

        Args:
            y: ``(..., d)`` outputs of ``forward``.
            *args: options of the implementation (the monitor passes none).
            **kwargs: options of the implementation, e.g. ``tol`` and ``max_iter``.

        Returns:
            The per-row report, a :class:`~lightning_ortho.nn.NewtonResult` (``x`` ``(..., d)``; ``iterations``,
                ``residual`` and the bool ``converged`` ``(...)``).
        """


@runtime_checkable
class HasInverseWithResult(Protocol, metaclass=_CapabilityMeta):
    """``inverse_with_result(y, raise_on_failure=...) -> (x, NewtonResult | None)``: the inverse and, where it is
    iterative, its Newton result (our 1x1 convolutions)."""

    def inverse_with_result(self, y: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """``(x, result)``: the inverse of ``y`` and, where it is iterative, the per-sample Newton result.

        :class:`~lightning_ortho.callbacks.InvertibilityMonitor` calls it as
        ``inverse_with_result(y, raise_on_failure=False)``, so it must accept that keyword and then flag
        non-converged samples in ``result.converged`` instead of raising.

        Args:
            y: an output of ``forward`` (``(N, C, H, W)`` for our 1x1 convolutions).
            *args: options of the implementation (the monitor passes none).
            **kwargs: ``raise_on_failure`` and the implementation's options (``tol``, ``max_iter``).

        Returns:
            ``x`` of the input's shape, and a :class:`~lightning_ortho.nn.NewtonResult` (``converged`` and
                ``iterations`` per pixel, ``(N, H W)`` for a 1x1 convolution) or ``None`` for an exact inverse.
        """


@runtime_checkable
class Reconstructs(Protocol, metaclass=_CapabilityMeta):
    """``reconstruct(x) -> decode(encode(x))`` (a :class:`~lightning_ortho.flows.Glow`)."""

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        """``decode(encode(x))``: ``x`` mapped to its latent code and back, of ``x``'s shape.

        A module with ``reconstruct`` and no ``inverse`` (a :class:`~lightning_ortho.flows.Glow`) is checked by
        :class:`~lightning_ortho.callbacks.InvertibilityMonitor` through it: the round-trip error is
        ``||reconstruct(x) - x|| / ||x||`` per sample (the monitor calls it in eval mode without gradients), so it
        must return the reconstruction itself, with as many entries per sample as ``x``, not a loss or a tuple.

        Args:
            x: a batch of inputs, ``(N, ...)``.

        Returns:
            The reconstruction, of ``x``'s shape.
        """


@runtime_checkable
class HasInvertibilityMargin(Protocol, metaclass=_CapabilityMeta):
    """``invertibility_margin() -> float``: Theorem 2's ``3/2 lambda_min(W) - lambda_max(W)``, positive for a
    provably invertible layer (raises ``ValueError`` where the theorem does not apply)."""

    def invertibility_margin(self) -> float:
        """Theorem 2's margin ``3/2 lambda_min(W) - lambda_max(W)`` of the layer's auxiliary weight ``W``.

        Positive means provably invertible on all of ``R^d``. :class:`~lightning_ortho.callbacks.InvertibilityMonitor`
        logs the smallest margin of the layers whose invertibility is a constraint (a layer with
        ``invertible = False`` is left out) as ``theorem2_margin``.

        Returns:
            The margin, a Python ``float``.

        Raises:
            ValueError: Theorem 2 does not apply to this layer (a non-symmetric ``W``, a custom network); the
                monitor then skips the layer.
        """


@runtime_checkable
class HasMatrix(Protocol, metaclass=_CapabilityMeta):
    """``matrix() -> (d, d)``: the dense matrix of a linear map (an orthogonal map's ``Q``)."""

    def matrix(self) -> torch.Tensor:
        """The dense ``(d, d)`` matrix ``Q`` of the linear map (``forward(x) = x Q^T`` for a map of rows ``x``).

        :class:`~lightning_ortho.callbacks.OrthogonalityMonitor` measures ``||Q^T Q - I||`` of the
        :class:`~lightning_ortho.nn.OrthogonalMap` subclasses that have it.

        Returns:
            ``(d, d)``.
        """
