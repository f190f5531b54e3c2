"""Newton's method for inverting ``y = f(x)`` when ``f`` is positively homogeneous (``f(c x) = c f(x)``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: Default relative-residual tolerance of Newton inverses, per dtype.
DEFAULT_TOLERANCE = {torch.float64: 1e-11, torch.float32: 1e-5}


class NotInvertibleError(ValueError):
    """An inverse was asked of a layer that is not provably invertible, without accepting a non-unique answer."""


class NewtonInverseError(RuntimeError):
    """Newton's method did not reach the tolerance for some samples; carries the :class:`NewtonResult`."""

    def __init__(self, message: str, result: NewtonResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class NewtonResult:
    """Outcome of a batched Newton inverse.

    Attributes:
        x: ``(..., d)`` the inverse (rows with ``converged == False`` are the last iterate, not an inverse).
        iterations: ``(...)`` Newton steps each sample took.
        residual: ``(...)`` relative residual ``||f(x) - y|| / ||y||`` at the returned ``x``.
        converged: ``(...)`` bool, ``residual <= tolerance``: ``x`` is *a* preimage of ``y`` to that accuracy.
        tolerance: the tolerance used.
        provably_unique: whether the map is provably one-to-one (Theorem 2), so a converged ``x`` is *the*
            preimage. ``False`` for an unconstrained auxiliary reflection: another ``x'`` may map to the same ``y``.
    """

    x: torch.Tensor
    iterations: torch.Tensor
    residual: torch.Tensor
    converged: torch.Tensor
    tolerance: float
    provably_unique: bool = True

    @property
    def all_converged(self) -> bool:
        """Whether every sample converged (``converged.all()``): ``x`` is then a preimage of every row of ``y``."""
        return bool(self.converged.all())

    def with_solution(self, x: torch.Tensor, batch_shape: tuple[int, ...] | None = None) -> NewtonResult:
        """The same result with ``x`` replaced (cast, transposed, rotated) and, given ``batch_shape``, the
        per-sample ``iterations``, ``residual`` and ``converged`` reshaped to it."""
        if batch_shape is None:
            return dataclasses.replace(self, x=x)
        return dataclasses.replace(
            self,
            x=x,
            iterations=self.iterations.reshape(batch_shape),
            residual=self.residual.reshape(batch_shape),
            converged=self.converged.reshape(batch_shape),
        )

    def raise_if_failed(self, layer: str) -> torch.Tensor:
        """Return ``x``, or raise :class:`NewtonInverseError` naming how many samples failed and by how much."""
        if self.all_converged:
            return self.x
        failed = int((~self.converged).sum())
        worst = float(self.residual[~self.converged].max())
        raise NewtonInverseError(
            f"{layer}.inverse: Newton's method did not converge for {failed} of {self.converged.numel()} samples "
            f"(worst relative residual {worst:.3e} > tolerance {self.tolerance:.1e} after "
            f"{int(self.iterations.max())} iterations). The layer may not be invertible at these points "
            f"(for a guaranteed inverse use invertible=True, Theorem 2). Raise max_iter, loosen tol, or call "
            f"newton_inverse(...) to get the per-sample result with its `converged` mask instead of this error.",
            self,
        )


@torch.no_grad()
def homogeneous_newton(
    function: Callable[[torch.Tensor], torch.Tensor],
    step: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    y: torch.Tensor,
    *,
    tol: float,
    max_iter: int,
    max_halvings: int = 12,
) -> NewtonResult:
    """Solve ``function(x) = y`` row by row for a positively homogeneous ``function``.

    Lemma 2 (scale invariance): ``f(c x) = c f(x)`` for ``c > 0``, so each row is solved on the unit sphere
    for ``y / ||y||`` and scaled back; ``y = 0`` maps to ``x = 0``. Each iteration takes the Newton step
    ``J(x)^{-1} (f(x) - y)``, halved until the residual decreases (damped Newton), so a step never makes
    the answer worse. Rows keep iterating until ``tol / 100`` or until no step decreases the residual; a row
    counts as converged when its residual is at most ``tol``.

    Args:
        function: ``(N, d) -> (N, d)``, the forward map.
        step: ``(x, r) -> (J(x)^{-1} r, ok)`` for ``(N, d)`` rows; ``ok`` is ``(N,)`` bool, ``False`` where
            the Jacobian is singular.
        y: ``(..., d)`` targets.
        tol: relative residual at which a row counts as converged.
        max_iter: Newton iterations at most.

    Returns:
        :class:`NewtonResult`; never raises for non-convergence (see ``NewtonResult.raise_if_failed``).
    """
    shape = y.shape
    flat = y.reshape(-1, shape[-1])
    norms = torch.linalg.vector_norm(flat, dim=-1, keepdim=True)
    nonzero = norms.squeeze(-1) > 0
    target = torch.where(nonzero.unsqueeze(-1), flat / torch.where(nonzero, norms.squeeze(-1), 1.0).unsqueeze(-1), 0.0)
    x = target.clone()
    iterations = torch.zeros(flat.shape[0], dtype=torch.long, device=y.device)
    residual = torch.linalg.vector_norm(function(x) - target, dim=-1)
    stuck = torch.zeros_like(nonzero)
    # Iterate towards tol / 100 (Newton converges quadratically, so this costs one or two more steps and
    # brings the error in x, not only the residual, well inside tol); success is judged against tol.
    aim = tol / 100.0
    for _ in range(max_iter):
        active = (residual > aim) & nonzero & ~stuck
        if not bool(active.any()):
            break
        index = active.nonzero().squeeze(-1)
        xa, ya = x[index], target[index]
        ra = function(xa) - ya
        delta, ok = step(xa, ra)
        base = torch.linalg.vector_norm(ra, dim=-1)
        scale = torch.ones_like(base)
        candidate, candidate_residual = xa, base
        pending = ok.clone()
        for _ in range(max_halvings + 1):
            if not bool(pending.any()):
                break
            trial = xa - scale.unsqueeze(-1) * delta
            trial_residual = torch.linalg.vector_norm(function(trial) - ya, dim=-1)
            accept = pending & torch.isfinite(trial_residual) & (trial_residual < base)
            candidate = torch.where(accept.unsqueeze(-1), trial, candidate)
            candidate_residual = torch.where(accept, trial_residual, candidate_residual)
            pending = pending & ~accept
            scale = torch.where(pending, scale * 0.5, scale)
        # Rows with a singular Jacobian or no decreasing step cannot make progress: stop iterating them.
        stuck[index] = ~ok | pending
        x[index] = candidate
        residual[index] = candidate_residual
        iterations[index] += 1
    residual = torch.where(nonzero, residual, torch.zeros_like(residual))
    x = torch.where(nonzero.unsqueeze(-1), x * norms, torch.zeros_like(x))
    converged = residual <= tol
    batch = shape[:-1]
    return NewtonResult(
        x.reshape(shape), iterations.reshape(batch), residual.reshape(batch), converged.reshape(batch), tol
    )
