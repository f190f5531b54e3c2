"""Which layers TransformCompression replaces: the model's outermost Linear/SVDLinear layers and Conv1d/Conv2d
convolutions, those that suit the compression (checked before training) and those whose current weights it can
compress (checked when it runs)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from lightning_ortho.nn import SVDLinear
from lightning_ortho.transforms.compression import FactorizedLinear, NotAffineError, affine_parts
from lightning_ortho.transforms.conv_compression import conv_problem
from lightning_ortho.transforms.factorized_conv import FactorizedConv
from lightning_ortho.transforms.families import FAMILY_TABLE

#: The layers TransformCompression considers: dense ones it may compress, and compressed ones (a resumed run).
CANDIDATES = (nn.Linear, SVDLinear, FactorizedLinear, nn.modules.conv._ConvNd, FactorizedConv)
COMPRESSED = (FactorizedLinear, FactorizedConv)


def linear_modules(model: nn.Module) -> list[str]:
    """Names of the outermost ``nn.Linear`` / ``SVDLinear`` / convolution modules of ``model``, and of its
    compressed ones (``FactorizedLinear``, ``FactorizedConv``)."""
    names: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, CANDIDATES) and name:
            if not any(name.startswith(f"{outer}.") for outer in names):
                names.append(name)
    return names


def layer_problem(
    module: nn.Module, parent: nn.Module | None, family: str, s: int | None, weights: bool
) -> tuple[str | None, str | None]:
    """``(structural, weights)``: why ``module`` cannot be compressed whatever its values (known before
    training), and, with ``weights``, why its current values cannot be (all zero, NaN/inf); ``None`` when fine."""
    if isinstance(parent, nn.MultiheadAttention):
        return "it belongs to nn.MultiheadAttention, which reads its weight directly instead of calling it", None
    features = "input features"
    if isinstance(module, nn.modules.conv._ConvNd):
        problem = conv_problem(module)
        if problem is not None:
            return problem, None
        weight, bias, features = module.weight.detach(), module.bias, "input channels"
    else:
        try:
            weight, bias = affine_parts(module)
        except (TypeError, NotAffineError) as error:
            return str(error), None
    n = weight.shape[1]
    spec = FAMILY_TABLE[family]
    if n < 2 or spec.feature_problem(n) is not None:
        need = f">= {spec.block_size}" + (", even" if spec.even_features else "")
        return f"its {n} {features} do not suit family {family!r} (needs {need})", None
    if s is not None and s > n:
        return f"s={s} exceeds its {n} {features}", None
    if not weights:
        return None, None
    if not bool(torch.isfinite(weight).all()) or (bias is not None and not bool(torch.isfinite(bias).all())):
        return None, "its weight or bias holds NaN or inf"
    if not bool((weight != 0).any()):
        return None, "its weight is all zeros (an unused or zero-initialised layer: nothing to compress)"
    return None, None


def select_layers(
    model: nn.Module,
    modules: list[str] | None,
    family: str,
    s: int | None,
    *,
    warn: bool = True,
    weights: bool = True,
) -> list[str]:
    """Names of the modules TransformCompression will replace in ``model``: ``modules`` (names), or ``None`` for
    every outermost Linear/SVDLinear/Conv1d/Conv2d that suits ``family`` and ``s``.

    Args:
        model: the model as it is now.
        warn: warn about the layers that automatic selection (``modules=None``) skips because of their kind or
            shape (at the start of ``fit``: known before training).
        weights: also skip, always with a warning, the layers whose current weights cannot be compressed (all
            zero, NaN/inf): they stay dense. At compression time only, since training changes them.

    Raises:
        ValueError: a named module is missing or not compressible whatever its weights, or nothing is left to
            compress (unless only the weights' values left nothing).
    """
    available = linear_modules(model)
    chosen, skipped, kept_dense = [], [], []
    for name in modules if modules is not None else available:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise ValueError(
                f"TransformCompression: the model has no submodule {name!r}. Its Linear and convolution modules are:"
                f" {available}."
            ) from None
        if isinstance(module, COMPRESSED):
            continue  # already compressed (a resumed run)
        parent = model.get_submodule(name.rpartition(".")[0])
        problem, values = layer_problem(module, parent, family, s, weights)
        if problem is None and values is None:
            chosen.append(name)
        elif problem is None:
            kept_dense.append(f"{name} ({values})")
        elif modules is not None:
            raise ValueError(f"TransformCompression: cannot compress {name!r}: {problem}.")
        else:
            skipped.append(f"{name} ({problem})")
    if skipped and warn:
        warnings.warn(f"TransformCompression: skipping {'; '.join(skipped)}.", stacklevel=2)
    if kept_dense:
        warnings.warn(
            f"TransformCompression: not compressing {'; '.join(kept_dense)}; these layers stay dense.", stacklevel=2
        )
    compressed = any(isinstance(model.get_submodule(n), COMPRESSED) for n in available)
    if not chosen and not kept_dense and not compressed:
        raise ValueError(
            f"TransformCompression: no module to compress. The model's Linear and convolution modules: {available}."
        )
    return chosen
