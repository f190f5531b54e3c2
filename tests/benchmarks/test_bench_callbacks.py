"""benchmarks/bench_callbacks.py: the --quick run writes the result schema, its ratios and claims follow from the
stored round times, its log-determinants agree with an autograd Jacobian computed here, and the results-page table renders."""

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from lightning_ortho.nn import AuxiliaryReflection
from tests.benchmarks.helpers import load

bench = load("bench_callbacks")
renderer = load("bench_callbacks_render")
report = load("report")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench_callbacks")
    path = bench.main(["--quick", "--output", str(folder)])
    return json.loads(Path(path).read_text()), folder


def test_quick_benchmark_writes_schema(quick):
    data, folder = quick
    assert data["benchmark"] == "bench_callbacks" and data["hardware"] == "cpu1" and data["threads"] == 1
    assert {"torch", "date", "command", "rows", "claims", "overhead", "logdet", "total_seconds"} <= set(data)
    overhead = [r for r in data["rows"] if r["section"] == "overhead"]
    expected = {(name, label) for name, scenario in bench.scenarios().items() for label in ("none", *scenario.monitors)}
    assert {(r["model"], r["callback"]) for r in overhead if "skipped" not in r} == expected
    skipped = {(r["model"], r["callback"]): r["skipped"] for r in overhead if "skipped" in r}
    assert list(skipped) == [("fcnn", "InvertibilityMonitor"), ("glow", "OrthogonalityMonitor")]
    assert "no module this monitor can measure" in skipped["glow", "OrthogonalityMonitor"]
    for row in overhead:
        if "skipped" in row:
            continue
        assert row["steps"] == bench.STEPS[row["model"]][1] and row["rounds"] == 1
        assert row["loop_s"] > 0 and row["fit_s"] > row["loop_s"]
        if row["callback"] != "none":
            assert row["measurements"] >= 1, row  # every monitor measured at least once (at the last step)
            assert row["watched"] and 0 <= row["log_s"] <= row["hook_s"] < row["loop_s"]
    assert (folder / f"bench_callbacks-{data['hardware']}-quick.png").exists() == _has_matplotlib()


def test_ratios_and_claims_follow_from_the_round_times(quick):
    data, _ = quick
    overhead = [r for r in data["rows"] if r["section"] == "overhead" and "skipped" not in r]
    base = {r["model"]: r for r in overhead if r["callback"] == "none"}
    claims = {c["claim"]: c for c in data["claims"]}
    assert all(set(c) == {"claim", "figure", "holds"} and isinstance(c["holds"], bool) for c in data["claims"])
    assert not any("|" in c["claim"] for c in data["claims"])  # a pipe would split the results table's cell
    for row in overhead:
        if row["callback"] == "none":
            continue
        baseline = base[row["model"]]["loop_s_rounds"]
        ratios = [a / b for a, b in zip(row["loop_s_rounds"], baseline, strict=True)]
        assert math.isclose(row["ratio"], statistics.median(ratios))
        assert math.isclose(row["hook_share"], row["hook_s"] / statistics.median(baseline))
        start = row["callback"] + (" at its defaults adds" if row["config"] == "defaults" else " adds")
        where = f"on {bench.MODEL_LABELS[row['model']]} ({row['steps']} steps"
        [claim] = [c for text, c in claims.items() if text.startswith(start) and where in text]
        assert claim["figure"] == round(row["ratio"], 3) and claim["holds"] == (row["ratio"] <= bench.TARGET)


def test_logdet_rows_agree_with_an_autograd_jacobian_computed_here(quick):
    data, _ = quick
    logdet = {r["d"]: r for r in data["rows"] if r["section"] == "logdet"}
    assert sorted(logdet) == list(bench.QUICK_LOGDET_DIMS)
    for row in logdet.values():
        assert row["agree"] and row["max_abs_difference_f64"] <= bench.AGREEMENT
        assert math.isclose(row["autograd_over_closed_form"], row["autograd_ms"] / row["closed_form_ms"])
    # The benchmark's module and probe for d = 16 (same seed), in float64: closed form against slogdet of the
    # Jacobian from torch.autograd.functional.jacobian, one row at a time (not the monitor's vmap path).
    d = 16
    torch.manual_seed(d)
    module = AuxiliaryReflection(d, invertible=True)
    x = torch.randn(bench.LOGDET_PROBE, d)
    module = module.double()
    with torch.no_grad():
        closed = module.log_abs_det_jacobian(x.double())
    jacobians = torch.stack([torch.autograd.functional.jacobian(module, row) for row in x.double()])
    _, reference = torch.linalg.slogdet(jacobians)
    assert torch.allclose(closed, reference, rtol=0, atol=1e-8)
    assert math.isclose(logdet[d]["max_abs_log_det_f64"], float(reference.abs().max()), rel_tol=1e-9)
    claim = next(c for c in data["claims"] if c["claim"].startswith("closed form equals autograd"))
    assert claim["holds"] and claim["figure"] <= bench.AGREEMENT


def test_report_renders_the_quick_result(quick):
    data, _ = quick
    text = renderer.render(data)
    assert text.startswith("Reproduce: `python -m benchmarks.bench_callbacks`")
    assert (
        "| fcnn | OrthogonalityMonitor | 50 |" in text and "| glow | OrthogonalityMonitor | | | | skipped | | |" in text
    )
    assert "| 16 |" in text and "| 32 |" in text
    assert text.endswith(report.claims_table(data["claims"])[-1])


def test_claims_from_rows():
    rows = [
        {"section": "overhead", "model": "fcnn", "callback": "none", "steps": 400},
        {
            "section": "overhead",
            "model": "fcnn",
            "callback": "A",
            "config": "defaults",
            "steps": 400,
            "every_n_steps": 50,
            "ratio": 1.04,
        },
        {
            "section": "overhead",
            "model": "online",
            "callback": "B",
            "config": "defaults",
            "steps": 960,
            "every_n_steps": 100,
            "ratio": 1.2,
        },
        {"section": "overhead", "model": "glow", "callback": "C", "config": "defaults", "skipped": "nothing"},
    ]
    for d, closed, autograd in ((128, 1.0, 8.0), (256, 8.0, 64.0 * 2), (512, 64.0, 512.0 * 4)):
        rows.append(
            {
                "section": "logdet",
                "d": d,
                "probe_size": 8,
                "closed_form_ms": closed,
                "monitor_closed_form_ms": closed,
                "autograd_ms": autograd,
                "autograd_over_closed_form": autograd / closed,
                "max_abs_difference_f64": 1e-12,
            }
        )
    claims = {c["claim"]: (c["figure"], c["holds"]) for c in bench.claims_from(rows)}
    assert claims[
        "A at its defaults adds <= 5 % to training on the digits FCNN (400 steps, every_n_steps=50); "
        "figure = time ratio"
    ] == (1.04, True)
    assert claims[
        "B at its defaults adds <= 5 % to training on the online RNN (adding task) (960 steps, "
        "every_n_steps=100); figure = time ratio"
    ] == (1.2, False)
    assert claims[
        "closed-form log-determinant (AuxiliaryReflection(256, invertible=True), probe of 8 rows) faster than "
        "the monitor's autograd path at d = 256; figure = speed-up"
    ] == (16.0, True)
    assert claims[
        "closed form equals autograd slogdet in float64 to 1e-08 at every d (128, 256, 512); figure = "
        "largest absolute difference"
    ] == (1e-12, True)
    assert claims[
        "autograd's time grows faster with d than the closed form's: fitted exponents over d = 128..512, "
        "closed form 3.0, autograd 4.0; figure = difference"
    ] == (1.0, True)
    assert len(claims) == 5
    assert math.isclose(bench.fitted_exponent([(2, 8.0), (4, 64.0), (8, 512.0)]), 3.0)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
