"""Compress a trained dense layer into "fast transform x sparse matrix" (Rusu, arXiv 1812.03412).

The rows of the layer's weight ``W`` ``(out, in)`` are the learner's data ``Y`` (``N = out`` samples of dimension
``n = in``), so a learned dictionary ``D`` ``(in, in)`` (a product of 2x2 or 4x4 blocks) and ``s``-sparse codes ``C``
``(out, in)`` give ``W ~ C D^T`` and

    y = W x + b  ~  C (D^T x) + b:

first the fast product ``D^T`` (``O(m)`` operations), then a sparse matrix with ``s`` nonzeros per row.

What is approximated: ``W`` in the Frobenius norm, ``error = 100 ||W - C D^T||_F^2 / ||W||_F^2`` (percent), the
learners' own objective. It bounds the output error for every input, ``||(W - C D^T) x|| <= ||W - C D^T||_2 ||x||
<= ||W - C D^T||_F ||x||``, so it needs no data. With ``data`` (inputs of the layer) the support and the transform
still come from the Frobenius fit, and then the nonzero values of ``C`` and the bias are refit by least squares on
the layer's outputs over those inputs (:func:`~lightning_ortho.transforms.data_refit.refit_on_data`: one small
``s x s`` system per output row; where the inputs do not determine it, e.g. fewer than ``s + 1`` distinct rows, only
the determined directions move, with a warning; with fewer than ``2 (s + 1)`` rows, two per unknown of a row, the
refit nearly interpolates them and a warning says that ``report.output_error`` is in-sample). A transform learned
on whitened data would not be a fast transform of ``x`` any more, so the data only moves the code values.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from rich.console import Console
from torch import nn

from lightning_ortho.nn.eval_mode import eval_mode
from lightning_ortho.transforms._kinds import not_floating
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.data_refit import refit_on_data, refit_warning, relative_square_error
from lightning_ortho.transforms.factorized_linear import (  # noqa: F401 - restore_factorized: its old home
    FactorizedLinear,
    restore_factorized,
    restore_factorized_on_load,
)
from lightning_ortho.transforms.families import (  # noqa: F401 - FAMILIES: also read from here
    FAMILIES,
    family_spec,
    features_suiting,
    transform_op_count,
    unused_hyperparameter,
)
from lightning_ortho.transforms.progress import (  # noqa: F401 - plan_work, planned_steps: also read from here
    WorkProgress,
    estimate_reporter,
    plan_work,
    planned_steps,
    show_progress,
)

logger = logging.getLogger(__name__)


class NotAffineError(ValueError):
    """The module is not an affine map ``x -> W x + b``, so it has no dense weight to compress."""


@dataclass
class CompressionReport:
    """What :func:`compress_linear` did to one layer (op counts exclude the bias, see :class:`FactorizedLinear`), or
    :func:`~lightning_ortho.transforms.conv_compression.compress_conv` to a convolution (``in_features``,
    ``out_features``: its channels; op counts per image of ``input_size``, or per output position where it is
    ``None``; ``data_rows``: the patches refit on).

    With ``data``: ``output_error`` is ``100 ||f(X) - g(X)||^2 / ||f(X)||^2`` on the ``data_rows`` inputs the codes
    were refit on, an in-sample figure (with fewer than ``2 (s + 1)`` rows the refit nearly interpolates them and it
    says nothing about other inputs: :func:`compress_linear` warns then); ``data_rank`` is the rank of the centred
    inputs and ``support_rank`` the smallest rank they have on one output row's support (below ``s``: some rows are
    not determined by the data, also warned). All four are ``None`` without data.
    """

    family: str
    in_features: int
    out_features: int
    s: int
    blocks: int
    stages: int | None
    bits: int | None
    error: float
    output_error: float | None
    data_rank: int | None
    dense_ops: OpCount
    factorized_ops: OpCount
    transform_ops: OpCount
    code_ops: OpCount
    learner_errors: list[float] = field(default_factory=list)
    seconds: float = 0.0
    planned_steps: int = 0
    steps: int | None = None
    estimated_seconds: float | None = None
    support_rank: int | None = None
    data_rows: int | None = None
    input_size: tuple[int, ...] | None = None
    max_error: float | None = None
    searched: list[tuple[int, float]] = field(default_factory=list)

    @property
    def ops_ratio(self) -> float:
        """All operations (additions + multiplications + shifts) after over before."""
        total = lambda c: c.additions + c.multiplications + c.shifts  # noqa: E731
        return total(self.factorized_ops) / max(total(self.dense_ops), 1)

    def as_dict(self) -> dict[str, object]:
        """Flat dict of Python scalars (op counts as ``<name>_additions`` etc.), for logging and tables."""
        out: dict[str, object] = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                out.update({f"{key}_{k}": v for k, v in value.items()})
            elif key not in ("learner_errors", "searched"):
                out[key] = value
        out["ops_ratio"] = self.ops_ratio
        return out


def _first_tensor(module: nn.Module) -> torch.Tensor | None:
    tensor = next(iter(module.parameters()), None)
    return tensor if tensor is not None else next(iter(module.buffers()), None)


def affine_parts(
    module: nn.Module, *, in_features: int | None = None, probe: int = 8, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense ``(W, b)`` of an affine module ``x -> W x + b`` (detached, the module's dtype and device).

    ``nn.Linear``: its ``weight`` and ``bias``. Any other module (e.g. :class:`~lightning_ortho.nn.SVDLinear`) is
    applied, in eval mode and without gradients, to the identity: ``b = f(0)``, ``W^T = f(I) - f(0)``; then a
    random probe ``X`` ``(probe, in)`` checks ``f(X) = X W^T + b`` within ``1000 eps sqrt(in)`` (relative). ``b`` is
    ``None`` for an ``nn.Linear`` without bias or a module whose ``bias`` attribute is ``None``.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, or has no ``in_features`` and none was given.
        NotAffineError: the probe shows the module is not affine (e.g. ``SVDLinear(orthogonal="aux")``: auxiliary
            reflections are norm-preserving but not linear), or its output is not ``(k, out)``.
    """
    if isinstance(module, nn.Linear):
        return module.weight.detach(), None if module.bias is None else module.bias.detach()
    if not isinstance(module, nn.Module):
        raise TypeError(f"affine_parts: expected an nn.Module, got {type(module).__name__}.")
    n = in_features if in_features is not None else getattr(module, "in_features", None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise TypeError(
            f"affine_parts: {type(module).__name__} has no integer in_features attribute; pass in_features=... "
            f"(the size of the last input dimension)."
        )
    reference = _first_tensor(module)
    dtype = reference.dtype if reference is not None and reference.is_floating_point() else torch.get_default_dtype()
    device = reference.device if reference is not None else torch.device("cpu")
    # eval_mode gives each submodule its own mode back through its train(mode), so what eval() changed besides the
    # flag (a noise level, a frozen part) is undone too.
    with eval_mode(module), torch.no_grad():
        rows = torch.cat([torch.zeros(1, n), torch.eye(n), torch.randn(probe, n, generator=generator)])
        out = module(rows.to(device=device, dtype=dtype))
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != rows.shape[0]:
        raise NotAffineError(f"affine_parts: {type(module).__name__} must map (k, {n}) to (k, out).")
    bias = out[0]
    weight = (out[1 : n + 1] - bias).T
    x, y = rows[n + 1 :].to(out), out[n + 1 :]
    deviation = float((y - (x @ weight.T + bias)).abs().max())
    scale = float(y.abs().max().clamp_min(torch.finfo(out.dtype).tiny))
    tolerance = 1000 * torch.finfo(out.dtype).eps * math.sqrt(n)
    if not deviation <= tolerance * scale:
        raise NotAffineError(
            f"affine_parts: {type(module).__name__} is not affine: on a random probe f(x) differs from "
            f"W x + b (W, b read from f(I) - f(0), f(0)) by {deviation / scale:.2e} relative (tolerance "
            f"{tolerance:.1e}). Only affine layers can be compressed; SVDLinear with orthogonal='aux' is not linear, "
            f"use a linear map ('householder', 'cayley', ...) or compress the nn.Linear layers only."
        )
    if getattr(module, "bias", torch.zeros(())) is None:
        return weight, None
    return weight, bias


def default_hyperparameters(family: str, in_features: int, out_features: int) -> dict[str, int]:
    """The defaults of :func:`compress_linear` for an ``(out, in)`` layer, chosen so that the factorized count stays
    near a quarter of the dense ``2 out in`` operations (each part at most ~1/8):

    * ``s = max(1, in // 8)``: the codes cost about ``2 out s ~ 1/8`` of the dense count;
    * ``b``: ``m = clamp(out * in // 16, in // 2, 2 in)`` blocks (at most 4 operations each, so at most ~1/8 of
      the dense count; at least ``in / 2`` so every coordinate can be touched; at most ``2 in``, beyond which
      B_m-DLA gains little);
    * ``shear``: ``m = max(1, in // 2)`` (the paper's ``m = 32`` for ``n = 64``; S-DLA's sweeps grow fast with ``m``);
    * ``m``: ``q = max(1, min(ceil(log2 in), out // 4 - 1))`` stages (an FFT's depth; ``n q + n`` operations);
    * ``b4x4``: ``m = clamp(out * in // 64, in // 4, in)`` 4x4 blocks (16 operations each, so at most ~1/8 of the
      dense count; at least ``in / 4`` so every coordinate can be touched; at most ``in``, four blocks per
      coordinate, as ``2 in`` 2x2 blocks).

    The table of :mod:`~lightning_ortho.transforms.families` holds them (``defaults`` of each family).

    Args:
        family: ``"b"``, ``"m"``, ``"shear"`` or ``"b4x4"``.
        in_features: ``in``, the layer's input size.
        out_features: ``out``, the layer's output size.

    Raises:
        ValueError: an unknown family.
    """
    return family_spec(family, "default_hyperparameters").defaults(in_features, out_features)


def _check_int(value: object, name: str, low: int, high: int | None = None, hint: str = "") -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"compress_linear: {name} must be an int {bound}{hint}, got {value!r}.")


#: A compression estimated to take longer than this (seconds) warns, so a long wait is never a silent one.
SLOW_SECONDS = 60.0


def compress_linear(
    layer: nn.Module,
    family: str = "b",
    *,
    s: int | None = None,
    m: int | None = None,
    q: int | None = None,
    bits: int | None = None,
    iterations: int | None = None,
    generator: torch.Generator | None = None,
    data: torch.Tensor | None = None,
    in_features: int | None = None,
    progress: bool | None = None,
    console: Console | None = None,
    max_error: float | None = None,
) -> FactorizedLinear:
    """Replace an affine layer by ``C (D^T x) + b`` with ``W ~ C D^T`` (see the module docstring).

    Args:
        layer: ``nn.Linear``, :class:`~lightning_ortho.nn.SVDLinear` with linear maps, or any affine module with an
            ``in_features`` attribute (or pass ``in_features``); its ``(W, b)`` from :func:`affine_parts`.
        family: ``"b"`` (B_m-DLA, binary blocks), ``"m"`` (M_q-DLA, ``q`` perfect-matching stages; even ``in``),
            ``"shear"`` (S-DLA, shears and scalings; ``bits`` SOPOT terms per shear, ``None`` = full precision) or
            ``"b4x4"`` (B⊗_m-DLA, 4x4 Hadamard blocks; ``in >= 4``): the table
            :data:`~lightning_ortho.transforms.families.FAMILY_TABLE`.
        s: nonzeros per code row (``1 <= s <= in``); default from :func:`default_hyperparameters`.
        m: blocks (``b``, ``shear``, ``b4x4``); default from :func:`default_hyperparameters`.
        q: stages (``m``); default from :func:`default_hyperparameters`.
        bits: SOPOT terms per shear (``shear`` only); ``None``: full precision.
        iterations: sweeps of the learner (``b``: 10, ``shear``: 15, ``b4x4``: 1) or outer rounds (``m``: 1) when
            ``None``.
        generator: passed to the learner.
        data: optional ``(N, in)`` inputs of the layer for the data-aware refit,
            in any floating dtype (the stored values are the data; they are refit in float64);
            ``report.output_error`` is then ``100 ||f(X) - g(X)||^2 / ||f(X)||^2`` on them (in-sample), and
            ``report.data_rank`` / ``report.support_rank`` the rank of the centred inputs / its smallest value on one
            row's support (:class:`CompressionReport`).
        in_features: the layer's input size, for an affine module without an ``in_features`` attribute.
        progress: a rich progress bar of the learner's steps (:func:`planned_steps`: block choices of B and
            shears, stages of M): ``None`` (default) on an interactive terminal or notebook only,
            ``True`` always, ``False`` never.
            Before learning, the planned steps are logged (logger ``lightning_ortho.transforms.compression``, level
            INFO), then the estimated time (:class:`~lightning_ortho.transforms.progress.WorkProgress`: each kind of
            step and the passes over the data timed on their own; provisional once the first kind is timed, final
            once every kind is, for B and shears after the first sweep's re-picks; an upper bound for B, whose sweeps
            may stop early). ``report.planned_steps``, ``report.steps`` and ``report.estimated_seconds`` keep them.
        console: the rich ``Console`` to draw the progress bar on (default: standard error).
        max_error: a budget instead of ``s``: the relative error (percent) to meet at the fewest operations, the
            output error on ``data`` when given (``report.output_error``), else the weight's (``report.error``). The
            smallest ``s`` that meets it is searched (:func:`~lightning_ortho.transforms.sparsity_search.search_sparsity`:
            a binary search over ``1, 2, 3, 4, 6, 8, 12, ...``, one compression per step, with the same
            ``generator`` state each time); ``report.searched`` lists every ``s`` tried and its error.

    Returns:
        The compressed layer, a :class:`FactorizedLinear` in the layer's dtype and device, with ``error`` and
            ``report`` (:class:`CompressionReport`: errors, op counts before/after, learner errors, seconds). For
            ``"b4x4"`` its transform holds each 4x4 block as 4 to 6 2x2 blocks (the same matrix, exactly), and
            ``report.transform_ops`` counts what runs, that 2x2 form (the butterfly: 8 additions + 4 shifts per
            4x4 block, where the paper counts 12 additions + 4 shifts).

    Raises:
        ValueError: unknown family; ``s``/``m``/``q``/``bits``/``iterations`` out of range or given for a family that
            does not use them; odd ``in`` for ``"m"``, ``in < 4`` for ``"b4x4"``; ``in < 2``; NaN/inf or all-zero
            weights; bad ``data``.
        NotAffineError: the layer is not affine.
        TypeError: not a module, or no ``in_features``.
        ImportError: ``"shear"`` and the S-DLA learner is not installed.

    Warns:
        UserWarning: ``data`` does not determine the code values of some rows (centred rank below ``s`` on their
            support); those rows keep the no-data codes in the undetermined directions. ``data`` has fewer than
            ``2 (s + 1)`` rows (two per unknown of an output row): ``output_error`` is in-sample on too few rows
            (:data:`~lightning_ortho.transforms.data_refit.ROWS_PER_UNKNOWN`). The compressed layer costs more
            operations per sample than the dense one (``report.factorized_ops`` against ``report.dense_ops``, all
            operations counted: typical of a layer with one or a few outputs); it is returned all the same. Also,
            once, when the final time estimate exceeds ``SLOW_SECONDS`` (a minute), or earlier when the work that
            cannot be skipped (the rest of the current greedy init or sweep) already does.
    """
    if max_error is not None:
        if s is not None:
            raise ValueError("compress_linear: give s (nonzeros per code row) or max_error (a budget), not both.")
        options = {"m": m, "q": q, "bits": bits, "iterations": iterations, "data": data, "in_features": in_features}
        options.update(progress=progress, console=console)
        return _compress_to_error(compress_linear, layer, family, max_error, generator, options)
    start = time.perf_counter()
    spec = family_spec(family, "compress_linear")
    weight, bias = affine_parts(layer, in_features=in_features, generator=generator)
    out, n = weight.shape
    name = type(layer).__name__
    if not bool(torch.isfinite(weight).all()) or (bias is not None and not bool(torch.isfinite(bias).all())):
        raise ValueError(f"compress_linear: the {name}'s weight or bias holds NaN or inf; fix the training first.")
    if not bool((weight != 0).any()):
        raise ValueError(f"compress_linear: the {name}'s weight is all zeros; there is nothing to compress.")
    if n < 2:  # every family's blocks act on pairs of coordinates
        raise ValueError(
            f"compress_linear: every family needs in_features >= 2 (its transforms are products of 2x2 blocks on "
            f"pairs of inputs), got {n}; a layer with one input is already one multiplication per output: keep it "
            f"dense (leave it out of the layers to compress)."
        )
    problem = spec.feature_problem(n)
    if problem is not None:
        names = [repr(name) for name in features_suiting(n)]
        others = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise ValueError(f"compress_linear: family={family!r} {problem}, got {n}; use family={others}.")
    message = unused_hyperparameter(spec, {"m": m, "q": q, "bits": bits}, "compress_linear")
    if message is not None:
        raise ValueError(message)
    defaults = spec.defaults(n, out)
    s = defaults["s"] if s is None else s
    _check_int(s, "s", 1, n, " (nonzeros per code row, at most in_features)")
    if "m" in spec.takes:
        m = defaults["m"] if m is None else m
        _check_int(m, "m", 1, hint=" (number of blocks)")
    if "q" in spec.takes:
        q = defaults["q"] if q is None else q
        _check_int(q, "q", 1, hint=" (number of stages)")
    if bits is not None:
        _check_int(bits, "bits", 1, hint=" (SOPOT terms per shear) or None")
    if iterations is not None:
        _check_int(iterations, "iterations", 1)
    if data is not None:
        if not isinstance(data, torch.Tensor) or not data.is_floating_point():
            raise ValueError(
                f"compress_linear: data must be a floating (N, {n}) tensor of layer inputs, got {not_floating(data)}."
            )
        if data.dim() != 2 or data.shape[1] != n:
            raise ValueError(
                f"compress_linear: data must be a floating (N, {n}) tensor of layer inputs, got shape "
                f"{tuple(data.shape)}."
            )
        if data.shape[0] < 1 or not bool(torch.isfinite(data).all()):
            raise ValueError("compress_linear: data must hold at least one row and no NaN/inf.")

    w64 = weight.double().cpu()
    b64 = None if bias is None else bias.double().cpu()
    shape = f"{out}x{n}"
    settings = {"m": m, "q": q, "s": s, "bits": bits, "iterations": iterations, "generator": generator}
    learning = learn_factorization(w64, spec, settings, shape, progress=progress, console=console)
    learned, dictionary, codes, mask, support = (
        learning.learned,
        learning.dictionary,
        learning.codes,
        learning.mask,
        learning.support,
    )
    d = dictionary.matrix()
    output_error, data_rank, support_rank = None, None, None
    if data is not None:
        x = data.detach().double().cpu()
        refit = refit_on_data(x, w64, b64, d, codes, support)  # the stored values are the data, in any dtype
        codes, b64, data_rank, support_rank = refit.codes, refit.bias, refit.data_rank, refit.support_rank
        target = x @ w64.T + (0 if bias is None else bias.double().cpu())
        output_error = relative_square_error(target, (x @ d) @ codes.T + b64)
        message = refit_warning(refit, x.shape[0], s, out, output_error)
        if message is not None:
            warnings.warn(message, stacklevel=2)
    factorized = FactorizedLinear.from_dictionary(dictionary, codes, b64, mask=mask)
    factorized.error = factorized.relative_error(w64)
    transform_ops = transform_op_count(spec, factorized, bits)
    code_ops = factorized.codes_op_count()
    factorized = factorized.to(device=weight.device, dtype=weight.dtype)
    factorized.report = CompressionReport(
        family=family,
        in_features=n,
        out_features=out,
        s=s,
        blocks=learned.num_blocks,
        stages=q if family == "m" else None,
        bits=bits,
        error=factorized.error,
        output_error=output_error,
        data_rank=data_rank,
        dense_ops=factorized.dense_op_count(),
        factorized_ops=transform_ops + code_ops,
        transform_ops=transform_ops,
        code_ops=code_ops,
        learner_errors=learning.errors,
        seconds=time.perf_counter() - start,
        planned_steps=learning.planned_steps,
        steps=learning.steps,
        estimated_seconds=learning.estimated_seconds,
        support_rank=support_rank,
        data_rows=None if data is None else data.shape[0],
    )
    _warn_if_dearer(factorized.report, shape, family)
    return factorized


@dataclass
class Learning:
    """What :func:`learn_factorization` learned: ``W ~ C D^T`` on the exact support of ``s`` entries per row."""

    learned: Any  # the learner's own transform D (a BlockProduct or a family's 4x4 product), float64
    dictionary: Any  # D as 2x2 blocks (:class:`~lightning_ortho.transforms.BlockProduct`), float64
    codes: torch.Tensor  # (N, n) float64, zero off the support
    mask: torch.Tensor  # (N, n) bool, s entries per row
    support: torch.Tensor  # (N, s) the support's column indices
    errors: list[float]
    planned_steps: int
    steps: int | None
    estimated_seconds: float | None


def learn_factorization(
    rows: torch.Tensor,
    spec: Any,
    settings: dict[str, Any],
    label: str,
    *,
    progress: bool | None = None,
    console: Console | None = None,
    where: str = "compress_linear",
    noun: str = "layer",
) -> Learning:
    """Learn ``rows ~ C D^T`` (``rows`` ``(N, n)`` float64 on the CPU, checked by the caller) with the family
    ``spec``'s in-memory learner and ``settings`` (``m, q, s, bits, iterations, generator``), with its plan logged,
    its time estimated (a warning past :data:`SLOW_SECONDS`) and a progress bar as :func:`compress_linear`'s; the
    codes then keep exactly ``s`` entries per row (the learner's nonzeros, topped up by magnitude)."""
    m, q, s, iterations = settings["m"], settings["q"], settings["s"], settings["iterations"]
    family = spec.name
    plan = spec.plan(m, q, iterations)
    logger.info("%s: %s %s, family %r: up to %d %s.", where, label, noun, family, plan.total, plan.unit)
    show = show_progress(progress, console or Console(stderr=True))
    report = estimate_reporter(
        where,
        f"{label}, family {family!r}",
        f"learning the {family!r} transform of this {label} {noun}",
        plan,
        slow_seconds=lambda: SLOW_SECONDS,
        advice="Lower m (blocks), q (stages) or iterations for a faster, coarser fit.",
        log=logger,
    )
    with WorkProgress(plan, f"compress {label} ({family})", show=show, console=console, on_estimate=report) as work:
        result = spec.learn(rows, **settings, on_step=work.advance)
    learned = result.transform.to(torch.float64).cpu()
    dictionary = spec.as_block_product(learned)  # the same D as 2x2 blocks
    codes = result.codes.double().cpu()
    support = codes.abs().topk(s, dim=1).indices  # exactly s entries per row: the learner's nonzeros, topped up
    mask = torch.zeros_like(codes, dtype=torch.bool).scatter_(1, support, True)
    return Learning(
        learned=learned,
        dictionary=dictionary,
        codes=codes.masked_fill(~mask, 0),
        mask=mask,
        support=support,
        errors=[float(e) for e in getattr(result, "errors", [])],
        planned_steps=plan.total,
        steps=work.completed,
        estimated_seconds=work.estimated_seconds,
    )


def _compress_to_error(
    compress: Any, layer: nn.Module, family: str, max_error: float, generator: torch.Generator | None, options: dict
) -> nn.Module:
    """``compress(layer, family, s=..., **options)`` at the smallest ``s`` meeting ``max_error`` (see
    ``compress_linear``'s ``max_error``), each try from the same ``generator`` state."""
    from lightning_ortho.transforms.sparsity_search import search_sparsity

    state = None if generator is None else generator.get_state()

    def at(s: int) -> nn.Module:
        if generator is not None:
            generator.set_state(state)
        return compress(layer, family, s=s, generator=generator, **options)

    if isinstance(layer, nn.modules.conv._ConvNd):
        n = layer.in_channels
    else:
        n = affine_parts(layer, in_features=options.get("in_features"), generator=generator)[0].shape[1]
    measure = "output_error" if options.get("data") is not None else "error"
    search = search_sparsity(at, lambda module: getattr(module.report, measure), n, max_error)
    report = search.layer.report
    report.max_error, report.searched = float(max_error), sorted(search.tried.items())
    if not search.met:
        warnings.warn(
            f"{compress.__name__}: no s met max_error={max_error}% ({measure}); the layer keeps s={search.s} (all its"
            f" inputs) with {getattr(report, measure):.3g}%.",
            UserWarning,
            stacklevel=3,
        )
    shape = f"{report.out_features}x{report.in_features}"
    _warn_if_dearer(report, shape, family, compress.__name__)
    return search.layer


def _warn_if_dearer(report: CompressionReport, shape: str, family: str, where: str = "compress_linear") -> None:
    """Warn when the compressed layer costs more operations per sample than the dense one it replaces."""
    dense, factorized = report.dense_ops, report.factorized_ops
    if factorized.total <= dense.total:
        return
    warnings.warn(
        f"{where}: the compressed {shape} layer (family {family!r}) costs {factorized.total} operations per "
        f"sample ({report.transform_ops.total} for the transform + {report.code_ops.total} for the codes), more "
        f"than the {dense.total} of the dense layer ({dense.multiplications} multiplications + {dense.additions} "
        f"additions): the transform is paid once per sample and shared by the outputs, of which this layer has "
        f"{report.out_features}. Keep it dense (leave it out of the layers to compress), or lower m, q or s.",
        UserWarning,
        stacklevel=3,
    )
