"""UORO's fixed rescaling ``Q_t = alpha_t Q0`` (the ``Q_t`` recursion of Cooijmans & Martens 2019): checks of
``alpha`` and ``Q0`` and the schedule ``alpha_t``. The rescaling is unbiased because ``Q_t`` does not depend on the
noise."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: ``alpha``: a constant, a sequence indexed by step (``alpha[t - 1]`` at step ``t``) or a function of ``t``.
Alpha = float | Sequence[float] | torch.Tensor | Callable[[int], float]
#: The fixed rescaling ``Q_t = alpha_t Q0`` (``Q0`` ``None`` is the identity).
FixedRescaling = tuple[Alpha, torch.Tensor | None]


def check_alpha(alpha: Alpha) -> None:
    """Raise ``ValueError`` unless ``alpha`` is a function, or a positive finite number or 1-d sequence."""
    if callable(alpha):
        return
    values = torch.as_tensor(alpha, dtype=torch.float64)
    if values.dim() > 1 or not torch.isfinite(values).all() or (values <= 0).any():
        raise ValueError(
            f"UORO: alpha must be positive and finite (a number, a 1-d sequence or a function), got {alpha!r}."
        )


def prepare_q0(q0: torch.Tensor | None, projection: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(Q0, Q0^{-T})`` (detached; ``(None, None)`` for the identity).

    Raises:
        ValueError: ``Q0`` given for ``projection="none"`` (no spatial noise), not a square floating-point
            matrix, holding NaN/inf, or singular.
    """
    if q0 is None:
        return None, None
    if projection == "none":
        raise ValueError("UORO: projection='none' has no spatial noise, so Q0 must be None (alpha still applies).")
    if not isinstance(q0, torch.Tensor) or q0.dim() != 2 or q0.shape[0] != q0.shape[1]:
        raise ValueError(f"UORO: Q0 must be a square (Z, Z) matrix at the cut vertex, got {getattr(q0, 'shape', q0)}.")
    if not q0.is_floating_point() or not torch.isfinite(q0).all():
        raise ValueError(
            f"UORO: Q0 must be a finite floating-point matrix, got {q0.dtype} with"
            f" {int((~torch.isfinite(q0)).sum()) if q0.is_floating_point() else 'no'} NaN/inf entries; compute it"
            " from finite statistics (lightning_ortho.online.optimal_q0) or pass None for the identity."
        )
    q0 = q0.detach()
    if torch.linalg.matrix_rank(q0.double()) < q0.shape[0]:
        raise ValueError("UORO: Q0 is singular; the rescaling Q_t = alpha_t Q0 must be invertible.")
    return q0, torch.linalg.inv(q0.double()).T.to(q0.dtype)


# The values of the last sequence ``alpha`` read, as Python floats: a tensor index per step costs more than the rest
# of a fused step. Keyed by the object itself (kept alive here, so its id cannot be reused).
_read: tuple = (None, None)


def alpha_at(alpha: Alpha, step: int) -> float:
    """``alpha_t`` at step ``t`` (1-based).

    Raises:
        ValueError: a sequence shorter than ``t``, or a function that returns a value that is not positive.
    """
    global _read
    if callable(alpha):
        value = float(alpha(step))
    else:
        read = _read  # one tuple: read and replaced whole
        if read[0] is not alpha:
            read = _read = (alpha, torch.as_tensor(alpha, dtype=torch.float64).tolist())
        values = read[1]
        if isinstance(values, float):
            value = values
        elif step > len(values):
            raise ValueError(f"UORO: alpha has {len(values)} steps, step {step} asked for one more.")
        else:
            value = values[step - 1]
    if not value > 0:
        raise ValueError(f"UORO: alpha_t must be positive, got {value} at step {step}.")
    return value
