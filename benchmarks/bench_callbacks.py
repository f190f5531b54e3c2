"""What the monitors of lightning_ortho.callbacks cost: the training time they add at their defaults, and the cost of
closed-form log-determinants against the autograd path of JacobianDeterminantMonitor as d grows.

    python -m benchmarks.bench_callbacks            # both parts (about 9 minutes on one thread of a 2-core machine)
    python -m benchmarks.bench_callbacks --quick    # tiny models and steps, seconds (used by the tests)
    python -m benchmarks.bench_callbacks --skip-overhead | --skip-logdet

1. Overhead (rows ``"section": "overhead"``). Three recipes' models, each trained in-process by a
   ``pl.Trainer(max_steps=N, logger=pl.loggers.CSVLogger(...), enable_progress_bar=False, enable_checkpointing=False,
   enable_model_summary=False, limit_val_batches=0)`` with the recipe's other trainer settings, once without any
   monitor (``"none"``) and once with each monitor alone, at its defaults (``Monitor()``, no argument):

   * ``fcnn``: recipes/fcnn_digits.yaml, ``OrthogonalClassifier(depth=3, orthogonal="aux")`` on
     ``DigitsDataModule(batch_size=32, image_size=8, flatten=True)`` (d = 64, deterministic); monitors
     OrthogonalityMonitor (the SVD layers' singular values), GradientNoiseMonitor, JacobianDeterminantMonitor (the
     six auxiliary reflections, closed form), InvertibilityMonitor (the same six, Newton inverse);
   * ``glow``: recipes/glow_digits.yaml, ``GlowModule(levels=3, steps=8, hidden_channels=64,
     conv1x1="aux_invertible")`` on the 8x8 digits (batch 64, gradient clipping 50); monitors
     JacobianDeterminantMonitor (defaults find the three flow blocks and two splits), InvertibilityMonitor (defaults
     find the whole Glow: ``decode(encode(x))``), GradientNoiseMonitor; OrthogonalityMonitor finds nothing (the
     row says why); and the recipe's own configurations of the first two (``probe_size=16``, the 24 1x1 convolutions
     / ``modules=["glow"]``), marked ``"config": "recipe"``;
   * ``online``: recipes/online_adding.yaml, ``OnlineRNNModule(TanhRNNCell(1, 32), estimator="uoro")`` on
     ``AddingTaskDataModule(streams=32, chunk_length=32)``: one Adam update per time step, 32 per chunk, so
     ``max_steps`` counts time steps; monitors GradientNoiseMonitor, OnlineEstimatorVarianceMonitor.

   Each variant starts from the same seed (model, data order). Variants run in a random order within each round
   after one untimed warm-up round; ``loop_s`` is the training loop's wall time (``on_train_start`` to
   ``on_train_end``: every step and every measurement of the monitor, not the Trainer's setup nor the rich table and
   PNG that monitors write at the end of fit), ``fit_s`` the whole ``trainer.fit``. ``ratio`` is the median over
   rounds of the round's ``loop_s`` / the same round's ``loop_s`` of ``"none"`` (paired, so that the machine's
   drift cancels); ``fit_ratio`` the same for ``fit_s``. ``hook_s`` is the time spent inside the monitor's own
   Lightning hooks during the loop (its forward hooks on modules are not counted), ``hook_share`` = ``hook_s`` /
   the baseline's ``loop_s``: an estimate of the overhead that machine noise does not blur. Target: ratio
   <= 1.05 at the defaults.

2. Log-determinants (rows ``"section": "logdet"``). ``AuxiliaryReflection(d, invertible=True)`` (float32, as in
   training) on a probe of ``probe_size`` = 8 rows (the monitors' default): ``closed_form`` is the module's
   ``log_abs_det_jacobian(x)`` (Lemma 1: one eigendecomposition of ``W``, then O(d^2) per row);
   ``monitor_closed_form`` is JacobianDeterminantMonitor's closed-form path as it runs (the same, plus the sign
   of ``det J`` from the dense analytic Jacobian, ``O(d^3)`` per row, where ``d <= max_autograd_dim`` = 256);
   ``autograd`` is its autograd path (``torch.func.vmap(jacrev)`` of the module on float64 copies of parameters and
   probe, then ``slogdet``), the one it takes for a module without ``log_abs_det_jacobian``. Interleaved rounds,
   each method called for at least ``min_time`` seconds per round; the median over rounds. Agreement: on a float64
   copy of the module, ``closed_form`` against ``autograd``, largest absolute difference (target 1e-8).

Threads: ``--threads`` (default 1: this 2-core machine is shared, and one thread keeps a second job on the other
core from doubling the times). Writes benchmarks/results/bench_callbacks-HARDWARE.json (+ .png); results table:
bench_callbacks_render.py.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import lightning_ortho.callbacks.monitors.base as monitor_module
from benchmarks._common import (
    benchmark_parser,
    configured,
    interleave,
    keep_freed_memory,
    median,
    parse_args,
    print_claims,
    pyplot,
    result_path,
    write_result,
)
from lightning_ortho._lightning import pl
from lightning_ortho.callbacks import (
    GradientNoiseMonitor,
    InvertibilityMonitor,
    JacobianDeterminantMonitor,
    OnlineEstimatorVarianceMonitor,
    OrthogonalityMonitor,
)
from lightning_ortho.datamodules import AddingTaskDataModule, DigitsDataModule
from lightning_ortho.flows import Invertible1x1Conv
from lightning_ortho.models import GlowModule, OnlineRNNModule, OrthogonalClassifier
from lightning_ortho.nn import AuxiliaryReflection
from lightning_ortho.online import TanhRNNCell

TARGET = 1.05
#: model -> optimizer steps of one timed fit (full, quick).
STEPS = {"fcnn": (400, 100), "glow": (100, 100), "online": (960, 128)}  # quick: one GradientNoise window (every 100)
ROUNDS, QUICK_ROUNDS = 7, 1
LOGDET_DIMS, QUICK_LOGDET_DIMS = (16, 32, 64, 128, 256, 512, 1024), (16, 32)
LOGDET_PROBE = 8
LOGDET_ROUNDS, QUICK_LOGDET_ROUNDS = 5, 1
LOGDET_MIN_TIME, QUICK_LOGDET_MIN_TIME = 0.2, 0.01
#: Largest |closed form - autograd| (float64) that counts as agreement.
AGREEMENT = 1e-8
#: The smallest d of the growth-exponent fits (below it fixed per-call costs dominate).
FIT_FROM_D = 128
LOGDET_METHODS = ("closed_form", "monitor_closed_form", "autograd")
#: Lightning hooks of a callback that run outside the training loop (not counted in hook_s).
OUTSIDE_LOOP = frozenset({"setup", "teardown", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end"})


# ------------------------------------------------------------------------------------------------- scenarios
class Scenario:
    """One recipe's model: how to build it and its data (``quick`` -> module), the recipe's trainer settings, its
    monitors (``label -> (config, factory)``, config ``"defaults"`` or ``"recipe"``) and the monitors it cannot
    have (``label -> reason``)."""

    def __init__(
        self,
        name: str,
        description: str,
        model: Callable[[bool], pl.LightningModule],
        data: Callable[[bool], pl.LightningDataModule],
        trainer: dict,
        monitors: dict[str, tuple[str, Callable[[], pl.Callback]]],
        skipped: dict[str, str] | None = None,
    ) -> None:
        self.name, self.description, self.model, self.data = name, description, model, data
        self.trainer, self.monitors, self.skipped = trainer, monitors, skipped or {}


def fcnn_model(quick: bool) -> pl.LightningModule:
    return OrthogonalClassifier(in_features=16 if quick else 64, num_classes=10, depth=3, orthogonal="aux", lr=1e-3)


def digits_data(quick: bool, *, flatten: bool = True, batch_size: int = 32) -> pl.LightningDataModule:
    return DigitsDataModule(
        batch_size=batch_size, image_size=4 if quick and flatten else 8, flatten=flatten, standardize=flatten
    )


def glow_model(quick: bool) -> pl.LightningModule:
    if quick:
        return GlowModule(1, 8, levels=2, steps=1, hidden_channels=8, conv1x1="aux_invertible", warmup_steps=100)
    return GlowModule(1, 8, levels=3, steps=8, hidden_channels=64, conv1x1="aux_invertible", lr=1e-3, warmup_steps=100)


def online_model(quick: bool) -> pl.LightningModule:
    return OnlineRNNModule(
        TanhRNNCell(AddingTaskDataModule.input_size, 8 if quick else 32),
        output_size=AddingTaskDataModule.output_size,
        loss="cross_entropy",
        readout="linear",
        estimator="uoro",
        estimator_options={"projection": "state"},
        update_every=1,
        optimizer="adam",
        lr=1e-3,
        seed=0,
        clip_gradient_norm=1.0,
    )


def online_data(quick: bool) -> pl.LightningDataModule:
    return AddingTaskDataModule(
        t1=5, t2=9, streams=8 if quick else 32, chunk_length=32, chunks_per_epoch=50, val_streams=8, val_chunks=8
    )


def scenarios() -> dict[str, Scenario]:
    glow_orthogonality = "OrthogonalityMonitor finds no orthogonal map in the Glow"
    try:  # the monitor's own words: why it finds nothing (24 auxiliary reflections, no matrix Q)
        OrthogonalityMonitor().select(glow_model(False))
    except ValueError as error:
        glow_orthogonality = str(error).split(" pass modules=")[0].rstrip(";").rstrip(".") + (
            ": its 1x1 convolutions are auxiliary reflections, orthogonal per input by construction, with no matrix "
            "Q whose drift could be measured"
        )
    return {
        "fcnn": Scenario(
            "fcnn",
            "recipes/fcnn_digits.yaml: OrthogonalClassifier(depth=3, orthogonal='aux') on DigitsDataModule(batch_size=32,"
            " image_size=8, flatten=True), d = 64, Adam lr 1e-3, deterministic",
            fcnn_model,
            digits_data,
            {"deterministic": True},
            {
                "OrthogonalityMonitor": ("defaults", OrthogonalityMonitor),
                "GradientNoiseMonitor": ("defaults", GradientNoiseMonitor),
                "JacobianDeterminantMonitor": ("defaults", JacobianDeterminantMonitor),
                "InvertibilityMonitor (named: the six reflections)": (
                    "named",
                    lambda: InvertibilityMonitor(modules=[AuxiliaryReflection]),
                ),
            },
            {
                "InvertibilityMonitor": "at its defaults it watches nothing here: the FCNN's auxiliary reflections are "
                "unconstrained (invertible=False), which automatic selection skips; the named row watches them"
            },
        ),
        "glow": Scenario(
            "glow",
            "recipes/glow_digits.yaml: GlowModule(levels=3, steps=8, hidden_channels=64, conv1x1='aux_invertible', "
            "warmup_steps=100) on DigitsDataModule(batch_size=64, image_size=8, flatten=False, standardize=False), "
            "gradient_clip_val 50",
            glow_model,
            lambda quick: digits_data(quick, flatten=False, batch_size=64),
            {"gradient_clip_val": 50.0, "deterministic": False},
            {
                "JacobianDeterminantMonitor": ("defaults", JacobianDeterminantMonitor),
                "InvertibilityMonitor": ("defaults", InvertibilityMonitor),
                "GradientNoiseMonitor": ("defaults", GradientNoiseMonitor),
                "JacobianDeterminantMonitor (recipe: the 24 Invertible1x1Conv, probe 16)": (
                    "recipe",
                    lambda: JacobianDeterminantMonitor(modules=[Invertible1x1Conv], every_n_steps=50, probe_size=16),
                ),
                "InvertibilityMonitor (recipe: glow, probe 16)": (
                    "recipe",
                    lambda: InvertibilityMonitor(modules=["glow"], every_n_steps=50, probe_size=16),
                ),
            },
            {"OrthogonalityMonitor": glow_orthogonality},
        ),
        "online": Scenario(
            "online",
            "recipes/online_adding.yaml: OnlineRNNModule(TanhRNNCell(1, 32), UORO (state projection), Adam lr 1e-3, "
            "clip 1.0, one update per time step) on AddingTaskDataModule(streams=32, chunk_length=32): 32 optimizer "
            "steps per chunk, deterministic",
            online_model,
            online_data,
            {"deterministic": True},
            {
                "GradientNoiseMonitor": ("defaults", GradientNoiseMonitor),
                "OnlineEstimatorVarianceMonitor": ("defaults", OnlineEstimatorVarianceMonitor),
            },
        ),
    }


# --------------------------------------------------------------------------------------------- one timed fit
class LoopTimer(pl.Callback):
    """Wall time from ``on_train_start`` to ``on_train_end`` (first in the callback list)."""

    def __init__(self) -> None:
        self.start, self.seconds = 0.0, math.nan

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.seconds = time.perf_counter() - self.start


def instrument(callback: pl.Callback) -> tuple[dict[str, float], Callable[[], None]]:
    """Wrap every Lightning hook that ``callback``'s class overrides so that its time is added to the returned
    ``hook name -> seconds`` dict (instance attributes: Lightning calls ``getattr(callback, hook)``), and
    the monitors' logging (``lightning_ortho.callbacks.monitors.base.log_values``: every logger, ``callback_metrics``,
    the progress bar) so that its time inside those hooks is added under ``"log"``; and the function that puts the
    monitors' logging back."""
    seconds: dict[str, float] = {"log": 0.0}
    inside = [False]
    for name in dir(pl.Callback):
        if not (name.startswith("on_") or name in ("setup", "teardown")):
            continue
        if getattr(type(callback), name) is getattr(pl.Callback, name):
            continue

        original = getattr(callback, name)

        def wrapped(*args, __name=name, __original=original, **kwargs):
            start, inside[0] = time.perf_counter(), True
            try:
                return __original(*args, **kwargs)
            finally:
                inside[0] = False
                seconds[__name] = seconds.get(__name, 0.0) + time.perf_counter() - start

        setattr(callback, name, wrapped)

    original = monitor_module.log_values

    def log(*args, **kwargs):
        if not inside[0]:
            return original(*args, **kwargs)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds["log"] += time.perf_counter() - start

    monitor_module.log_values = log
    return seconds, lambda: setattr(monitor_module, "log_values", original)


def fit_once(scenario: Scenario, label: str, steps: int, quick: bool, accelerator: str, root: str) -> dict:
    """Train ``scenario``'s model for ``steps`` optimizer steps with the monitor ``label`` (or none); times and what
    the monitor did."""
    pl.seed_everything(0, verbose=False)
    model, data = scenario.model(quick), scenario.data(quick)
    timer = LoopTimer()
    callbacks: list[pl.Callback] = [timer]
    monitor, hooks, restore = None, {}, lambda: None
    if label != "none":
        monitor = scenario.monitors[label][1]()
        hooks, restore = instrument(monitor)
        callbacks.append(monitor)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=steps,
        logger=pl.loggers.CSVLogger(root, name=f"{scenario.name}-{label}"),  # the monitors log as in a user's run
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=root,
        callbacks=callbacks,
        **scenario.trainer,
    )
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model, datamodule=data)
        finally:
            restore()
    fit_s = time.perf_counter() - start
    result = {"loop_s": timer.seconds, "fit_s": fit_s, "steps": trainer.global_step}
    if monitor is not None:
        result["hook_s"] = sum(s for name, s in hooks.items() if name not in OUTSIDE_LOOP and name != "log")
        result["log_s"] = hooks["log"]
        result["hooks"] = {name: s for name, s in hooks.items() if name not in OUTSIDE_LOOP and name != "log"}
        result["measurements"] = len(monitor.history)
        result["every_n_steps"] = monitor.every_n_steps
        result["watched"] = sorted(monitor._watched)
        result["warnings"] = sorted(
            {str(w.message).split("\n")[0][:300] for w in caught if type(monitor).__name__ in str(w.message)}
        )
    return result


def measure_overhead(
    names, rounds: int, quick: bool, accelerator: str, log=print
) -> tuple[list[dict], dict[str, dict]]:
    """Rows of the overhead section (one per model and monitor, and a ``"none"`` row per model) and each model's
    setup (description, steps)."""
    rows, setups = [], {}
    all_scenarios = scenarios()
    with tempfile.TemporaryDirectory(prefix="bench_callbacks-") as root:
        for name in names:
            scenario = all_scenarios[name]
            steps = STEPS[name][1 if quick else 0]
            setups[name] = {"model": scenario.description, "steps": steps, "trainer": scenario.trainer}
            labels = ["none", *scenario.monitors]
            if not quick:  # warm-up: lazy imports, allocator, matplotlib's first PNG; not timed
                for label in labels:
                    fit_once(scenario, label, max(STEPS[name][1], steps // 4), quick, accelerator, root)

            def progress(round_index, timing, name=name, scenario=scenario, labels=labels):
                base = timing.results["none"][-1]
                log(
                    f"{name} round {round_index + 1}/{rounds}: none {base['loop_s']:.3f} s; "
                    + ", ".join(
                        f"{label.split(' ')[0]}{'*' if scenario.monitors[label][0] == 'recipe' else ''} "
                        f"x{timing.results[label][-1]['loop_s'] / base['loop_s']:.3f}"
                        for label in labels[1:]
                    )
                )

            # Each call is one fit; what is compared is the training loop's time it returns (loop_s), not the call's.
            timing = interleave(
                {
                    label: lambda label=label, scenario=scenario, steps=steps: fit_once(
                        scenario, label, steps, quick, accelerator, root
                    )
                    for label in labels
                },
                rounds=rounds,
                warmup=0,
                after_round=progress,
            )
            runs: dict[str, list[dict]] = timing.results
            base_loop = [r["loop_s"] for r in runs["none"]]
            base_fit = [r["fit_s"] for r in runs["none"]]
            rows.append(
                {
                    "section": "overhead",
                    "model": name,
                    "callback": "none",
                    "steps": runs["none"][0]["steps"],
                    "rounds": rounds,
                    "loop_s": median(base_loop),
                    "fit_s": median(base_fit),
                    "loop_s_rounds": base_loop,
                    "fit_s_rounds": base_fit,
                }
            )
            for label, (config, _) in scenario.monitors.items():
                mine = runs[label]
                loop = [r["loop_s"] for r in mine]
                fit = [r["fit_s"] for r in mine]
                ratios = [a / b for a, b in zip(loop, base_loop, strict=True)]
                fit_ratios = [a / b for a, b in zip(fit, base_fit, strict=True)]
                hook = median([r["hook_s"] for r in mine])
                log_s = median([r["log_s"] for r in mine])
                row = {
                    "section": "overhead",
                    "model": name,
                    "callback": label,
                    "config": config,
                    "every_n_steps": mine[0]["every_n_steps"],
                    "watched": mine[0]["watched"],
                    "measurements": mine[0]["measurements"],
                    "steps": mine[0]["steps"],
                    "rounds": rounds,
                    "loop_s": median(loop),
                    "fit_s": median(fit),
                    "loop_s_rounds": loop,
                    "fit_s_rounds": fit,
                    "ratio": median(ratios),
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                    "fit_ratio": median(fit_ratios),
                    "hook_s": hook,
                    "hook_share": hook / median(base_loop),
                    "hook_s_by_hook": {h: median([r["hooks"].get(h, 0.0) for r in mine]) for h in mine[0]["hooks"]},
                    "log_s": log_s,
                    "log_share": log_s / median(base_loop),
                    "holds": median(ratios) <= TARGET,
                }
                if mine[0]["warnings"]:
                    row["warnings"] = mine[0]["warnings"]
                rows.append(row)
                log(
                    f"  {name:6s} {label:40s} ratio {row['ratio']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]"
                    f"  hooks {100 * row['hook_share']:.1f} % (logging {100 * row['log_share']:.1f} %)"
                    f"  fit x{row['fit_ratio']:.3f}"
                    f"  ({row['measurements']} measurements)"
                )
            for label, reason in scenario.skipped.items():
                rows.append(
                    {"section": "overhead", "model": name, "callback": label, "config": "defaults", "skipped": reason}
                )
    return rows, setups


# ------------------------------------------------------------------------------------------- log-determinants
def logdet_functions(module: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """``method -> () -> (B,) log|det J|`` on the probe ``x``, as the monitor computes them."""
    monitor = JacobianDeterminantMonitor()

    def closed_form() -> torch.Tensor:
        with torch.no_grad():
            return module.log_abs_det_jacobian(x)

    return {
        "closed_form": closed_form,
        "monitor_closed_form": lambda: monitor._closed_form("probe", module, x)[0],
        "autograd": lambda: monitor._autograd("probe", module, x)[0],
    }


def measure_logdet(dims, rounds: int, min_time: float, probe: int = LOGDET_PROBE, log=print) -> list[dict]:
    rows = []
    for d in dims:
        torch.manual_seed(d)
        module = AuxiliaryReflection(d, invertible=True)
        x = torch.randn(probe, d)
        functions = logdet_functions(module, x)
        exact = copy.deepcopy(module).double()
        closed = logdet_functions(exact, x.double())["closed_form"]()
        autograd = logdet_functions(exact, x.double())["autograd"]()
        difference = float((closed - autograd).abs().max())
        timing = interleave(functions, rounds=rounds, min_time=min_time)
        row = {"section": "logdet", "d": d, "probe_size": probe, "rounds": rounds}
        for method in LOGDET_METHODS:
            row[f"{method}_ms"] = 1e3 * timing.median(method)
        row["autograd_over_closed_form"] = row["autograd_ms"] / row["closed_form_ms"]
        row["monitor_closed_form_over_closed_form"] = row["monitor_closed_form_ms"] / row["closed_form_ms"]
        row["max_abs_difference_f64"] = difference
        row["max_abs_log_det_f64"] = float(autograd.abs().max())
        row["agree"] = difference <= AGREEMENT
        rows.append(row)
        log(
            f"d={d:5d} closed form {row['closed_form_ms']:9.3f} ms  monitor closed-form path "
            f"{row['monitor_closed_form_ms']:9.3f} ms  autograd {row['autograd_ms']:9.3f} ms  "
            f"x{row['autograd_over_closed_form']:.1f}  |diff| {difference:.1e}"
        )
    return rows


def fitted_exponent(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(time) against log(d)."""
    xs = [math.log(d) for d, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def exponents(rows: list[dict], from_d: int = FIT_FROM_D) -> dict[str, dict]:
    """``method -> {"exponent", "dims"}`` for the closed form and the autograd path, fitted over the logdet rows
    with ``d >= from_d`` (three or more). (The monitor's closed-form path changes regime at max_autograd_dim, where
    it stops building dense Jacobians for the sign: no single exponent describes it.)"""
    logdet = sorted((r for r in rows if r.get("section") == "logdet" and r["d"] >= from_d), key=lambda r: r["d"])
    if len(logdet) < 3:
        return {}
    dims = [r["d"] for r in logdet]
    return {
        method: {"exponent": round(fitted_exponent([(r["d"], r[f"{method}_ms"]) for r in logdet]), 3), "dims": dims}
        for method in ("closed_form", "autograd")
    }


# ------------------------------------------------------------------------------------------------------ claims
MODEL_LABELS = {"fcnn": "the digits FCNN", "glow": "the digits Glow", "online": "the online RNN (adding task)"}


def claims_from(rows: list[dict]) -> list[dict]:
    claims = []
    for row in rows:
        if row.get("section") != "overhead" or row["callback"] == "none" or "skipped" in row:
            continue
        config = " at its defaults" if row["config"] == "defaults" else ""
        claims.append(
            {
                "claim": f"{row['callback']}{config} adds <= 5 % to training on {MODEL_LABELS[row['model']]} "
                f"({row['steps']} steps, every_n_steps={row['every_n_steps']}); figure = time ratio",
                "figure": round(row["ratio"], 3),
                "holds": row["ratio"] <= TARGET,
            }
        )
    logdet = {r["d"]: r for r in rows if r.get("section") == "logdet"}
    if 256 in logdet:
        row = logdet[256]
        claims.append(
            {
                "claim": f"closed-form log-determinant (AuxiliaryReflection(256, invertible=True), probe of "
                f"{row['probe_size']} rows) faster than the monitor's autograd path at d = 256; figure = speed-up",
                "figure": round(row["autograd_over_closed_form"], 2),
                "holds": row["autograd_over_closed_form"] > 1,
            }
        )
    if logdet:
        worst = max(r["max_abs_difference_f64"] for r in logdet.values())
        claims.append(
            {
                "claim": f"closed form equals autograd slogdet in float64 to {AGREEMENT:g} at every d "
                f"({', '.join(str(d) for d in sorted(logdet))}); figure = largest absolute difference",
                "figure": float(f"{worst:.3g}"),
                "holds": worst <= AGREEMENT,
            }
        )
    fits = exponents(rows)
    if fits:
        dims = fits["closed_form"]["dims"]
        closed, autograd = fits["closed_form"]["exponent"], fits["autograd"]["exponent"]
        claims.append(
            {
                "claim": f"autograd's time grows faster with d than the closed form's: fitted exponents over d = "
                f"{dims[0]}..{dims[-1]}, closed form {closed}, autograd {autograd}; figure = difference",
                "figure": round(autograd - closed, 2),
                "holds": autograd > closed,
            }
        )
    return claims


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    overhead = [r for r in rows if r.get("section") == "overhead" and "ratio" in r]
    logdet = sorted((r for r in rows if r.get("section") == "logdet"), key=lambda r: r["d"])
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    if overhead:
        labels = [
            f"{r['model']}: {r['callback'].split(' (')[0]}{' (recipe)' if r['config'] == 'recipe' else ''}"
            for r in overhead
        ]
        positions = range(len(overhead))
        axes[0].barh(list(positions), [r["ratio"] for r in overhead], color="tab:blue")
        axes[0].errorbar(
            [r["ratio"] for r in overhead],
            list(positions),
            xerr=[[r["ratio"] - r["ratio_min"] for r in overhead], [r["ratio_max"] - r["ratio"] for r in overhead]],
            fmt="none",
            color="black",
            lw=0.8,
        )
        axes[0].axvline(TARGET, color="red", lw=0.8, ls="--")
        axes[0].axvline(1.0, color="gray", lw=0.8)
        axes[0].set_yticks(list(positions), labels, fontsize=7)
        axes[0].invert_yaxis()
        axes[0].set(xlabel="training time with the monitor / without (median, min-max)", title="overhead")
    if logdet:
        for method in LOGDET_METHODS:
            axes[1].plot([r["d"] for r in logdet], [r[f"{method}_ms"] for r in logdet], marker="o", label=method)
        axes[1].set(xscale="log", yscale="log", xlabel="d", ylabel="ms per probe batch", title="log|det J|")
        axes[1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("bench_callbacks", __doc__, threads=1)
    parser.add_argument("--models", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-logdet", action="store_true")
    args = parse_args(parser, argv)
    # Lightning's info lines off for the timed fits; the levels are given back at the end, since tests call main()
    # in their own process and later tests read those loggers.
    quiet = [logging.getLogger(name) for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    try:
        with configured(args) as device:
            allocator = keep_freed_memory() if device.type == "cpu" else None
            started, load_before = time.perf_counter(), os.getloadavg()
            rows: list[dict] = []
            extra: dict = {"threads": args.threads, "allocator": allocator or "default", "target_ratio": TARGET}
            if not args.skip_overhead:
                rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
                accelerator = "gpu" if device.type == "cuda" else "cpu"
                overhead, setups = measure_overhead(args.models, rounds, args.quick, accelerator)
                rows += overhead
                extra["overhead"] = {"rounds": rounds, "models": setups}
            if not args.skip_logdet:
                dims = QUICK_LOGDET_DIMS if args.quick else LOGDET_DIMS
                logdet_rounds = QUICK_LOGDET_ROUNDS if args.quick else LOGDET_ROUNDS
                min_time = QUICK_LOGDET_MIN_TIME if args.quick else LOGDET_MIN_TIME
                rows += measure_logdet(dims, logdet_rounds, min_time)
                extra["logdet"] = {
                    "module": "AuxiliaryReflection(d, invertible=True), float32",
                    "probe_size": LOGDET_PROBE,
                    "rounds": logdet_rounds,
                    "min_time_s": min_time,
                    "max_autograd_dim": JacobianDeterminantMonitor().max_autograd_dim,
                    "fits": exponents(rows),
                }
            extra["total_seconds"] = round(time.perf_counter() - started, 1)
            extra["load_average"] = {
                "start": [round(v, 2) for v in load_before],
                "end": [round(v, 2) for v in os.getloadavg()],
            }
            claims = claims_from(rows)
            path = write_result("bench_callbacks", device, rows, claims, args, extra=extra)
            plot(rows, result_path("bench_callbacks", device, args, ".png"))
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    print_claims(claims)
    print(f"wrote {path} ({extra['total_seconds']} s)")
    return path


if __name__ == "__main__":
    main()
