"""``y = C (T x) + b``: a fast product followed by a sparse matrix, the layer :func:`compress_linear` builds, and how
a model holding such layers loads a ``state_dict`` of another structure: compressed layers into a model built with
the dense ones, and dense layers (a state saved before compression) into a compressed model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from lightning_ortho.transforms._codes import register_sparse_codes
from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.blocks import BinaryBlockProduct, BlockProduct, frozen_transform
from lightning_ortho.transforms.costs import OpCount, row_cost
from lightning_ortho.transforms.factorized_conv import FactorizedConv, is_conv_marker

#: ``format`` of the extra state every FactorizedLinear puts in its ``state_dict`` (key ``<name>._extra_state``): it
#: marks the compressed submodules of a checkpoint, so a model built with dense layers can rebuild them.
STATE_FORMAT = "lightning_ortho.FactorizedLinear"


class FactorizedLinear(nn.Module):
    """``y = C (T x) + b``: a fast product ``T`` (``T = D^T`` for a learned dictionary ``D``), then sparse codes.

    Args:
        transform: the :class:`BlockProduct` ``T`` applied to the inputs (copied, non-trainable; use
            :meth:`from_dictionary` to pass ``D`` instead).
        codes: ``(out, n)`` code matrix ``C``; entries outside ``mask`` are set to zero.
        bias: ``(out,)`` or ``None``.
        mask: ``(out, n)`` bool support of ``C`` (default: ``codes != 0``), the buffer ``mask``.

    Fine-tuning: ``codes`` (dense ``(out, n)``, zero off the support) and ``bias`` are the only parameters. The
    forward pass uses ``codes.masked_fill(~mask, 0)``, so gradients outside the support are exactly zero and
    whatever an optimizer writes there (momentum, weight decay) never reaches the output: only the support is
    trained. The product is one dense ``F.linear`` (fast on every device); :meth:`op_count` reports the cost
    of the sparse product instead.

    Attributes:
        error: ``100 ||W - C T||^2 / ||W||^2`` of the layer it replaced (percent; ``nan`` when not known).
        report: the :class:`CompressionReport` of :func:`compress_linear` (``None`` otherwise).

    State: ``codes``, ``mask``, ``bias``, the transform's ``pairs`` and ``blocks`` (``core_index`` for binary
    cores) and an extra state ``{"format": STATE_FORMAT, "in_features", "out_features", "binary"}`` that marks the
    module as compressed; :func:`restore_factorized` rebuilds such modules in a model before it loads the state.

    Shapes: ``forward(x)``: ``(..., n) -> (..., out)``.

    Raises:
        TypeError: ``transform`` is not a BlockProduct, ``codes`` not floating point, ``mask`` not bool.
        ValueError: shapes disagree, or ``codes``/``bias`` hold NaN or inf.
    """

    # Registered by register_sparse_codes (shared with FactorizedConv); declared here so that readers of the class,
    # and tools that read it without running it, see them.
    codes: nn.Parameter
    bias: nn.Parameter | None
    mask: torch.Tensor

    def __init__(
        self,
        transform: BlockProduct,
        codes: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.transform = frozen_transform(transform)
        n = self.transform.n
        if not isinstance(codes, torch.Tensor) or not codes.is_floating_point():
            raise TypeError(
                f"FactorizedLinear: codes must be a floating-point (out, n) tensor, got {not_floating(codes)}."
            )
        if codes.dim() != 2 or codes.shape[1] != n:
            raise ValueError(f"FactorizedLinear: codes must have shape (out, {n}), got {tuple(codes.shape)}.")
        register_sparse_codes(self, codes, bias, mask, "FactorizedLinear")
        self.transform.to(device=self.codes.device, dtype=self.codes.dtype)
        self.in_features, self.out_features = n, codes.shape[0]
        self.error = math.nan
        self.report: Any = None  # the CompressionReport of compress_linear, when it built this layer
        self.register_load_state_dict_pre_hook(_accept_state_without_marker)

    def get_extra_state(self) -> dict[str, Any]:
        """The marker of a compressed module in a ``state_dict`` (plain Python values)."""
        binary = isinstance(self.transform, BinaryBlockProduct)
        return {
            "format": STATE_FORMAT,
            "in_features": self.in_features,
            "out_features": self.out_features,
            "binary": binary,
        }

    def set_extra_state(self, state: Any) -> None:
        """Checks the marker against this module (the tensors themselves are checked by ``load_state_dict``).

        Raises:
            ValueError: the state is not a FactorizedLinear marker or is one of another shape.
        """
        expected = self.get_extra_state()
        if not _is_marker(state) or any(state.get(k) != expected[k] for k in ("in_features", "out_features")):
            raise ValueError(
                f"FactorizedLinear.load_state_dict: the state is of {state!r}, this module is {expected!r}; rebuild "
                f"the module from the state with FactorizedLinear.from_state_dict or restore_factorized."
            )

    @classmethod
    def from_dictionary(
        cls, dictionary: BlockProduct, codes: torch.Tensor, bias: torch.Tensor | None = None, *, mask=None
    ) -> FactorizedLinear:
        """``y = C (D^T x) + b`` from a learner's dictionary ``D`` (``Y ~ codes @ D^T``); ``T = D.transpose()``."""
        return cls(dictionary.transpose(), codes, bias, mask=mask)

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], prefix: str = "") -> FactorizedLinear:
        """Rebuild a module from its ``state_dict()`` (keys under ``prefix``); outputs are reproduced exactly.

        Raises:
            KeyError: a required key (``codes``, ``mask``, ``transform.pairs``, ``transform.blocks``) is missing.
        """
        sub = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        missing = [k for k in ("codes", "mask", "transform.pairs", "transform.blocks") if k not in sub]
        if missing:
            raise KeyError(f"FactorizedLinear.from_state_dict: missing {[prefix + k for k in missing]}.")
        codes, blocks, pairs = sub["codes"], sub["transform.blocks"], sub["transform.pairs"].cpu()
        n = codes.shape[1]
        if "transform.core_index" in sub:
            transform = BinaryBlockProduct(n, pairs, sub["transform.core_index"].cpu(), dtype=blocks.dtype)
        else:
            transform = BlockProduct(n, pairs, blocks.cpu(), trainable=False)
        module = cls(transform.to(codes.device), codes, sub.get("bias"), mask=sub["mask"].bool())
        module.load_state_dict(sub, strict=True)
        return module

    def sparse_codes(self) -> torch.Tensor:
        """``(out, n)`` codes with the support enforced (differentiable in ``codes``)."""
        return self.codes.masked_fill(~self.mask, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``C (T x) + b`` for each row: ``(..., n) -> (..., out)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor (as :meth:`BlockProduct.forward`).
            ValueError: ``x`` is not ``(..., n)``, or holds NaN/inf.
        """
        return functional.linear(self.transform(x).to(x.dtype), self.sparse_codes(), self.bias)

    def dense_weight(self) -> torch.Tensor:
        """The ``(out, n)`` matrix ``C T`` the layer applies (differentiable in ``codes``)."""
        return self.sparse_codes() @ self.transform.matrix().to(self.codes.dtype)

    def relative_error(self, weight: torch.Tensor) -> float:
        """``100 ||W - C T||_F^2 / ||W||_F^2`` in percent for a dense ``(out, n)`` weight ``W`` (float64)."""
        weight = weight.detach().double()
        residual = weight - self.dense_weight().detach().double().to(weight.device)
        return float(100 * residual.square().sum() / weight.square().sum())

    @property
    def nnz(self) -> int:
        """Size of the support (``mask.sum()``)."""
        return int(self.mask.sum())

    def codes_op_count(self) -> OpCount:
        """Cost of ``C t``, row by row with :func:`~lightning_ortho.transforms.costs.row_cost`: a row with ``k``
        nonzero codes costs ``k - 1`` additions and one multiplication per nonzero (``+-1`` free, powers of two a
        shift); for generic real codes that is ``nnz`` multiplications and ``nnz - (nonempty rows)`` additions.
        Support entries that are exactly zero cost nothing. The bias is not counted (nor in :meth:`dense_op_count`)."""
        total = OpCount()
        for row in self.sparse_codes().detach().double().cpu().tolist():
            total = total + row_cost(row)
        return total

    def transform_op_count(self, terms: int | None = None, *, defer_scaling: bool = False) -> OpCount:
        """Cost of ``T x``: :meth:`BlockProduct.op_count` (``terms`` for SOPOT cores, ``defer_scaling`` for binary
        cores, see :meth:`BinaryBlockProduct.op_count`).

        Raises:
            ValueError: ``terms`` is given and a core entry is not a sum of at most ``terms`` signed powers of two.
        """
        if isinstance(self.transform, BinaryBlockProduct):
            return self.transform.op_count(defer_scaling=defer_scaling)
        return self.transform.op_count(terms)

    def op_count(self, terms: int | None = None, *, defer_scaling: bool = False) -> OpCount:
        """Operations of one ``C (T x)``: :meth:`transform_op_count` plus :meth:`codes_op_count`."""
        return self.transform_op_count(terms, defer_scaling=defer_scaling) + self.codes_op_count()

    def dense_op_count(self) -> OpCount:
        """Operations of the dense ``W x`` it replaces: ``out * in`` multiplications, ``out * (in - 1)`` additions."""
        return OpCount(
            additions=self.out_features * (self.in_features - 1), multiplications=self.out_features * self.in_features
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nnz={self.nnz}, bias={self.bias is not None}"


def _is_marker(state: object) -> bool:
    return isinstance(state, Mapping) and state.get("format") == STATE_FORMAT


def _accept_state_without_marker(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load-state pre-hook: a state saved before FactorizedLinear had its marker loads as if it had it."""
    state_dict.setdefault(f"{prefix}_extra_state", module.get_extra_state())


#: The compressed layers a state may hold, the kinds :func:`restore_factorized` rebuilds.
FACTORIZED_LAYERS = (FactorizedLinear, FactorizedConv)


def factorized_names(state_dict: Mapping[str, Any]) -> list[str]:
    """Names of the FactorizedLinear and FactorizedConv submodules whose state ``state_dict`` holds: those with a
    marker (``<name>._extra_state``), and FactorizedLinear states older than the marker recognised by their keys
    (``<name>.codes``, ``<name>.mask``, ``<name>.transform.pairs``). The root itself (name ``""``) is never listed."""
    names = [
        k[: -len("._extra_state")]
        for k, v in state_dict.items()
        if k.endswith("._extra_state") and (_is_marker(v) or is_conv_marker(v))
    ]
    legacy = [k[: -len(".transform.pairs")] for k in state_dict if k.endswith(".transform.pairs")]
    names += [n for n in legacy if n not in names and f"{n}.codes" in state_dict and f"{n}.mask" in state_dict]
    return names


def _same_layout(module: nn.Module, state: Mapping[str, Any]) -> bool:
    """Whether ``module`` is a compressed layer of the state's kind that can load ``state`` as it is (same keys and
    shapes)."""
    kind = FactorizedConv if is_conv_marker(state.get("_extra_state")) else FactorizedLinear
    if not isinstance(module, kind):
        return False
    own = {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
    given = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return own.keys() == given.keys() and all(own[k].shape == given[k].shape for k in own)


def keep_training_state(new: nn.Module, old: nn.Module) -> nn.Module:
    """Give ``new``, which replaces ``old`` in a model, ``old``'s mode and which of its parameters train.

    ``new.train(old.training)``; ``new.bias`` trains iff ``old.bias`` does, and every other trainable parameter of
    ``new`` (``codes`` of a FactorizedLinear, ``weight`` of an ``nn.Linear``) is frozen when none of ``old``'s
    non-bias parameters requires a gradient (a layer the user froze stays frozen). Returns ``new``.
    """
    weights = [p for name, p in old.named_parameters() if name != "bias"]
    weights_train = any(p.requires_grad for p in weights) if weights else True
    old_bias = getattr(old, "bias", None)
    bias_train = old_bias.requires_grad if isinstance(old_bias, nn.Parameter) else weights_train
    for name, parameter in new.named_parameters():
        if not (bias_train if name == "bias" else weights_train):
            parameter.requires_grad_(False)
    return new.train(old.training)


def _dense_layer(name: str, old: nn.Module, state: Mapping[str, Any]) -> nn.Module:
    """The ``nn.Linear`` (or ``nn.Conv1d``/``nn.Conv2d`` for a FactorizedConv) that the dense ``state`` (keys
    ``weight``, optional ``bias``) of ``name`` loads into, on ``old``'s device and dtype, not initialised (the state
    overwrites it).

    Raises:
        RuntimeError: ``state`` is not that of a dense layer of ``old``'s shape.
    """
    if isinstance(old, FactorizedConv):
        shape, kind = (old.out_channels, old.in_channels, *old.kernel_size), f"nn.Conv{old.dims}d"
    else:
        shape, kind = (old.out_features, old.in_features), "nn.Linear"
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    weight = tensors.get("weight")
    if set(tensors) - {"weight", "bias"} or weight is None or tuple(weight.shape) != shape:
        described = {k: tuple(v.shape) for k, v in tensors.items()}
        raise RuntimeError(
            f"restore_factorized: the model holds {name!r} compressed (a {type(old).__name__}, weight {shape}), the "
            f"state holds it dense as {described}, which is not the state of an {kind} of that shape; only {kind} "
            f"layers are rebuilt. Load the state into a freshly built model instead."
        )
    if isinstance(old, FactorizedConv):
        dense = old.dense_replacement()
        if "bias" not in tensors and dense.bias is not None:
            dense.bias = None
        elif "bias" in tensors and dense.bias is None:
            dense.bias = nn.Parameter(torch.empty(old.out_channels, device=old.codes.device, dtype=old.codes.dtype))
        return keep_training_state(dense, old)
    bias = "bias" in tensors
    linear = nn.utils.skip_init(
        nn.Linear, old.in_features, old.out_features, bias=bias, device=old.codes.device, dtype=old.codes.dtype
    )
    return keep_training_state(linear, old)


def restore_factorized(model: nn.Module, state_dict: Mapping[str, Any]) -> list[str]:
    """Before ``model.load_state_dict(state_dict)``: give each layer of ``model`` the structure its state has.

    Both ways: the FactorizedLinear submodules that ``state_dict`` holds (:func:`factorized_names`) are rebuilt with
    :meth:`FactorizedLinear.from_state_dict` where the model has a dense layer (as built) or a FactorizedLinear of
    another layout; and where the model holds a FactorizedLinear that ``state_dict`` holds dense (``weight`` and
    optional ``bias``, e.g. a checkpoint saved before the model was compressed), it goes back to an ``nn.Linear`` of
    its ``in_features``, ``out_features`` and bias. Each new module takes the device, mode and ``requires_grad`` of
    the one it replaces (:func:`keep_training_state`). Submodules that can already load their state are kept; a
    FactorizedLinear with no key at all in ``state_dict`` is left as it is.

    Args:
        model: the model about to load ``state_dict``; its layers are replaced in place.
        state_dict: the state it will load.

    Returns:
        The names of the replaced submodules.

    Raises:
        KeyError: ``model`` has no submodule of such a name, or the state of one is incomplete.
        RuntimeError: a FactorizedLinear of the model is held dense in ``state_dict`` by a module other than an
            ``nn.Linear`` of its shape.
    """
    replaced = []
    compressed = factorized_names(state_dict)
    for name in compressed:
        parent_name, _, child = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name)
            old = parent.get_submodule(child)
        except AttributeError as error:
            raise KeyError(f"restore_factorized: the model has no submodule {name!r} for its state.") from error
        prefix = f"{name}."
        if _same_layout(old, {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}):
            continue
        kind = FactorizedConv if is_conv_marker(state_dict.get(f"{prefix}_extra_state")) else FactorizedLinear
        new = kind.from_state_dict(state_dict, prefix=prefix)
        reference = next(iter(old.parameters()), None)
        new = new.to(reference.device) if reference is not None else new
        setattr(parent, child, keep_training_state(new, old))
        replaced.append(name)
    dense = [
        (name, module)
        for name, module in model.named_modules()
        if name and isinstance(module, FACTORIZED_LAYERS) and name not in compressed
    ]
    for name, old in dense:
        prefix = f"{name}."
        state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not state:
            continue  # a partial state (strict=False) that says nothing about this layer
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, _dense_layer(name, old, state))
        replaced.append(name)
    return replaced


def _restore_before_load(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    restore_factorized(module, {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)})


def restore_factorized_on_load(model: nn.Module) -> nn.Module:
    """Make every later ``model.load_state_dict(state)`` call :func:`restore_factorized` first (a load-state
    pre-hook, kept by ``copy.deepcopy`` and pickling), so a state with compressed layers loads into ``model`` as
    built. Idempotent; returns ``model``."""
    if not getattr(model, "_restores_factorized", False):
        model.register_load_state_dict_pre_hook(_restore_before_load)
        model._restores_factorized = True
    return model
