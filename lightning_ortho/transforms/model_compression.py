"""Compress a whole model to a budget: the linear layers and convolutions that pay for it, each at the fewest
operations that keep the model within ``max_accuracy_drop`` (points of a metric on ``[0, 1]``, top-1 accuracy by
default) or ``max_output_error`` (percent, the model's relative output error) on the data given.

The search (:func:`search_model_compression`, which the Lightning callback runs too):

1. The inputs each layer sees on the data are recorded (forward pre-hooks on the dense model).
2. For a per-layer budget ``tau`` (percent), every layer is compressed at the smallest ``s`` whose output error on
   its own inputs is at most ``tau`` (:func:`~lightning_ortho.transforms.sparsity_search.search_sparsity`, codes
   refit on those inputs); a layer whose compressed form would cost at least as many operations as the dense one
   stays dense.
3. ``tau`` runs down a ladder (:data:`ERROR_LADDER`, 64 % to 0.25 %, each half the one before) by binary search for
   the largest ``tau`` whose compressed model meets the model-level budget, scored on all the data. A larger
   ``tau`` is a cheaper model. The metric need not fall monotonically with ``tau`` (the search trusts it to).
4. One budget for every layer weighs neither a layer's share of the operations nor its effect on the metric, so
   the layers are then cheapened one ladder step of ``s`` at a time, the step that saves the most operations
   first, each kept where the model still meets the budget (one scoring per step) and a layer whose step fails
   left where it is, until no step is left.

Compressions are cached per layer and ``s`` across the ladder, so each is learned once.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from lightning_ortho.nn.eval_mode import eval_mode
from lightning_ortho.transforms.compression import NotAffineError, affine_parts, compress_linear
from lightning_ortho.transforms.conv_compression import compress_conv, conv_problem
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.factorized_conv import FactorizedConv, convolution_output_size
from lightning_ortho.transforms.factorized_linear import FactorizedLinear
from lightning_ortho.transforms.families import family_spec
from lightning_ortho.transforms.sparsity_search import search_sparsity, sparsity_ladder

#: The per-layer output-error budgets (percent) the search tries, cheapest first.
ERROR_LADDER = (64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.25)
#: Rows of inputs recorded per linear layer (images per convolution: a tenth of it) for the per-layer refit.
MAX_LAYER_ROWS = 4096


@dataclass
class LayerCompression:
    """One layer in a :class:`ModelCompression`: what it was, what it became, at what cost and error.

    Attributes:
        name: the module's name in the model.
        kind: its class (``"Linear"``, ``"Conv2d"``, ...).
        compressed: whether it was replaced (``False``: it stays dense, ``reason`` says why).
        s: nonzeros per code row (``None`` where dense).
        ops_before: the dense layer's operations per sample (per image for a convolution, at the recorded size).
        ops_after: the compressed layer's (``ops_before`` where it stays dense).
        weight_error: the compressed weight's relative error (percent), ``None`` where dense.
        output_error: its relative output error on the layer's recorded inputs (percent), ``None`` where dense.
        reason: why it stays dense, ``""`` otherwise.
        blocks: the transform's blocks ``m`` (stages ``q`` for family ``"m"``), ``None`` where dense.
    """

    name: str
    kind: str
    compressed: bool
    s: int | None
    ops_before: OpCount
    ops_after: OpCount
    weight_error: float | None = None
    output_error: float | None = None
    reason: str = ""
    blocks: int | None = None


@dataclass
class ModelCompression:
    """What :func:`compress_model` did.

    Attributes:
        model: the model, its chosen layers replaced (the same object that was passed in).
        layers: one :class:`LayerCompression` per candidate layer.
        budget: ``"max_accuracy_drop=1.0"`` or ``"max_output_error=5.0"``.
        metric_name: the metric's name (``"accuracy"`` by default; ``"output_error"`` for an output budget).
        metric_before: the dense model's metric on the data.
        metric_after: the compressed model's, before any fine-tuning.
        metric_finetuned: after fine-tuning, once :meth:`record_finetuned` has measured it.
        layer_budget: the per-layer output-error budget ``tau`` (percent) chosen, ``None`` where none met it.
        met: whether the compressed model meets the budget (all dense where no ``tau`` did).
        tried: every trial with the model's metric (or output error) there: ``(tau, figure)`` for a uniform
            per-layer budget, ``("<layer> s=<s>", figure)`` for a step of the refinement.
        seconds: the search's time.
    """

    model: nn.Module
    layers: list[LayerCompression]
    budget: str
    metric_name: str
    metric_before: float | None
    metric_after: float | None
    layer_budget: float | None
    met: bool
    tried: list[tuple[float | str, float]] = field(default_factory=list)
    seconds: float = 0.0
    metric_finetuned: float | None = None
    _score: Callable[[nn.Module], float] | None = field(default=None, repr=False)

    @property
    def ops_before(self) -> OpCount:
        """The candidate layers' dense operations, summed."""
        return sum((layer.ops_before for layer in self.layers), OpCount())

    @property
    def ops_after(self) -> OpCount:
        """Their operations after compression (dense layers at their dense cost), summed."""
        return sum((layer.ops_after for layer in self.layers), OpCount())

    @property
    def ops_ratio(self) -> float:
        """``ops_before.total / ops_after.total``: how many times fewer operations the candidate layers cost."""
        return self.ops_before.total / max(self.ops_after.total, 1)

    def record_finetuned(self) -> float:
        """Measure the (fine-tuned) model's metric on the search's data, keep it as :attr:`metric_finetuned` and
        return it."""
        if self._score is None:
            raise ValueError("ModelCompression.record_finetuned: this result has no metric to measure.")
        self.metric_finetuned = self._score(self.model)
        return self.metric_finetuned

    def table(self) -> Table:
        """A rich table: per layer its operations before and after, weight and output error, ``s``; the title the
        metric before, after compression and after fine-tuning."""

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.4g}"

        title = (
            f"compress_model ({self.budget}; {self.metric_name}: {fmt(self.metric_before)} dense -> "
            f"{fmt(self.metric_after)} compressed -> {fmt(self.metric_finetuned)} fine-tuned; operations "
            f"{self.ops_before.total} -> {self.ops_after.total}, {self.ops_ratio:.2f}x fewer)"
        )
        table = Table(title=title)
        columns = ("layer", "type", "s", "m", "ops before", "ops after", "weight error %", "output error %", "note")
        for column in columns:
            table.add_column(column, justify="left" if column in ("layer", "type", "note") else "right")
        for layer in self.layers:
            table.add_row(
                layer.name,
                layer.kind,
                "-" if layer.s is None else str(layer.s),
                "-" if layer.blocks is None else str(layer.blocks),
                str(layer.ops_before.total),
                str(layer.ops_after.total),
                fmt(layer.weight_error),
                fmt(layer.output_error),
                layer.reason.split(":")[0] if layer.reason else "compressed",
            )
        return table

    def print(self, console: Console | None = None) -> None:
        """Print :meth:`table`."""
        (console or Console()).print(self.table())


def candidate_layers(model: nn.Module, family: str, modules: Sequence[str] | None = None) -> dict[str, str]:
    """``name -> reason`` for the outermost ``nn.Linear``, other affine layers with ``in_features`` (``SVDLinear``
    with a linear map) and convolutions of ``model`` (or the ``modules`` named): the reason is ``""`` for a layer the
    family can compress, else why it stays dense (grouped or one-channel convolutions, ...)."""
    spec = family_spec(family, "compress_model")
    names: dict[str, str] = {}
    for name, module in model.named_modules():
        if not name or any(name.startswith(f"{outer}.") for outer in names):
            continue
        if modules is not None and name not in modules:
            continue
        if isinstance(module, nn.modules.conv._ConvNd):
            problem = conv_problem(module)
            n = module.in_channels
        elif isinstance(module, nn.Linear) or _affine_with_features(module):
            problem, n = None, module.in_features
        elif modules is not None and name in modules:
            problem, n = "it is not an affine layer with in_features (nn.Linear, SVDLinear with a linear map)", 0
        else:
            continue
        if problem is None:
            feature = spec.feature_problem(n) if n >= 2 else "needs at least 2 inputs"
            problem = None if feature is None else f"family {family!r} {feature}"
        names[name] = problem or ""
    if modules is not None:
        missing = [name for name in modules if name not in names]
        if missing:
            raise ValueError(f"compress_model: no Linear or convolution named {missing} in the model.")
    return names


def _affine_with_features(module: nn.Module) -> bool:
    """Whether ``module`` (not ``nn.Linear``) is an affine map with an int ``in_features`` that
    :func:`~lightning_ortho.transforms.compression.affine_parts` reads (e.g. ``SVDLinear`` with a linear
    orthogonal map; a compressed layer is not one)."""
    if isinstance(module, FactorizedLinear | FactorizedConv) or not isinstance(
        getattr(module, "in_features", None), int
    ):
        return False
    try:
        affine_parts(module)
    except (TypeError, NotAffineError, RuntimeError, ValueError):
        return False
    return True


def search_model_compression(
    model: nn.Module,
    layer_inputs: dict[str, torch.Tensor],
    reasons: dict[str, str],
    meets: Callable[[nn.Module], tuple[bool, float]],
    *,
    family: str = "b",
    generator: torch.Generator | None = None,
    ladder: Sequence[float] = ERROR_LADDER,
    options: dict[str, Any] | None = None,
    refine: bool = True,
    model_inputs: Sequence[Any] | None = None,
) -> tuple[list[LayerCompression], float | None, list[tuple[float | str, float]]]:
    """The search of the module docstring on ``model`` (changed in place: the chosen layers are installed).

    Args:
        layer_inputs: ``name -> inputs`` of each compressible layer in the dense model (``(N, in)`` rows,
            ``(N, in, *spatial)`` images for a convolution).
        reasons: :func:`candidate_layers`'s ``name -> reason`` (``""``: compressible), in the model's order.
        meets: ``model -> (within the budget, figure)`` on the model as it is at the call.
        options: further arguments of ``compress_linear``/``compress_conv`` (``m``, ``iterations``, ...).
        refine: after the uniform budget, cheapen layers one ``s`` step at a time while the model still meets the
            budget, the step that saves the most operations first (one scoring per step).
        model_inputs: the model's input batches: given, each layer is refit on the inputs it sees with the layers
            before it compressed as chosen (sequential refit: a layer corrects what the compressions upstream
            changed in its inputs), recorded by running the model on them; without, on the dense model's
            ``layer_inputs``.

    Returns:
        ``(layers, tau, tried)``: the :class:`LayerCompression` rows, the chosen per-layer budget (``None``: none
        met the budget and every layer stays dense), and every trial with its figure: ``(tau, figure)`` for the
        uniform budgets, ``("<layer> s=<s>", figure)`` for the refinement's steps.
    """
    options = dict(options or {})
    state = None if generator is None else generator.get_state()
    names = list(reasons)
    dense = {name: model.get_submodule(name) for name in names}
    compressions: dict[tuple, nn.Module] = {}  # (name, s, upstream) -> the compressed layer
    recorded: dict[tuple, torch.Tensor] = {}  # (name, upstream) -> the layer's inputs there
    Chosen = dict[str, tuple[nn.Module | None, str]]

    def install(chosen: Chosen) -> None:
        for name in names:
            layer = chosen[name][0] if name in chosen else None
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, dense[name] if layer is None else layer)

    def upstream(name: str, chosen: Chosen) -> tuple:
        """What the layers before ``name`` are in ``chosen`` (``()`` without sequential refit)."""
        if model_inputs is None:
            return ()
        before = names[: names.index(name)]
        return tuple(
            id(chosen[other][0]) if other in chosen and chosen[other][0] is not None else None for other in before
        )

    def inputs_of(name: str, chosen: Chosen) -> torch.Tensor:
        key = (name, upstream(name, chosen))
        if all(part is None for part in key[1]):
            return layer_inputs[name]  # everything upstream dense: the dense model's inputs
        if key not in recorded:
            install({other: chosen[other] for other in names[: names.index(name)] if other in chosen})
            recorded[key] = record_layer_inputs(model, [name], model_inputs)[name]
        return recorded[key]

    def compress(name: str, s: int, chosen: Chosen) -> nn.Module:
        key = (name, s, upstream(name, chosen))
        if key not in compressions:
            if generator is not None:
                generator.set_state(state)
            layer, data = dense[name], inputs_of(name, chosen)
            convolution = isinstance(layer, nn.modules.conv._ConvNd)
            function = compress_conv if convolution else compress_linear
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                compressions[key] = function(
                    layer, family, s=s, data=data, generator=generator, progress=False, **options
                )
        return compressions[key]

    def features(name: str) -> int:
        layer = dense[name]
        return layer.in_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer_inputs[name].shape[-1]

    def choose(tau: float) -> Chosen:
        chosen: Chosen = {}
        for name, reason in reasons.items():
            if reason or name not in layer_inputs:
                chosen[name] = (None, reason or "no inputs recorded (the layer did not run on the data)")
                continue
            so_far = dict(chosen)
            search = search_sparsity(
                lambda s, name=name, so_far=so_far: compress(name, s, so_far),
                lambda module: module.report.output_error,
                features(name),
                tau,
            )
            report = search.layer.report
            if report.factorized_ops.total >= report.dense_ops.total:
                chosen[name] = (None, f"dearer than dense at {tau:g} % ({report.factorized_ops.total} operations)")
            else:
                chosen[name] = (search.layer, "")
        return chosen

    tried: list[tuple[float | str, float]] = []
    results: dict[int, tuple[bool, Chosen]] = {}

    def trial(index: int) -> bool:
        if index not in results:
            chosen = choose(ladder[index])
            install(chosen)
            ok, figure = meets(model)
            tried.append((ladder[index], figure))
            results[index] = (ok, chosen)
        return results[index][0]

    low, high, best = 0, len(ladder) - 1, None  # the cheapest (largest tau, lowest index) that meets the budget
    while low <= high:
        middle = (low + high) // 2
        if trial(middle):
            best, high = middle, middle - 1
        else:
            low = middle + 1
    if best is not None:
        final = results[best][1]
    else:
        final = {name: (None, reasons[name] or "no per-layer budget met the model's") for name in reasons}
    install(final)
    if refine and best is not None:
        final = _refine(model, final, compress, features, meets, install, tried)
    rows = [_row(name, dense[name], layer, reason, layer_inputs.get(name)) for name, (layer, reason) in final.items()]
    return rows, (None if best is None else ladder[best]), tried


def _refine(
    model: nn.Module,
    chosen: dict[str, tuple[nn.Module | None, str]],
    compress: Callable[[str, int, dict], nn.Module],
    features: Callable[[str], int],
    meets: Callable[[nn.Module], tuple[bool, float]],
    install: Callable[[dict], None],
    tried: list,
) -> dict[str, tuple[nn.Module | None, str]]:
    """Cheapen the chosen layers one ladder step at a time, the step that saves the most operations first, keeping
    each step the model still meets the budget with (one scoring per step; a layer whose step fails is left where
    it is). The uniform per-layer budget treats every layer alike; this spends the model's budget where the
    operations are. A step's layer is refit on its inputs under the current choice upstream; the layers downstream
    keep their fit."""
    chosen, frozen = dict(chosen), set()
    while True:
        steps = []
        for name, (layer, _) in chosen.items():
            if layer is None or name in frozen:
                continue
            ladder = sparsity_ladder(features(name))
            position = ladder.index(layer.report.s)
            if position == 0:
                frozen.add(name)
                continue
            cheaper = compress(name, ladder[position - 1], chosen)
            saving = layer.report.factorized_ops.total - cheaper.report.factorized_ops.total
            steps.append((saving, name, cheaper))
        if not steps:
            return chosen
        _, name, cheaper = max(steps, key=lambda step: step[0])
        trial = {**chosen, name: (cheaper, "")}
        install(trial)
        ok, figure = meets(model)
        tried.append((f"{name} s={cheaper.report.s}", figure))
        if ok:
            chosen = trial
        else:
            frozen.add(name)
            install(chosen)


def _row(
    name: str, dense: nn.Module, layer: nn.Module | None, reason: str, inputs: torch.Tensor | None
) -> LayerCompression:
    kind = type(dense).__name__
    if layer is not None:
        report = layer.report
        return LayerCompression(
            name,
            kind,
            True,
            report.s,
            report.dense_ops,
            report.factorized_ops,
            report.error,
            report.output_error,
            blocks=report.blocks if report.stages is None else report.stages,
        )
    ops = _dense_ops(dense, inputs)
    return LayerCompression(name, kind, False, None, ops, ops, reason=reason or "stays dense")


def _dense_ops(module: nn.Module, inputs: torch.Tensor | None) -> OpCount:
    """The dense layer's operations per sample (per image for a convolution, at its inputs' size)."""
    if isinstance(module, nn.modules.conv._ConvNd):
        fan_in = module.in_channels // module.groups * math.prod(module.kernel_size)
        positions = 1
        if inputs is not None:
            size = inputs.shape[2:]
            positions = math.prod(
                convolution_output_size(size, module.kernel_size, module.stride, module.padding, module.dilation)
            )
        per = OpCount(additions=module.out_channels * (fan_in - 1), multiplications=module.out_channels * fan_in)
        return per * positions
    try:
        weight, _ = affine_parts(module)
    except (TypeError, NotAffineError):
        return OpCount()
    out, n = weight.shape
    return OpCount(additions=out * (n - 1), multiplications=out * n)


def record_layer_inputs(
    model: nn.Module, names: Iterable[str], batches: Iterable[Any], max_rows: int = MAX_LAYER_ROWS
) -> dict[str, torch.Tensor]:
    """``name -> inputs`` the layers ``names`` see when ``model`` (eval mode, no gradients) runs on ``batches``
    (each the model's input), float64 on the CPU: linear layers' rows ``(N, in)`` up to ``max_rows``, convolutions'
    inputs ``(N, in, *spatial)`` up to ``max_rows // 10`` images."""
    recorded: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    counts, limits = dict.fromkeys(recorded, 0), {}
    hooks = []
    for name in recorded:
        module = model.get_submodule(name)
        conv = isinstance(module, nn.modules.conv._ConvNd)
        limit = limits[name] = max(1, max_rows // 10) if conv else max_rows

        def hook(_module, args, name=name, conv=conv, limit=limit) -> None:
            if counts[name] >= limit:
                return
            x = args[0].detach()
            x = x if conv else x.reshape(-1, x.shape[-1])
            x = x[: limit - counts[name]]
            recorded[name].append(x.double().cpu())
            counts[name] += x.shape[0]

        hooks.append(module.register_forward_pre_hook(hook))
    try:
        with eval_mode(model), torch.no_grad():
            for inputs in batches:
                if all(counts[name] >= limits[name] for name in counts):
                    break  # every layer has its rows
                model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: torch.cat(parts) for name, parts in recorded.items() if parts}


def top1_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """The fraction of rows whose largest output is the target class."""
    return float((outputs.argmax(-1) == targets).double().mean())


def compress_model(
    model: nn.Module,
    data: Iterable[Any],
    *,
    max_accuracy_drop: float | None = None,
    max_output_error: float | None = None,
    metric: Callable[[torch.Tensor, torch.Tensor], float] | None = None,
    metric_name: str | None = None,
    family: str = "b",
    modules: Sequence[str] | None = None,
    generator: torch.Generator | None = None,
    ladder: Sequence[float] = ERROR_LADDER,
    finetune: Callable[[nn.Module], None] | None = None,
    confidence: float | None = None,
    verbose: bool = False,
    **options: Any,
) -> ModelCompression:
    """Compress ``model``'s linear layers and convolutions to a budget (see the module docstring), in place.

    Args:
        model: any ``nn.Module``; its outermost ``nn.Linear`` and ``Conv1d``/``Conv2d`` modules (or ``modules``)
            are the candidates, those a family cannot compress (grouped or one-channel convolutions, ...) stay dense
            with the reason in the table.
        data: batches: ``(inputs, targets, ...)`` tuples or lists (a ``DataLoader``), or input tensors alone for
            ``max_output_error``. The search reads them several times, so they must iterate again.
        max_accuracy_drop: the largest drop of ``metric`` allowed, in points (``100 x`` a metric on ``[0, 1]``:
            ``1.0`` is one point of accuracy), before fine-tuning.
        max_output_error: instead, the largest relative output error of the model allowed, in percent
            (``100 ||f(X) - g(X)||^2 / ||f(X)||^2`` over the data).
        metric: ``(outputs, targets) -> float`` on ``[0, 1]``, higher is better, over the whole data at once
            (default :func:`top1_accuracy`); a ``torchmetrics.Metric`` works too (its ``update``/``compute``).
        metric_name: its name in the table (default ``"accuracy"`` or the metric's class).
        family: the transform family, as :func:`compress_linear`.
        modules: the names of the layers to consider (default: every candidate).
        generator: the learners' generator (each compression starts from the same state).
        ladder: the per-layer budgets to try, largest first (default :data:`ERROR_LADDER`).
        finetune: ``model -> None``, a short fine-tuning (an epoch or two of your training loop) run on a copy of
            each candidate compressed model before it is scored: the budget then holds after that fine-tuning,
            which lets the search accept cheaper layers whose error fine-tuning recovers. The model returned is
            not fine-tuned (its layers are the chosen compressions): fine-tune it as you would, then
            :meth:`ModelCompression.record_finetuned`. Without it the budget holds before any fine-tuning.
        confidence: with ``max_accuracy_drop`` and the default top-1 accuracy, accept a candidate only where the
            budget holds at this one-sided confidence (in ``[0.5, 1)``): ``drop + z * se <= max_accuracy_drop``,
            ``z`` the standard normal's ``confidence`` quantile and ``se`` the paired standard error of the drop
            over the samples, ``100 * std(c_dense - c_candidate) / sqrt(N)`` (``c``: 1 where a sample is right).
            On a validation set of a few hundred samples a drop is measured to about a point, and a search that
            takes every candidate whose measured drop fits picks the ones that happened to score well there: the
            margin keeps what it accepts within the budget on other data too. ``None``: the measured drop alone.
        verbose: print the table.
        options: further arguments of every compression (``m``, ``q``, ``bits``, ``iterations``).

    Returns:
        The result, a :class:`ModelCompression` with the model, per-layer rows, the metric before and after, the operations.
            Fine-tune the model, then :meth:`ModelCompression.record_finetuned` measures the metric again.

    Raises:
        ValueError: neither or both budgets, a budget that is not positive, batches without targets for an
            accuracy budget, no candidate layer, a ``modules`` name that is not one, a ``confidence`` outside
            ``[0.5, 1)`` or without ``max_accuracy_drop`` and the default metric.
    """
    start = time.perf_counter()
    if (max_accuracy_drop is None) == (max_output_error is None):
        raise ValueError("compress_model: give one budget, max_accuracy_drop (points) or max_output_error (percent).")
    budget_value = max_accuracy_drop if max_accuracy_drop is not None else max_output_error
    if not isinstance(budget_value, int | float) or isinstance(budget_value, bool) or budget_value < 0:
        raise ValueError(f"compress_model: the budget must be a number >= 0, got {budget_value!r}.")
    z = _confidence_quantile(confidence, max_accuracy_drop, metric)
    batches = [_split(batch) for batch in data]
    if not batches:
        raise ValueError("compress_model: data holds no batch.")
    if max_accuracy_drop is not None and any(target is None for _, target in batches):
        raise ValueError(
            "compress_model: max_accuracy_drop scores the model against targets: pass (inputs, targets) batches, or"
            " use max_output_error with inputs alone."
        )
    reasons = candidate_layers(model, family, modules)
    if not reasons:
        raise ValueError("compress_model: the model has no nn.Linear, Conv1d or Conv2d to compress.")
    # every candidate's inputs: the compressible ones' for their refit, the others' for their dense cost per image
    layer_inputs = record_layer_inputs(model, reasons, (inputs for inputs, _ in batches))
    reference = _outputs(model, batches)

    if max_output_error is not None:
        name, budget = "output_error", f"max_output_error={max_output_error:g}"

        def score(candidate: nn.Module) -> float:
            outputs = _outputs(candidate, batches)
            return float(100 * (outputs - reference).square().sum() / reference.square().sum().clamp_min(1e-300))

        def meets(candidate: nn.Module) -> tuple[bool, float]:
            figure = score(candidate)
            return figure <= max_output_error, figure

        before = 0.0
    else:
        measure = metric or top1_accuracy
        name = metric_name or ("accuracy" if metric is None else _metric_name(metric))
        budget = f"max_accuracy_drop={max_accuracy_drop:g}"
        targets = torch.cat([target.cpu() for _, target in batches])

        def score(candidate: nn.Module) -> float:
            return _apply_metric(measure, _outputs(candidate, batches), targets)

        before = score(model)
        dense_correct = _correct(reference, targets)

        def meets(candidate: nn.Module) -> tuple[bool, float]:
            if z is None:
                figure = score(candidate)
                return 100 * (before - figure) <= max_accuracy_drop, figure
            correct = _correct(_outputs(candidate, batches), targets)
            drop, error = paired_drop(dense_correct, correct)
            return drop + z * error <= max_accuracy_drop, float(correct.mean())

    judge = meets
    if finetune is not None:

        def judge(candidate: nn.Module) -> tuple[bool, float]:
            tuned = copy.deepcopy(candidate)  # the search's layers (and the dense ones) stay as they are
            finetune(tuned)
            return meets(tuned)

        budget += " after fine-tuning"
    if confidence is not None:
        budget += f" at {confidence:g} confidence"
    with warnings.catch_warnings():  # each trial's compressions: their warnings are of candidates, not the result
        warnings.simplefilter("ignore", UserWarning)
        rows, tau, tried = search_model_compression(
            model,
            layer_inputs,
            reasons,
            judge,
            family=family,
            generator=generator,
            ladder=ladder,
            options=options,
            model_inputs=[inputs for inputs, _ in batches],
        )
    after = score(model)
    result = ModelCompression(
        model=model,
        layers=rows,
        budget=budget,
        metric_name=name,
        metric_before=before,
        metric_after=after,
        layer_budget=tau,
        met=tau is not None,
        tried=tried,
        seconds=time.perf_counter() - start,
        _score=score,
    )
    if tau is None:
        warnings.warn(
            f"compress_model: no per-layer budget down to {ladder[-1]:g} % met {budget}; every layer stays dense.",
            UserWarning,
            stacklevel=2,
        )
    if verbose:
        result.print()
    return result


def paired_drop(dense_correct: torch.Tensor, correct: torch.Tensor) -> tuple[float, float]:
    """The drop of accuracy from ``dense_correct`` to ``correct`` (``(N,)``, 1 where a sample is right) in points,
    and its paired standard error ``100 * std(dense_correct - correct) / sqrt(N)`` (0 for one sample): the samples
    both get right or both get wrong add nothing to it, the ones they disagree on make it."""
    difference = dense_correct.double() - correct.double()
    error = 100 * float(difference.std() / math.sqrt(len(difference))) if len(difference) > 1 else 0.0
    return 100 * float(difference.mean()), error


def _correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(-1) == targets).double()


def _confidence_quantile(confidence: float | None, max_accuracy_drop: float | None, metric: Any) -> float | None:
    """The standard normal's ``confidence`` quantile, after checking ``compress_model``'s arguments allow it."""
    if confidence is None:
        return None
    if max_accuracy_drop is None or metric is not None:
        raise ValueError(
            "compress_model: confidence bounds the drop of top-1 accuracy by its paired standard error over the"
            " samples: use it with max_accuracy_drop and the default metric (no metric=)."
        )
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0.5 <= confidence < 1:
        raise ValueError(f"compress_model: confidence must be in [0.5, 1), got {confidence!r}.")
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(float(confidence), dtype=torch.float64)))


def _split(batch: Any) -> tuple[Any, torch.Tensor | None]:
    if isinstance(batch, tuple | list):
        return batch[0], (batch[1] if len(batch) > 1 else None)
    return batch, None


def _outputs(model: nn.Module, batches: list[tuple[Any, Any]]) -> torch.Tensor:
    with eval_mode(model), torch.no_grad():
        return torch.cat([model(inputs).detach().double().cpu() for inputs, _ in batches])


def _apply_metric(metric: Any, outputs: torch.Tensor, targets: torch.Tensor) -> float:
    if hasattr(metric, "update") and hasattr(metric, "compute"):  # a torchmetrics.Metric
        metric = metric.clone() if hasattr(metric, "clone") else metric
        metric.reset()
        metric.update(outputs.float(), targets)
        return float(metric.compute())
    return float(metric(outputs, targets))


def _metric_name(metric: Any) -> str:
    return type(metric).__name__ if hasattr(metric, "compute") else getattr(metric, "__name__", "metric")
