"""Compress a trained ``Conv1d``/``Conv2d`` into ``conv(D^T x, C) + b`` (:class:`FactorizedConv`): one fast transform
``D^T`` of the input channels shared by every output channel and kernel offset, and a sparse kernel ``C``.

The learner's data are the kernel's ``(out * prod(k), in)`` rows ``W[o, :, j]`` (one per output channel ``o`` and
kernel offset ``j``): ``W[o, :, j] ~ C[o, :, j] D^T`` in the Frobenius norm, the objective of :func:`compress_linear`
with ``s`` nonzeros per row. A ``1 x 1`` convolution is exactly a linear layer over the channels. With ``data``
(inputs of the layer, ``(N, in, *spatial)``) the code values and the bias are refit by least squares on the layer's
outputs over the patches of those inputs, as :func:`compress_linear` refits a linear layer's (the patch matrix
``(out, in * prod(k))`` with the dictionary ``D kron I``, each output channel one row with its ``s prod(k)`` codes).
"""

from __future__ import annotations

import math
import time
import warnings

import torch
from rich.console import Console
from torch import nn
from torch.nn import functional

from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.compression import (
    CompressionReport,
    _check_int,
    _compress_to_error,
    _warn_if_dearer,
    learn_factorization,
)
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.data_refit import refit_on_data, refit_warning, relative_square_error
from lightning_ortho.transforms.factorized_conv import FactorizedConv
from lightning_ortho.transforms.families import family_spec, features_suiting, transform_op_count, unused_hyperparameter

#: Patches of ``data`` the refit uses at most (a random subset beyond: the refit's cost grows with them, and a few
#: thousand rows determine ``s prod(k) + 1`` unknowns per output channel many times over).
MAX_REFIT_PATCHES = 20_000


def conv_problem(conv: nn.Module) -> str | None:
    """Why ``conv`` cannot be compressed as a convolution, whatever its weights; ``None`` when it can."""
    if isinstance(conv, nn.modules.conv._ConvTransposeNd):
        return "transposed convolutions are not supported; keep it dense"
    if not isinstance(conv, nn.Conv1d | nn.Conv2d):
        kind = "Conv3d is" if isinstance(conv, nn.Conv3d) else f"{type(conv).__name__} is not"
        return f"{kind} not supported (Conv1d and Conv2d are); keep it dense"
    if conv.groups != 1:
        depthwise = conv.groups == conv.in_channels
        return (
            f"it has groups={conv.groups}{' (depthwise)' if depthwise else ''}: each output channel sees only "
            f"{conv.in_channels // conv.groups} input channel{'s' * (conv.in_channels // conv.groups != 1)}, which "
            "a transform shared over all the channels would mix; keep it dense (a depthwise convolution is already "
            "prod(kernel_size) multiplications per channel)"
        )
    if conv.in_channels < 2:
        return (
            f"it has {conv.in_channels} input channel: the transforms are products of blocks on pairs of channels; "
            "keep it dense"
        )
    return None


def compress_conv(
    conv: nn.Conv1d | nn.Conv2d,
    family: str = "b",
    *,
    s: int | None = None,
    m: int | None = None,
    q: int | None = None,
    bits: int | None = None,
    iterations: int | None = None,
    generator: torch.Generator | None = None,
    data: torch.Tensor | None = None,
    input_size: tuple[int, ...] | None = None,
    progress: bool | None = None,
    console: Console | None = None,
    max_error: float | None = None,
) -> FactorizedConv:
    """Replace a convolution by ``conv(D^T x, C) + b`` (see the module docstring and :class:`FactorizedConv`).

    Args:
        conv: an ``nn.Conv1d`` or ``nn.Conv2d`` with ``groups=1`` and at least 2 input channels.
        family: the transform family, as :func:`~lightning_ortho.transforms.compress_linear`.
        s: nonzeros per code row (per output channel and kernel offset), at most ``in_channels``; the default is
            that of a linear layer with ``in_channels`` inputs and ``out_channels * prod(kernel_size)`` outputs, as
            are those of ``m`` and ``q``.
        m: blocks (families ``"b"``, ``"shear"``, ``"b4x4"``) of the ``in_channels``-point transform.
        q: stages (family ``"m"``).
        bits: SOPOT terms per shear (family ``"shear"``).
        iterations: sweeps or rounds of the learner.
        generator: the learner's generator, and the draw of the refit's patches.
        progress: the learner's progress bar, as :func:`~lightning_ortho.transforms.compress_linear`'s.
        console: the rich ``Console`` of the progress bar.
        data: optional ``(N, in, *spatial)`` inputs of the layer for the data-aware refit (at most
            :data:`MAX_REFIT_PATCHES` of their patches, drawn with ``generator``); ``report.output_error`` is then
            the in-sample relative output error (percent) on those patches. It also gives the input size.
        input_size: the inputs' spatial size for the op counts (default: that of ``data``; without either, the
            report counts one output position with one input pixel, as a stride-1 "same" convolution pays per
            position, and ``report.input_size`` is ``None``).
        max_error: a budget instead of ``s``, as :func:`compress_linear`'s: the smallest ``s`` whose output error
            on ``data`` (else the kernel's error) is at most ``max_error`` percent.

    Returns:
        The compressed layer, a :class:`FactorizedConv` in the layer's dtype and device, with ``error`` (percent,
            the kernel's Frobenius error) and ``report`` (a
            :class:`~lightning_ortho.transforms.compression.CompressionReport`, op counts per image, as
            :meth:`FactorizedConv.op_count` and :meth:`FactorizedConv.dense_op_count` count them).

    Raises:
        ValueError: a convolution that cannot be compressed (transposed, 3-D, grouped or depthwise, one input
            channel: the message says why and what to do), NaN/inf or all-zero weights, hyperparameters out of range
            or for another family, bad ``data`` or ``input_size``.
        TypeError: ``conv`` is not a module.
    """
    if max_error is not None:
        if s is not None:
            raise ValueError("compress_conv: give s (nonzeros per code row) or max_error (a budget), not both.")
        options = {"m": m, "q": q, "bits": bits, "iterations": iterations, "data": data, "input_size": input_size}
        options.update(progress=progress, console=console)
        return _compress_to_error(compress_conv, conv, family, max_error, generator, options)
    start = time.perf_counter()
    if not isinstance(conv, nn.Module):
        raise TypeError(f"compress_conv: expected an nn.Conv1d or nn.Conv2d, got {type(conv).__name__}.")
    problem = conv_problem(conv)
    if problem is not None:
        raise ValueError(f"compress_conv: cannot compress this {type(conv).__name__}: {problem}.")
    spec = family_spec(family, "compress_conv")
    weight = conv.weight.detach()
    bias = None if conv.bias is None else conv.bias.detach()
    out, n, *kernel = weight.shape
    offsets = math.prod(kernel)
    name = type(conv).__name__
    if not bool(torch.isfinite(weight).all()) or (bias is not None and not bool(torch.isfinite(bias).all())):
        raise ValueError(f"compress_conv: the {name}'s weight or bias holds NaN or inf; fix the training first.")
    if not bool((weight != 0).any()):
        raise ValueError(f"compress_conv: the {name}'s weight is all zeros; there is nothing to compress.")
    feature_problem = spec.feature_problem(n)
    if feature_problem is not None:
        names = [repr(f) for f in features_suiting(n)]
        raise ValueError(
            f"compress_conv: family={family!r} {feature_problem.replace('in_features', 'in_channels')}, got {n}; "
            f"use family={' or '.join(names)}."
        )
    message = unused_hyperparameter(spec, {"m": m, "q": q, "bits": bits}, "compress_conv")
    if message is not None:
        raise ValueError(message)
    defaults = spec.defaults(n, out * offsets)
    s = defaults["s"] if s is None else s
    _check_int(s, "s", 1, n, " (nonzeros per code row, at most in_channels)")
    m = (defaults["m"] if m is None else m) if "m" in spec.takes else m
    q = (defaults["q"] if q is None else q) if "q" in spec.takes else q
    for value, label in ((m, "m"), (q, "q"), (bits, "bits"), (iterations, "iterations")):
        if value is not None:
            _check_int(value, label, 1)
    dims = len(kernel)
    if data is not None:
        if not isinstance(data, torch.Tensor) or not data.is_floating_point():
            raise ValueError(
                f"compress_conv: data must be a floating (N, {n}, *spatial) tensor, got {not_floating(data)}."
            )
        if data.dim() != dims + 2 or data.shape[1] != n or data.shape[0] < 1:
            raise ValueError(
                f"compress_conv: data must be a floating (N, {n}, *spatial) tensor with {dims} spatial dims, got "
                f"shape {tuple(data.shape)}."
            )
        if not bool(torch.isfinite(data).all()):
            raise ValueError("compress_conv: data holds NaN or inf.")
        input_size = tuple(data.shape[2:]) if input_size is None else input_size
    if input_size is not None:
        input_size = tuple(int(v) for v in input_size)
        if len(input_size) != dims or min(input_size) < 1:
            raise ValueError(f"compress_conv: input_size must be {dims} positive ints, got {input_size}.")

    # the learner's rows: W[o, :, j] for every output channel o and offset j, in the order (o, j)
    rows = weight.double().cpu().movedim(1, -1).reshape(out * offsets, n)
    settings = {"m": m, "q": q, "s": s, "bits": bits, "iterations": iterations, "generator": generator}
    label = f"{out}x{n}x{'x'.join(map(str, kernel))}"
    learning = learn_factorization(
        rows, spec, settings, label, progress=progress, console=console, where="compress_conv", noun="kernel"
    )
    codes = learning.codes.reshape(out, *kernel, n).movedim(-1, 1)  # (out, in, *k)
    mask = learning.mask.reshape(out, *kernel, n).movedim(-1, 1)
    b64 = None if bias is None else bias.double().cpu()
    output_error, data_rank, support_rank, patch_rows = None, None, None, None
    if data is not None:
        patches = _patches(conv, data.detach().double().cpu(), generator)
        patch_rows = patches.shape[0]
        d = torch.kron(learning.dictionary.matrix().contiguous(), torch.eye(offsets, dtype=torch.float64))
        flat_codes, flat_mask = codes.reshape(out, -1), mask.reshape(out, -1)
        support = flat_mask.nonzero()[:, 1].reshape(out, -1)
        w64 = weight.double().cpu().reshape(out, -1)
        refit = refit_on_data(patches, w64, b64, d, flat_codes, support)
        codes, b64 = refit.codes.reshape(codes.shape), refit.bias
        data_rank, support_rank = refit.data_rank, refit.support_rank
        target = patches @ w64.T + (0 if bias is None else bias.double().cpu())
        output_error = relative_square_error(target, (patches @ d) @ refit.codes.T + b64)
        message = refit_warning(refit, patch_rows, s * offsets, out, output_error)
        if message is not None:
            warnings.warn(message.replace("compress_linear", "compress_conv"), stacklevel=2)
    factorized = FactorizedConv(
        learning.dictionary.transpose(),
        codes,
        b64,
        mask=mask,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        padding_mode=conv.padding_mode,
        input_size=input_size,
    )
    factorized.error = factorized.relative_error(weight.cpu())
    # per image of input_size; without one, per output position with one input pixel per position
    pixels, positions = (
        (math.prod(input_size), math.prod(factorized.output_size(input_size))) if input_size is not None else (1, 1)
    )
    fan_in = n * offsets
    dense_ops = OpCount(additions=out * (fan_in - 1), multiplications=out * fan_in) * positions
    transform_ops = transform_op_count(spec, factorized, bits) * pixels
    code_ops = factorized.codes_op_count() * positions
    factorized = factorized.to(device=weight.device, dtype=weight.dtype)
    factorized.report = CompressionReport(
        family=family,
        in_features=n,
        out_features=out,
        s=s,
        blocks=learning.learned.num_blocks,
        stages=q if family == "m" else None,
        bits=bits,
        error=factorized.error,
        output_error=output_error,
        data_rank=data_rank,
        dense_ops=dense_ops,
        factorized_ops=transform_ops + code_ops,
        transform_ops=transform_ops,
        code_ops=code_ops,
        learner_errors=learning.errors,
        seconds=time.perf_counter() - start,
        planned_steps=learning.planned_steps,
        steps=learning.steps,
        estimated_seconds=learning.estimated_seconds,
        support_rank=support_rank,
        data_rows=patch_rows,
        input_size=input_size,
    )
    _warn_if_dearer(factorized.report, f"{out}x{n}x{'x'.join(map(str, kernel))}", family, "compress_conv")
    return factorized


def _patches(conv: nn.Module, data: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The ``(rows, in * prod(k))`` patches the convolution sees in ``data`` (float64), channel-major as
    ``weight.reshape(out, -1)``; at most :data:`MAX_REFIT_PATCHES` of them, drawn at random."""
    mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
    padded = functional.pad(data, conv._reversed_padding_repeated_twice, mode=mode)
    if padded.dim() == 3:  # Conv1d: a 2-D unfold of height 1
        padded = padded.unsqueeze(-2)
        kernel, dilation, stride = (1, *conv.kernel_size), (1, *conv.dilation), (1, *conv.stride)
    else:
        kernel, dilation, stride = conv.kernel_size, conv.dilation, conv.stride
    patches = functional.unfold(padded, kernel, dilation=dilation, stride=stride)  # (N, in * K, L)
    patches = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    if patches.shape[0] > MAX_REFIT_PATCHES:
        chosen = torch.randperm(patches.shape[0], generator=generator)[:MAX_REFIT_PATCHES]
        patches = patches[chosen]
    return patches
