"""Invertibility diagnostics of a :class:`~lightning_ortho.flows.Glow` on a batch: plain numbers, no Lightning.

Each function runs under ``torch.no_grad()`` with the model in eval mode (afterwards every submodule gets back its
own mode), so it never initialises an ActNorm or advances a power iteration. ``y`` is a batch of dequantised images
``(N, C, S, S)`` in ``[-1/2, 1/2)``, as :meth:`Glow.encode` takes them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lightning_ortho.flows.conv1x1 import AuxiliaryReflectionConv1x1, Invertible1x1Conv, InvertibleAuxConv1x1
from lightning_ortho.flows.glow import Glow
from lightning_ortho.nn.eval_mode import eval_mode
from lightning_ortho.nn.newton import NewtonInverseError


@dataclass(frozen=True)
class Reconstruction:
    """``max_error``: ``max |decode(encode(y)) - y|`` over all entries (``inf`` where a Newton inverse failed);
    ``newton_failures``: pixels whose Newton solve did not converge in the first layer that failed (decoding
    stops there, so later layers are not counted); ``0`` when the inverse succeeded."""

    max_error: float
    newton_failures: int

    @property
    def ok(self) -> bool:
        """The inverse succeeded: no Newton failure and a finite error."""
        return self.newton_failures == 0 and math.isfinite(self.max_error)


@contextlib.contextmanager
def _evaluating(glow: Glow) -> Iterator[None]:
    # Each submodule gets its own mode back (eval_mode), so a part the user froze in eval mode stays frozen.
    with eval_mode(glow), torch.no_grad():
        yield


def conv1x1_layers(glow: Glow) -> list[Invertible1x1Conv]:
    """Every 1x1 convolution of ``glow``, in the order the encoder applies them."""
    return [m for m in glow.modules() if isinstance(m, Invertible1x1Conv)]


def reconstruction(glow: Glow, y: torch.Tensor) -> Reconstruction:
    """Encode ``y`` and decode the latents (Newton for the auxiliary kinds); how far the result is from ``y``.

    Raises:
        ValueError: ``y`` is not an ``(N, C, S, S)`` image batch for this Glow (from :meth:`Glow.encode`).
    """
    with _evaluating(glow):
        try:
            error = float((glow.reconstruct(y) - y).abs().max())
        except NewtonInverseError as exc:
            return Reconstruction(math.inf, int((~exc.result.converged).sum()))
    return Reconstruction(error, 0)


def jacobian_sign_flips(glow: Glow, y: torch.Tensor) -> float:
    """Largest fraction, over the 1x1 convolutions of ``glow``, of the pixels of their inputs (while encoding
    ``y``) whose Jacobian determinant has the minority sign (:meth:`Invertible1x1Conv.jacobian_sign_flips`).

    Nonzero means some layer's determinant vanishes between those pixels: Theorem 4's sufficient condition for
    invertibility fails there and reconstructions may fail. Always ``0.0`` when every layer is linear.
    """
    inputs: dict[Invertible1x1Conv, torch.Tensor] = {}

    def keep_input(module: torch.nn.Module, args: tuple, output: object) -> None:  # None: the output stays
        inputs.setdefault(module, args[0])

    hooks = [layer.register_forward_hook(keep_input) for layer in conv1x1_layers(glow)]
    with _evaluating(glow):
        try:
            glow.encode(y)
        finally:
            for hook in hooks:
                hook.remove()
        return max((layer.jacobian_sign_flips(x) for layer, x in inputs.items()), default=0.0)


def has_auxiliary_conv1x1(glow: Glow) -> bool:
    """Whether some 1x1 convolution of ``glow`` is an auxiliary reflection (its Jacobian sign can vary)."""
    return any(isinstance(layer, AuxiliaryReflectionConv1x1) for layer in conv1x1_layers(glow))


def min_invertibility_margin(glow: Glow) -> float | None:
    """Smallest Theorem 2 margin ``3/2 lambda_min(W) - lambda_max(W)`` over the ``aux_invertible`` 1x1
    convolutions (positive: every one is provably invertible); ``None`` when ``glow`` has none."""
    margins = [
        layer.invertibility_margin() for layer in conv1x1_layers(glow) if isinstance(layer, InvertibleAuxConv1x1)
    ]
    return min(margins) if margins else None
