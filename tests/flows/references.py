"""Independent references for the flow tests: autograd Jacobians, no formula of the code under test."""

import torch

from lightning_ortho.flows import Invertible1x1Conv


def autograd_log_det(layer, x: torch.Tensor) -> torch.Tensor:
    """log|det dy/dx| per sample from the full autograd Jacobian (independent of the layer's own formula)."""
    out = []
    for sample in x:
        jac = torch.autograd.functional.jacobian(lambda t: layer(t.unsqueeze(0))[0].reshape(-1), sample)
        out.append(torch.linalg.slogdet(jac.reshape(sample.numel(), sample.numel()))[1])
    return torch.stack(out)


def pixel_jacobians(layer, x: torch.Tensor) -> torch.Tensor:
    """``(N, H, W, C, C)``: the autograd Jacobian of a 1x1 convolution's map ``g`` at every pixel of ``x``,
    found by running the layer on that pixel alone (a 1x1 image)."""
    n, c, h, w = x.shape

    def g(vector: torch.Tensor) -> torch.Tensor:
        return layer(vector.reshape(1, c, 1, 1))[0].reshape(c)

    rows = x.permute(0, 2, 3, 1).reshape(-1, c)
    jacobians = torch.stack([torch.autograd.functional.jacobian(g, row) for row in rows])
    return jacobians.reshape(n, h, w, c, c)


def pixel_jacobian_signs(layer, x: torch.Tensor) -> torch.Tensor:
    """``(N, H, W)``: ``sign det`` of :func:`pixel_jacobians`."""
    return torch.sign(torch.linalg.det(pixel_jacobians(layer, x)))


def minority_fraction(signs: torch.Tensor) -> float:
    """Fraction of entries whose sign is the less common one (exact zeros count as not positive)."""
    positive = (signs > 0).sum().item() / signs.numel()
    return min(positive, 1.0 - positive)


def conv1x1_inputs(glow, y: torch.Tensor) -> list[tuple[torch.nn.Module, torch.Tensor]]:
    """``(layer, input)`` for every 1x1 convolution while ``glow`` encodes ``y``."""
    seen = []
    layers = [m for m in glow.modules() if isinstance(m, Invertible1x1Conv)]

    def keep(module, args, output):
        seen.append((module, args[0].detach().clone()))

    hooks = [layer.register_forward_hook(keep) for layer in layers]
    try:
        with torch.no_grad():
            glow.encode(y)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == len(layers) > 0
    return seen
