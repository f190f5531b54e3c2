"""One online step's readout loss and its gradients in closed form: what ``torch.autograd.grad`` of
``masked_loss_sum(readout(h), y, mask, loss) / streams`` gives, in a handful of kernels and without a graph (or, for
a linear readout of float32/float64 CPU tensors, one C pass: :mod:`lightning_ortho._native.readout`)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from lightning_ortho._native.readout import LARGEST_PRODUCT, linear_readout, linear_readout_kernel
from lightning_ortho.models.online.readout import IGNORE_INDEX, Readout, real_features

__all__ = ["readout_step"]


def readout_step(
    readout: Readout | nn.Linear,
    h: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor | None,
    loss: str,
    streams: float,
    *,
    native: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The step's masked loss sum, ``dL/dh`` and the readout's parameter gradients, with ``L = loss_sum / streams``.

    ``readout`` the module's :class:`Readout` or an ``nn.Linear(H, O)``; ``h`` ``(b, H)`` (complex: the readout
    reads :func:`~lightning_ortho.models.online.readout.real_features`, and ``dL/dh = dL/dRe h + i dL/dIm h``, as
    autograd gives it); ``y`` ``(b,)`` int64
    class indices, or ``(b, O)`` float (probabilities for ``"cross_entropy"``, real targets for ``"mse"``); ``mask``
    ``(b,)`` bool, or ``None`` when every stream scores (the same result, without the masking kernels, for a
    caller that knows it without reading the mask on the host); ``streams`` the divisor. With ``o = readout(h)`` computed
    in at least float32 (autocast off) and per stream ``l = 0.5 ||o - y||^2`` (``dl/do = o - y``) or
    ``l = -sum_k y_k log softmax(o)_k`` (``dl/do = softmax(o) sum_k y_k - y``; a class index is its one-hot row),
    ``g = dL/do = (dl/do) * mask / streams``; then ``dL/dh = g W`` (kind ``"linear"``, ``o = h W^T + c``) or ``g``
    padded with zeros to ``H`` (kind ``"units"``), ``dL/dW = g^T h`` and ``dL/dc = sum_streams g``. Masked streams
    contribute exactly zero, whatever their targets hold (NaN, inf, out-of-range classes, -100).

    A linear readout whose ``h``, weight, bias and float targets share one dtype, float32 or float64, on the CPU,
    of at most ``LARGEST_PRODUCT`` streams x outputs x units, runs as one C pass (the same expressions, equal to
    rounding); :func:`lightning_ortho._native.native_kernels` ``(False)`` (or ``LIGHTNING_ORTHO_NATIVE=0``) keeps the
    PyTorch ops. ``native=False`` does the same for this call but is deprecated (a ``DeprecationWarning``): use the
    switch.

    Returns:
        ``(loss_sum, grad_h, readout_grads)``: the sum of ``l`` over the masked streams as a detached float64
        scalar; ``grad_h`` in ``h``'s dtype; the gradients of the readout's parameters that require one, in the
        order of ``readout.named_parameters()`` and in their dtypes (frozen ones are skipped).

    Raises:
        ValueError: ``loss`` is neither ``"mse"`` nor ``"cross_entropy"``, or int64 targets with ``"mse"``.
    """
    if native is not None:
        warnings.warn(
            "readout_step(native=...) is deprecated: use the package's one switch,"
            " lightning_ortho._native.native_kernels(False) (a function and a context manager), or"
            " LIGHTNING_ORTHO_NATIVE=0.",
            DeprecationWarning,
            stacklevel=2,
        )
    return _readout_step(readout, h, y, mask, loss, streams, native is not False)


def _readout_step(readout, h, y, mask, loss, streams, native):
    """:func:`readout_step` with ``native`` a bool (``False``: the deprecated per-call switch is off)."""
    if h.is_complex():  # the readout reads [Re h, Im h] interleaved; dL/dh = dL/dRe h + i dL/dIm h (autograd's)
        loss_sum, grad_features, grads = _readout_step(readout, real_features(h), y, mask, loss, streams, native)
        return loss_sum, torch.view_as_complex(grad_features.view(*h.shape, 2)), grads
    if loss not in ("mse", "cross_entropy"):
        raise ValueError(f"readout_step: loss must be 'mse' or 'cross_entropy', got {loss!r}.")
    if loss == "mse" and not y.is_floating_point():
        raise ValueError(f"readout_step: loss='mse' takes float (b, O) targets, got {y.dtype}.")
    linear = readout if isinstance(readout, nn.Linear) else readout.linear
    if native and linear is not None:
        found = _native_step(linear, h, y, mask, loss, streams)
        if found is not None:
            return found
    if h.device.type != "meta" and torch.is_autocast_enabled(h.device.type):  # loss in >= float32, as masked_loss_sum
        with torch.autocast(h.device.type, enabled=False):
            return _step(readout, linear, h, y, mask, loss, streams)
    return _step(readout, linear, h, y, mask, loss, streams)


def _step(readout, linear, h, y, mask, loss, streams):
    # detached: no autograd graph; .to only where the dtype differs (each call costs time at these sizes)
    dtype = torch.promote_types(h.dtype, torch.float32)
    if linear is not None:
        dtype = torch.promote_types(dtype, linear.weight.dtype)
    hc = _as(h, dtype)
    if linear is not None:
        weight = _as(linear.weight, dtype)
        if linear.bias is not None:
            outputs = torch.addmm(_as(linear.bias, dtype), hc, weight.t())
        else:
            outputs = torch.mm(hc, weight.t())
    else:
        outputs = hc[:, : readout.output_size]
    loss_sum, g = _loss_and_gradient(outputs, y, mask, loss, streams)
    grads = []
    if linear is not None:
        grad_h = torch.mm(g, weight)
        if linear.weight.requires_grad:
            grads.append(_as(torch.mm(g.t(), hc), linear.weight.dtype))
        if linear.bias is not None and linear.bias.requires_grad:
            grads.append(_as(g.sum(0), linear.bias.dtype))
    else:
        grad_h = torch.nn.functional.pad(g, (0, h.shape[-1] - g.shape[-1]))
    return loss_sum.double(), _as(grad_h, h.dtype), grads


def _native_step(linear: nn.Linear, h, y, mask, loss, streams):
    """The C pass's ``(loss_sum, grad_h, readout_grads)``, or ``None`` where it does not apply (see
    :func:`readout_step`) or its loss is not finite (NaN/inf, an out-of-range class): the PyTorch ops then run,
    and say what is wrong."""
    weight, bias = linear.weight, linear.bias
    dtype = h.dtype
    if weight.dtype is not dtype or y.dtype is not (dtype if y.is_floating_point() else torch.int64):
        return None
    if bias is not None and (bias.dtype is not dtype or not bias.is_contiguous()):
        return None
    if not (h.is_contiguous() and weight.is_contiguous()) or h.shape[0] * weight.numel() > LARGEST_PRODUCT:
        return None
    if y.is_cuda or (mask is not None and (mask.dtype is not torch.bool or mask.is_cuda)):
        return None
    kernel = linear_readout_kernel(h, weight, bias, y, mask)  # None: not real CPU float32/float64, or no kernels
    if kernel is None:
        return None
    weight_grad, bias_grad = weight.requires_grad, bias is not None and bias.requires_grad
    loss_sum, grad_h, grad_weight, grad_bias = linear_readout(
        kernel, h, weight, bias, y, mask, loss == "cross_entropy", IGNORE_INDEX, streams,
        weight_grad=weight_grad, bias_grad=bias_grad,
    )  # fmt: skip
    if loss_sum is None:
        return None
    return loss_sum, grad_h, [grad_weight] * weight_grad + [grad_bias] * bias_grad


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.detach()
    return t if t.dtype == dtype else t.to(dtype)


def _loss_and_gradient(
    outputs: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, loss: str, streams: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of l over masked streams, g = (dl/do) * mask / streams)`` for ``outputs`` ``(b, O)`` (``mask``
    ``None``: every stream)."""
    if loss == "mse":
        if mask is None:  # not in place: the "units" readout's outputs are a view of h
            residual = outputs - (y if y.dtype == outputs.dtype else y.to(outputs.dtype))
        else:  # where() after the subtraction: a NaN/inf target at a masked stream is dropped, not multiplied by 0
            residual = torch.where(mask[:, None], outputs - y.to(outputs.dtype), 0.0)
        flat = residual.view(-1)
        return torch.dot(flat, flat).mul_(0.5), residual.div_(streams)
    log_p = torch.log_softmax(outputs, -1)
    if y.dtype == torch.long:
        # as cross_entropy's ignore_index (read_chunk already masks them)
        mask = y != IGNORE_INDEX if mask is None else mask & (y != IGNORE_INDEX)
        rows = mask[:, None]
        index = torch.where(mask, y, 0)[:, None]  # padding may be out of range
        loss_sum = torch.where(mask, log_p.gather(1, index).squeeze(1), 0.0).sum().neg_()
        # softmax(o) - onehot(y), zero at masked streams
        g = torch.where(rows, log_p.exp_().scatter_(1, index, -1.0, reduce="add"), 0.0)
        return loss_sum, g.div_(streams)
    target = y.to(outputs.dtype)
    if mask is not None:
        target = torch.where(mask[:, None], target, 0.0)  # padding may be NaN or inf
    loss_sum = torch.dot(target.reshape(-1), log_p.view(-1)).neg_()  # reshape: y may be a step of a chunk
    # target - softmax(o) * sum_k target_k = -(dl/do); the sign goes into the division
    g = torch.addcmul(target, log_p.exp_(), target.sum(-1, keepdim=True), value=-1.0)
    return loss_sum, g.div_(-streams)
