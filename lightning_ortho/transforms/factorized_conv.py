"""``y = conv(T x, C) + b``: a fast transform over the input channels at every position, then a convolution with a
sparse kernel, the layer :func:`~lightning_ortho.transforms.conv_compression.compress_conv` builds from a trained
``Conv1d`` or ``Conv2d``.

Why this form. A convolution's kernel ``W`` ``(out, in, *k)`` applies, at each kernel offset ``j``, the matrix
``W[:, :, j]`` ``(out, in)`` to the input's channels at the offset position. Learning ``W[o, :, j] ~ C[o, :, j] D^T``
for every output channel ``o`` and offset ``j`` (the rows of the ``(out * prod(k), in)`` matrix, one dictionary
``D`` ``(in, in)`` for all of them) gives

    conv(x, W) = conv(D^T x, C),

since ``D^T`` acts on channels pixel by pixel and commutes with the padding (zero, reflected, replicated or circular:
all move whole pixels). On the patch matrix ``(out, in * prod(k))`` of the kernel this is ``W ~ C (D^T kron I)``: a
fast transform of the patch space that acts on channels. The transform runs once per input pixel and is shared by
every output channel and every kernel offset; the codes hold ``s`` nonzeros per (output channel, offset) row.

Cost model (per image, bias excluded, counted as :mod:`~lightning_ortho.transforms.costs` counts): the transform's
operations times the input pixels, plus, per output position, each output channel's row of nonzero codes
(``nnz - 1`` additions and its multipliers); the dense convolution costs ``out * in * prod(k)`` multiplications and
``out * (in * prod(k) - 1)`` additions per output position. Both depend on the input's spatial size, which the
layer records when it is compressed (:attr:`FactorizedConv.input_size`). What PyTorch runs is that: the block
product on the channels, then one convolution whose kernel is the masked codes (dense kernels with zeros; a sparse
convolution would skip them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from lightning_ortho.transforms._codes import register_sparse_codes
from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.blocks import BinaryBlockProduct, BlockProduct, frozen_transform
from lightning_ortho.transforms.costs import OpCount, row_cost

#: ``format`` of the extra state every FactorizedConv puts in its ``state_dict``: it marks the compressed
#: convolutions of a checkpoint, so a model built with dense ones can rebuild them.
CONV_STATE_FORMAT = "lightning_ortho.FactorizedConv"
_CONVOLUTIONS = {1: functional.conv1d, 2: functional.conv2d}


class FactorizedConv(nn.Module):
    """``y = conv(T x, C) + b``: the fast transform ``T = D^T`` on the input channels, then a convolution with the
    sparse kernel ``C`` (see the module docstring).

    Args:
        transform: the :class:`BlockProduct` ``T`` over ``in_channels`` (copied, non-trainable).
        codes: ``(out, in, *kernel_size)`` kernel ``C`` (1 or 2 spatial dims); entries outside ``mask`` are zero.
        bias: ``(out,)`` or ``None``.
        mask: the bool support of ``codes`` (default ``codes != 0``), the buffer ``mask``.
        stride: the stride of the convolution replaced (an int or one per spatial dim).
        padding: its padding (ints, or ``"same"``/``"valid"``).
        dilation: its dilation.
        padding_mode: its padding mode (``"zeros"``, ``"reflect"``, ``"replicate"``, ``"circular"``); ``groups``
            is 1.
        input_size: the spatial size of the inputs the op counts assume (``None``: not known yet; then
            :meth:`op_count` needs it).

    Fine-tuning: ``codes`` and ``bias`` are the parameters; the forward pass uses ``codes.masked_fill(~mask, 0)``, so
    only the support trains (as :class:`~lightning_ortho.transforms.FactorizedLinear`).

    Shapes: ``forward(x)``: ``(N, in, *spatial) -> (N, out, *spatial_out)`` or unbatched ``(in, *spatial)``.

    Raises:
        TypeError: ``transform`` is not a BlockProduct, ``codes`` not floating point, ``mask`` not bool.
        ValueError: shapes disagree (the transform's ``n`` is not ``in``), 0 or 3+ spatial dims, NaN or inf.
    """

    def __init__(
        self,
        transform: BlockProduct,
        codes: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        stride: Sequence[int] | int = 1,
        padding: Sequence[int] | int | str = 0,
        dilation: Sequence[int] | int = 1,
        padding_mode: str = "zeros",
        input_size: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.transform = frozen_transform(transform)
        if not isinstance(codes, torch.Tensor) or not codes.is_floating_point():
            raise TypeError(f"FactorizedConv: codes must be a floating-point kernel, got {not_floating(codes)}.")
        dims = codes.dim() - 2
        if dims not in _CONVOLUTIONS or codes.shape[1] != self.transform.n:
            raise ValueError(
                f"FactorizedConv: codes must be (out, {self.transform.n}, *kernel_size) with 1 or 2 spatial dims, "
                f"got {tuple(codes.shape)}."
            )
        register_sparse_codes(self, codes, bias, mask, "FactorizedConv")
        self.transform.to(device=self.codes.device, dtype=self.codes.dtype)
        self.dims = dims
        self.in_channels, self.out_channels = codes.shape[1], codes.shape[0]
        self.kernel_size = tuple(codes.shape[2:])
        self.stride = _tuple(stride, dims)
        self.padding = padding if isinstance(padding, str) else _tuple(padding, dims)
        self.dilation = _tuple(dilation, dims)
        self.padding_mode = padding_mode
        self.input_size = None if input_size is None else _tuple(input_size, dims)
        self.error = math.nan
        self.report: Any = None

    # ------------------------------------------------------------------------------------------------ state
    def get_extra_state(self) -> dict[str, Any]:
        """The marker of a compressed convolution in a ``state_dict``, with its configuration (plain values)."""
        return {
            "format": CONV_STATE_FORMAT,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "kernel_size": list(self.kernel_size),
            "stride": list(self.stride),
            "padding": self.padding if isinstance(self.padding, str) else list(self.padding),
            "dilation": list(self.dilation),
            "padding_mode": self.padding_mode,
            "input_size": None if self.input_size is None else list(self.input_size),
            "binary": isinstance(self.transform, BinaryBlockProduct),
        }

    def set_extra_state(self, state: Any) -> None:
        """Checks the marker against this module and takes its ``input_size``.

        Raises:
            ValueError: not a FactorizedConv marker, or one of another shape.
        """
        expected = self.get_extra_state()
        keys = ("in_channels", "out_channels", "kernel_size")
        if not is_conv_marker(state) or any(list(state.get(k) or []) != list(expected[k] or []) for k in keys[2:]):
            raise ValueError(
                f"FactorizedConv.load_state_dict: the state is of {state!r}, this module is {expected!r}; rebuild "
                "the module from the state with FactorizedConv.from_state_dict or restore_factorized."
            )
        if any(state.get(k) != expected[k] for k in keys[:2]):
            raise ValueError(f"FactorizedConv.load_state_dict: channels differ: {state!r} against {expected!r}.")
        self.input_size = None if state.get("input_size") is None else tuple(state["input_size"])

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Any], prefix: str = "") -> FactorizedConv:
        """Rebuild a module from its ``state_dict()`` (keys under ``prefix``); outputs are reproduced exactly.

        Raises:
            KeyError: a required key is missing.
        """
        sub = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        required = ("codes", "mask", "transform.pairs", "transform.blocks", "_extra_state")
        missing = [k for k in required if k not in sub]
        if missing:
            raise KeyError(f"FactorizedConv.from_state_dict: missing {[prefix + k for k in missing]}.")
        codes, blocks, pairs, config = (
            sub["codes"],
            sub["transform.blocks"],
            sub["transform.pairs"].cpu(),
            sub["_extra_state"],
        )
        n = codes.shape[1]
        if "transform.core_index" in sub:
            transform = BinaryBlockProduct(n, pairs, sub["transform.core_index"].cpu(), dtype=blocks.dtype)
        else:
            transform = BlockProduct(n, pairs, blocks.cpu(), trainable=False)
        module = cls(
            transform.to(codes.device),
            codes,
            sub.get("bias"),
            mask=sub["mask"].bool(),
            stride=config["stride"],
            padding=config["padding"],
            dilation=config["dilation"],
            padding_mode=config["padding_mode"],
            input_size=config.get("input_size"),
        )
        module.load_state_dict(sub, strict=True)
        return module

    def dense_replacement(self) -> nn.Module:
        """An ``nn.Conv1d``/``nn.Conv2d`` of this layer's configuration, not initialised (for a dense state)."""
        cls = nn.Conv1d if self.dims == 1 else nn.Conv2d
        return nn.utils.skip_init(
            cls,
            self.in_channels,
            self.out_channels,
            self.kernel_size,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            bias=self.bias is not None,
            padding_mode=self.padding_mode,
            device=self.codes.device,
            dtype=self.codes.dtype,
        )

    # ------------------------------------------------------------------------------------------------ forward
    def sparse_codes(self) -> torch.Tensor:
        """The kernel ``C`` with the support enforced (differentiable in ``codes``)."""
        return self.codes.masked_fill(~self.mask, 0)

    def transform_channels(self, x: torch.Tensor) -> torch.Tensor:
        """``T`` applied to the channels of ``x`` ``(N, in, *spatial)`` at every position."""
        return self.transform(x.movedim(1, -1)).movedim(-1, 1).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``conv(T x, C) + b``.

        Raises:
            ValueError: ``x`` is not ``(N, in, *spatial)`` or ``(in, *spatial)``, or holds NaN/inf.
            TypeError: ``x`` is not floating point.
        """
        if x.dim() not in (self.dims + 1, self.dims + 2) or x.shape[-self.dims - 1] != self.in_channels:
            raise ValueError(
                f"FactorizedConv: expected an input (N, {self.in_channels}, *spatial) with {self.dims} spatial dims, "
                f"got {tuple(x.shape)}."
            )
        unbatched = x.dim() == self.dims + 1
        x = x.unsqueeze(0) if unbatched else x
        t = self.transform_channels(x)
        convolution = _CONVOLUTIONS[self.dims]
        if self.padding_mode != "zeros":
            t = functional.pad(t, self.reversed_padding(), mode=self.padding_mode)
            y = convolution(t, self.sparse_codes(), self.bias, self.stride, 0, self.dilation)
        else:
            y = convolution(t, self.sparse_codes(), self.bias, self.stride, self.padding, self.dilation)
        return y.squeeze(0) if unbatched else y

    def reversed_padding(self) -> list[int]:
        """The padding as ``F.pad`` takes it (last dim first, both sides), for a non-zero ``padding_mode``."""
        if isinstance(self.padding, str):
            if self.padding == "valid":
                return [0] * (2 * self.dims)
            pads = []
            for d, k in zip(reversed(self.dilation), reversed(self.kernel_size), strict=True):
                total = d * (k - 1)
                pads += [total // 2, total - total // 2]
            return pads
        return [p for p in reversed(self.padding) for _ in range(2)]

    def dense_kernel(self) -> torch.Tensor:
        """The dense kernel ``(out, in, *k)`` of the convolution the layer applies: ``W[:, :, j] = C[:, :, j] D^T``."""
        codes = self.sparse_codes().movedim(1, -1)  # (out, *k, in)
        return (codes @ self.transform.matrix().to(codes.dtype)).movedim(-1, 1)

    def relative_error(self, kernel: torch.Tensor) -> float:
        """``100 ||W - W_approx||_F^2 / ||W||_F^2`` (percent) against a dense kernel ``W`` (float64)."""
        kernel = kernel.detach().double()
        residual = kernel - self.dense_kernel().detach().double().to(kernel.device)
        return float(100 * residual.square().sum() / kernel.square().sum())

    # ------------------------------------------------------------------------------------------------ costs
    def output_size(self, input_size: Sequence[int] | None = None) -> tuple[int, ...]:
        """The spatial size of the output for inputs of ``input_size`` (default: :attr:`input_size`).

        Raises:
            ValueError: no input size given or recorded.
        """
        size = self._input_size(input_size)
        return convolution_output_size(size, self.kernel_size, self.stride, self.padding, self.dilation)

    def _input_size(self, input_size: Sequence[int] | None) -> tuple[int, ...]:
        size = input_size if input_size is not None else self.input_size
        if size is None:
            raise ValueError(
                "FactorizedConv: the op count of a convolution depends on the input's spatial size; pass "
                "input_size=(H, W) (or compress with data, which records it)."
            )
        return _tuple(size, self.dims)

    def transform_op_count(self, terms: int | None = None, *, defer_scaling: bool = False) -> OpCount:
        """Operations of ``T`` on one pixel's channels (:meth:`BlockProduct.op_count`)."""
        if isinstance(self.transform, BinaryBlockProduct):
            return self.transform.op_count(defer_scaling=defer_scaling)
        return self.transform.op_count(terms)

    def codes_op_count(self) -> OpCount:
        """Operations of the sparse kernel at one output position: each output channel's nonzero codes summed
        (:func:`~lightning_ortho.transforms.costs.row_cost` of the channel's whole kernel)."""
        total = OpCount()
        for row in self.sparse_codes().detach().double().cpu().flatten(1).tolist():
            total = total + row_cost(row)
        return total

    def op_count(
        self, input_size: Sequence[int] | None = None, terms: int | None = None, *, defer_scaling: bool = False
    ) -> OpCount:
        """Operations per image: :meth:`transform_op_count` times the input pixels plus :meth:`codes_op_count`
        times the output positions (bias excluded)."""
        size = self._input_size(input_size)
        pixels, positions = math.prod(size), math.prod(self.output_size(size))
        return self.transform_op_count(terms, defer_scaling=defer_scaling) * pixels + self.codes_op_count() * positions

    def dense_op_count(self, input_size: Sequence[int] | None = None) -> OpCount:
        """Operations per image of the dense convolution it replaces: per output position ``out * in * prod(k)``
        multiplications and ``out * (in * prod(k) - 1)`` additions (bias excluded)."""
        positions = math.prod(self.output_size(input_size))
        fan_in = self.in_channels * math.prod(self.kernel_size)
        per_position = OpCount(additions=self.out_channels * (fan_in - 1), multiplications=self.out_channels * fan_in)
        return per_position * positions

    @property
    def nnz(self) -> int:
        """Size of the support (``mask.sum()``)."""
        return int(self.mask.sum())

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, nnz={self.nnz}, bias={self.bias is not None}"
        )


def convolution_output_size(
    input_size: Sequence[int],
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
) -> tuple[int, ...]:
    """The spatial size of a convolution's output (PyTorch's formula, ``padding`` as ints or ``"same"``/``"valid"``):
    ``(L + 2 p - d (k - 1) - 1) // s + 1`` per dim."""
    if isinstance(padding, str):
        if padding == "same":
            return tuple(input_size)
        padding = (0,) * len(input_size)
    return tuple(
        (length + 2 * p - d * (k - 1) - 1) // s + 1
        for length, p, d, k, s in zip(input_size, padding, dilation, kernel_size, stride, strict=True)
    )


def is_conv_marker(state: object) -> bool:
    """Whether ``state`` is the extra state of a :class:`FactorizedConv`."""
    return isinstance(state, Mapping) and state.get("format") == CONV_STATE_FORMAT


def _tuple(value: Sequence[int] | int, dims: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * dims
    value = tuple(int(v) for v in value)
    if len(value) != dims:
        raise ValueError(f"FactorizedConv: expected {dims} values, got {value}.")
    return value
