"""Input validation shared by the layers of :mod:`lightning_ortho.nn`.

Shape and dtype checks are free and always on. The finiteness check needs one reduction and, on a GPU,
a device-to-host synchronisation; :func:`finite_checks` turns it off for code that has been debugged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor

_FINITE_CHECKS = True

#: Dtypes whose reflection math is promoted to float32 (see the design notes on mixed precision).
LOW_PRECISION = (torch.float16, torch.bfloat16)


@contextlib.contextmanager
def finite_checks(enabled: bool) -> Iterator[None]:
    """Turn the NaN/inf checks of every layer in :mod:`lightning_ortho.nn` on or off inside a ``with`` block.

    The checks cost one reduction per call and, on a GPU, a synchronisation. Shape and dtype checks stay on.

    Args:
        enabled: whether the layers check their inputs and parameters for NaN/inf inside the block.
    """
    global _FINITE_CHECKS
    previous, _FINITE_CHECKS = _FINITE_CHECKS, bool(enabled)
    try:
        yield
    finally:
        _FINITE_CHECKS = previous


def has_values(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds values the host can read: False for meta and fake tensors, which carry only shapes
    and dtypes (deferred initialisation, FSDP's shape inference, ``FakeTensorMode``)."""
    return not (tensor.is_meta or isinstance(tensor, FakeTensor))


def finite_checks_enabled(tensor: torch.Tensor | None = None) -> bool:
    """Whether layers currently check their inputs for NaN and inf.

    Skipped while compiling, for tensors inside ``torch.func`` transforms (``vmap`` forbids the data-dependent
    branch a check needs) and for meta or fake tensors (they have no values; shapes still propagate); the eager
    call that surrounds such code is still checked.
    """
    if not _FINITE_CHECKS or torch.compiler.is_compiling():
        return False
    return tensor is None or (not torch._C._functorch.is_functorch_wrapped_tensor(tensor) and has_values(tensor))


@contextlib.contextmanager
def full_precision(x: torch.Tensor) -> Iterator[None]:
    """Inside the block autocast is off for ``x``'s device: reflection math runs in float32/float64 even inside an
    autocast region (the design's rule for mixed precision; inputs are promoted by :func:`compute_dtype`)."""
    if x.device.type != "meta" and torch.is_autocast_enabled(x.device.type):  # meta has no autocast to ask
        with torch.autocast(device_type=x.device.type, enabled=False):
            yield
    else:
        yield


def check_positive_int(value: object, name: str, layer: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` (not a bool) of at least 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}.")


def check_features(x: torch.Tensor, features: int, *, name: str, layer: str) -> None:
    """Raise a clear error unless ``x`` is a floating-point tensor of shape ``(..., features)``.

    Raises:
        TypeError: ``x`` is not a tensor, or not floating point (integer images must be converted first).
        ValueError: the trailing dimension is not ``features``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{layer}: {name} must be a torch.Tensor, got {type(x).__name__}.")
    if not x.is_floating_point():
        raise TypeError(
            f"{layer}: {name} must be a floating-point tensor, got dtype {x.dtype}. "
            f"Convert it first, e.g. {name}.float() (integer pixels usually also need scaling to [0, 1])."
        )
    if x.dim() == 0 or x.shape[-1] != features:
        raise ValueError(
            f"{layer}: {name} must have shape (..., {features}) with features last (batch-first, like "
            f"torch.nn.Linear); got shape {tuple(x.shape)}."
        )


def check_finite(x: torch.Tensor, *, name: str, layer: str) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or inf (unless disabled by :func:`finite_checks`)."""
    if finite_checks_enabled(x) and not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"{layer}: {name} contains NaN or infinite values. Check the data and the layers before this one "
            f"(a diverged optimizer step is a common cause; try a lower learning rate or gradient clipping)."
        )


def check_module_finite(module: torch.nn.Module, *, layer: str) -> None:
    """Raise ``ValueError`` naming the first parameter of ``module`` that holds NaN/inf (before solvers whose
    own failure would name nothing)."""
    for name, parameter in module.named_parameters():
        check_finite(parameter, name=name, layer=layer)


def check_parameters_finite(
    summary: torch.Tensor, tensors: Callable[[], dict[str, torch.Tensor]], *, layer: str
) -> None:
    """Cheap finiteness check after the fact: ``summary`` is a small reduction of the output.

    Only when ``summary`` is not finite is ``tensors()`` called and each input and parameter scanned, to
    name the culprit.
    """
    if not finite_checks_enabled(summary) or bool(torch.isfinite(summary).all()):
        return
    for name, tensor in tensors().items():
        check_finite(tensor, name=name, layer=layer)
    raise ValueError(f"{layer}: the computation produced NaN or inf from finite inputs (overflow?).")


def compute_dtype(x: torch.Tensor, parameter_dtype: torch.dtype | None, *, layer: str) -> torch.dtype:
    """The dtype reflection math runs in: float32 for half inputs, else the input's own dtype.

    Raises:
        TypeError: the input and the layer's parameters have different full-precision dtypes.
    """
    if x.dtype in LOW_PRECISION:
        return parameter_dtype if parameter_dtype not in (None, *LOW_PRECISION) else torch.float32
    if parameter_dtype is not None and parameter_dtype not in LOW_PRECISION and parameter_dtype != x.dtype:
        raise TypeError(
            f"{layer}: input dtype {x.dtype} does not match parameter dtype {parameter_dtype}. "
            f"Call layer.to({x.dtype}) or convert the input to {parameter_dtype}."
        )
    return x.dtype


def prepare_input(
    x: torch.Tensor, features: int, module: torch.nn.Module, *, name: str, layer: str, columns: bool = False
) -> torch.Tensor:
    """Check ``x`` (``(..., features)``, or ``(..., features, L)`` with ``columns=True``) and convert it to the
    dtype ``module`` computes in (:func:`compute_dtype` against its first parameter).

    Raises:
        TypeError, ValueError: as :func:`check_features` and :func:`compute_dtype`.
    """
    if columns:
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-2] != features:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{layer}: columns input {name} must have shape (..., {features}, L), got {shape}.")
        return prepare_input(x.mT, features, module, name=name, layer=layer).mT
    check_features(x, features, name=name, layer=layer)
    parameter = next(module.parameters(), None)
    return x.to(compute_dtype(x, None if parameter is None else parameter.dtype, layer=layer))


def check_orthogonal(matrix: torch.Tensor, d: int, where: str) -> None:
    """Raise ``ValueError`` unless ``matrix`` is a floating-point ``(d, d)`` orthogonal matrix.

    The tolerance on ``max |U^T U - I|`` (row sums) is ``max(1e-4, 100 d eps)``, loose enough for float32
    matrices produced by QR, tight enough to catch a matrix that was never orthogonalised.
    """
    if not isinstance(matrix, torch.Tensor) or matrix.shape != (d, d):
        shape = tuple(matrix.shape) if isinstance(matrix, torch.Tensor) else type(matrix).__name__
        raise ValueError(f"{where}: expected a ({d}, {d}) orthogonal matrix, got {shape}.")
    if not matrix.is_floating_point():
        raise ValueError(f"{where}: the orthogonal matrix must be floating point, got {matrix.dtype}.")
    if not has_values(matrix):  # a meta (deferred) matrix: shape and dtype checked, it has no values to test
        return
    eye = torch.eye(d, dtype=matrix.dtype, device=matrix.device)
    error = float(torch.linalg.matrix_norm(matrix.mT @ matrix - eye, ord=torch.inf))
    tolerance = max(1e-4, 100 * d * torch.finfo(matrix.dtype).eps)
    if not error <= tolerance:
        raise ValueError(
            f"{where}: the matrix is not orthogonal (max row sum of |U^T U - I| = {error:.2e} > {tolerance:.1e}). "
            f"Orthogonalise it first, e.g. torch.linalg.qr(U).Q."
        )


def refuse_double_backward() -> None:
    """Call first in a hand-written ``backward``: raise if a graph of the gradient is being built.

    Raises:
        RuntimeError: ``create_graph=True`` (a second derivative was asked of a closed-form first derivative that
            does not record its own graph); the message says which route supports it.
    """
    if torch.is_grad_enabled():
        raise RuntimeError(
            "The eigenbasis routes of the auxiliary reflection (forward_and_log_abs_det, log_abs_det_jacobian with "
            "method='eig' or 'auto') have hand-written first derivatives and no second derivatives. For "
            "create_graph=True, use log_abs_det_jacobian(x, method='dense') and forward(x), which autograd "
            "differentiates twice."
        )
