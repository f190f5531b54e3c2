"""The fast path of ``f(x) = H(W x) x`` for well-scaled, finite rows: few kernels and one host read per call.

It runs only where that read is free: on tensors the C kernels may touch
(:func:`~lightning_ortho._native.guard.real_cpu`: real CPU memory, nothing tracing, no dispatch or torch-function
mode, no ``torch.func`` transform). Everywhere else (an accelerator, ``torch.compile``, a dispatch mode,
``torch.func``) the careful path runs without the read: it is exact for every row, and reading there would stall a
device's queue or break a compiled graph.

``v = x W^T``, ``c = v.x / v.v``, ``y = x - 2 c v`` (section 1.1 / Theorem 1 of "One Reflection Suffice"). The
careful path (:func:`~lightning_ortho.nn.reflection.reflect_linear_with_summary`) masks undefined reflections
(``H(0) := I``), reflects every row at unit scale and names the input holding a NaN. Here none of that is needed as long
as every row has ``v.v`` in the dtype's accurate range (:func:`~lightning_ortho.nn._undefined.accurate_range`) and a
finite ``c``; one small reduction tells both (a NaN or inf anywhere in ``x`` or ``W`` makes some ``v.v`` or ``c``
non-finite), and when it fails the caller discards the result and takes the careful path, which gives the
same answer as before and the same errors.

:class:`_WellScaledLinearReflection` writes the derivatives by hand. The forward pass is one GEMM, two row dot
products, a division and one ``addcmul``; the backward pass one row dot product, three elementwise passes and two
GEMMs (``addmm``, which also adds the direct term), with ``g = dL/dy``, ``t = g.v / v.v`` and ``u = c g + t y``:

    dL/dx = g - 2 t v - 2 u W,        dL/dW = -2 u^T x.

On the CPU (float32, float64) the row passes around the GEMMs run as one C pass each
(:mod:`lightning_ortho._native.reflection_rows`: the same expressions, about seven kernel launches fewer per pass,
which is most of the cost at d <= 256); elsewhere, or where no C compiler is found, the PyTorch ops above run.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from lightning_ortho._native.guard import real_cpu
from lightning_ortho._native.reflection_rows import reflect_rows, reflect_rows_backward, row_kernels
from lightning_ortho.nn._undefined import accurate_range

#: Row reductions above this many elements use a batched ``(1, d) x (d, 1)`` product, which does not materialise
#: ``a * b`` (for large inputs the memory traffic it saves outweighs its fixed cost); below it ``vecdot`` has less
#: per-call overhead.
_BATCHED_DOT_MIN_NUMEL = 1 << 22


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(N,)``: ``a.b`` of each row of two ``(N, d)`` tensors."""
    if a.numel() >= _BATCHED_DOT_MIN_NUMEL:
        return torch.bmm(a.unsqueeze(-2), b.unsqueeze(-1)).view(-1)
    return torch.linalg.vecdot(a, b)


def _reflect(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, v, c, vv)`` for ``(N, d)`` rows: ``v = x W^T``, ``vv = v.v``, ``c = v.x / vv``, ``y = x - 2 c v``."""
    v = torch.mm(x, weight.t())
    vv = _rowdot(v, v)
    c = _rowdot(v, x).div_(vv) if not torch.is_grad_enabled() else _rowdot(v, x) / vv
    return torch.addcmul(x, c.unsqueeze(-1), v, value=-2.0), v, c, vv


def _backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    v: torch.Tensor,
    c: torch.Tensor,
    vv: torch.Tensor,
    needs: tuple[bool, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dL/dx, dL/dW)`` from ``g = dL/dy`` (see the module docstring); made of differentiable ops, so the same
    code builds a graph of the gradient when called with grad mode on (double backward)."""
    t = (_rowdot(grad_y, v) / vv).unsqueeze(-1)
    u = torch.addcmul(grad_y * c.unsqueeze(-1), t, y)  # c g + t y
    return _gemms(torch.addcmul(grad_y, t, v, value=-2.0) if needs[0] else None, u, x, weight, needs)


def _gemms(
    r: torch.Tensor | None, u: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, needs: tuple[bool, ...]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dL/dx, dL/dW) = (r - 2 u W, -2 u^T x)``, each only where needed, with ``r = g - 2 t v``."""
    grad_x = grad_weight = None
    if needs[0]:
        grad_x = torch.addmm(r, u, weight, alpha=-2.0)
    if needs[1]:
        # beta = 0: addmm ignores its input (documented, NaN included); weight only lends its shape.
        grad_weight = torch.addmm(weight, u.t(), x, beta=0.0, alpha=-2.0)
    return grad_x, grad_weight


#: ``accurate_range`` per dtype, computed once (``torch.finfo`` is too slow to call on every forward).
_RANGES = {dtype: accurate_range(dtype) for dtype in (torch.float32, torch.float64)}


class _WellScaledLinearReflection(torch.autograd.Function):
    """``(x, W, span) -> y = H(x W^T) x`` for ``(N, d)`` rows, without masking; appends to the list ``span`` the
    smallest and largest ``v.v`` over the rows (NaN where some ``c`` is not finite), which the caller checks.
    (A list argument instead of more outputs: each output of a Function costs more than the kernels here.)

    Forward-mode (``jvp``) and double backward are supported; ``torch.func`` transforms take the careful path.
    """

    @staticmethod
    def forward(ctx, x, weight, span):  # noqa: D102
        kernels = row_kernels(x, weight)
        if kernels is not None:  # the row passes in one C pass (GEMM by PyTorch)
            x = x.contiguous()
            v = torch.mm(x, weight.t())
            y, c, vv, lowest, highest = reflect_rows(kernels, x, v)
            span.extend((lowest, highest))
        else:
            y, v, c, vv = _reflect(x, weight)
            # vv + 0 * c is vv where c is finite and NaN where it is not (0 * inf = NaN): one reduction checks both.
            span.extend(torch.aminmax(torch.add(vv, c, alpha=0.0)))
        ctx.save_for_backward(x, weight, y)
        ctx.x, ctx.weight, ctx.v, ctx.c, ctx.vv = x, weight, v, c, vv  # inputs and intermediates: no cycle
        ctx.kernels = kernels
        return y

    @staticmethod
    def backward(ctx, grad_y):  # noqa: D102
        x, weight, y = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():  # double backward: recompute the intermediates inside the graph
            y, v, c, vv = _reflect(x, weight)
            return (*_backward(grad_y, x, weight, y, v, c, vv, needs), None)
        if ctx.kernels is not None and grad_y.dtype is x.dtype and row_kernels(grad_y, y) is not None:
            u, r = reflect_rows_backward(ctx.kernels, grad_y, ctx.v, y, ctx.c, ctx.vv)
            return (*_gemms(r, u, x, weight, needs), None)
        # A gradient from sum() is expanded (stride 0); elementwise kernels are faster on a contiguous copy.
        return (*_backward(grad_y.contiguous(), x, weight, y, ctx.v, ctx.c, ctx.vv, needs), None)

    @staticmethod
    def jvp(ctx, x_t, weight_t, _span_t):  # noqa: D102
        x, weight, v, c, vv = ctx.x, ctx.weight, ctx.v, ctx.c, ctx.vv
        x_t = torch.zeros_like(x) if x_t is None else x_t
        v_t = torch.mm(x_t, weight.t())
        if weight_t is not None:
            v_t = torch.addmm(v_t, x, weight_t.t())
        # c = v.x / vv  =>  dc = (dv.x + v.dx - 2 c v.dv) / vv
        c_t = (_rowdot(v_t, x) + _rowdot(v, x_t) - 2.0 * c * _rowdot(v, v_t)) / vv
        return torch.addcmul(torch.addcmul(x_t, c_t.unsqueeze(-1), v, value=-2.0), c.unsqueeze(-1), v_t, value=-2.0)


def _is_dual(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` carries a forward-mode tangent (which only the PyTorch ops propagate)."""
    return forward_ad.unpack_dual(tensor).tangent is not None


def well_scaled_linear_reflection(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``H(x W^T) x`` for ``(N, d)`` rows and a ``(d, d)`` ``W`` of the same dtype (float32 or float64), or ``None``
    when some row has ``v.v`` outside the accurate range or a non-finite ``c``. Then the result is discarded:
    zero, 1e-20 and 1e19 rows, NaN and inf go to the careful path, which handles or names them.

    Also ``None``, before computing anything, where the verdict would cost a host read that is not free: unless
    :func:`~lightning_ortho._native.guard.real_cpu` holds for ``x`` and ``W`` (see the module docstring)."""
    if not real_cpu(x, weight):
        return None
    span: list = []
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        y = _WellScaledLinearReflection.apply(x, weight, span)
    elif (kernels := row_kernels(x, weight)) is not None and not _is_dual(x) and not _is_dual(weight):
        x = x.contiguous()  # no graph to record and no tangent to carry: the C row pass, saving nothing
        y, _, _, lowest, highest = reflect_rows(kernels, x, torch.mm(x, weight.t()))
        span.extend((lowest, highest))
    else:  # no graph to record (inference, or a dual tensor of forward-mode AD): the plain ops suffice
        y, _, c, vv = _reflect(x, weight)
        span.extend(torch.aminmax(torch.add(vv, c, alpha=0.0)))
    low, high = _RANGES[x.dtype]
    # From the C kernels the span is already on the host; else two reads of CPU memory (cheaper than a stack).
    lowest, highest = span if isinstance(span[0], float) else (span[0].item(), span[1].item())
    if lowest >= low and highest <= high:  # False for NaN
        return y
    return None
