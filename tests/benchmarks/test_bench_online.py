"""benchmarks/bench_online.py: the --quick run writes the result schema, and the claims and the results-page table are
computed from the rows."""

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load

bench = load("bench_online")
renderer = load("bench_online_render")


def quick_run(tmp_path, *argv):
    path = bench.main(["--quick", "--rounds", "1", "--output", str(tmp_path), *argv])
    return json.loads(Path(path).read_text())


def test_quick_benchmark_writes_schema(tmp_path):
    data = quick_run(tmp_path)
    assert data["benchmark"] == "bench_online" and data["hardware"].startswith("cpu")
    assert {"torch", "date", "command", "rows", "claims", "setup", "memory_method"} <= set(data)
    assert data["setup"]["tbptt_k"] == bench.TBPTT_K and data["setup"]["timing_rounds"] == 1
    timing = [r for r in data["rows"] if r["section"] == "time"]
    assert {(r["method"], r["projection"], r["H"]) for r in timing} == {
        (*method, hidden) for method in bench.METHODS.values() for hidden in bench.QUICK_TIME_HIDDEN
    }
    for row in timing:
        assert "skipped" not in row and row["B"] == bench.BATCH and row["rounds"] == 1, row
        assert row["time_per_step_ms"] > 0 and row["ratio_to_forward_step"] > 0 and row["T"] >= bench.MIN_STEPS
        assert (row["method"] == "tbptt") == ("k" in row)
    forward = [r for r in timing if r["method"] == "forward"]
    assert all(r["ratio_to_forward_step"] == 1.0 for r in forward)

    memory = [r for r in data["rows"] if r["section"] == "memory"]
    assert [
        (bench.METHODS[k], h, t)
        for h in bench.QUICK_MEMORY_HIDDEN
        for t in bench.QUICK_LENGTHS
        for k in bench.QUICK_MEMORY_METHODS
    ] == [((r["method"], r["projection"]), r["H"], r["T"]) for r in memory]
    unsupported = bench.memory_support()
    claims = {c["claim"]: c for c in data["claims"]}
    assert all(set(c) == {"claim", "figure", "holds"} and isinstance(c["holds"], bool) for c in data["claims"])
    assert {f"UORO (state) step <= 3x a forward step, H={h}" for h in bench.QUICK_TIME_HIDDEN} <= set(claims)
    assert any(c.startswith("RTRL time per step grows like H^4") for c in claims)
    if unsupported:  # no /proc: the rows say why instead of the run crashing
        assert all(r["skipped"] == unsupported for r in memory)
        return
    for row in memory:
        assert "skipped" not in row, row
        assert row["run_s"] > 0 and row["baseline_rss_mb"] > 0  # peak memory: the BPTT growth check below
        assert row["in_use_mb"] < 1 and row["heap_mb"] < 5  # tiny H: nothing big is kept
        assert (row["state_mb"] is None) == (row["method"] in ("forward", "bptt"))
    bptt = {r["T"]: r["peak_memory_mb"] for r in memory if r["method"] == "bptt"}
    low, high = bench.QUICK_LENGTHS
    assert bptt[high] > bptt[low] + 0.5  # BPTT's graph grows by kilobytes per step: visible even at T = 200
    hidden = bench.QUICK_MEMORY_HIDDEN[0]
    assert f"UORO (state) peak memory at T={high} <= 1.1x T={low}, H={hidden}" in claims
    assert f"BPTT peak memory grows with T: T={high} >= 10x T={low}, H={hidden}" in claims
    assert (tmp_path / f"bench_online-{data['hardware']}-quick.png").exists() == _has_matplotlib()

    text = renderer.render(data)
    assert "| method | H = 8 | H = 16 |" in text and "| 8 | BPTT (full) |" in text
    assert "| UORO (state) peak memory at T=200 <= 1.1x T=20, H=8 |" in text


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def time_row(method, projection, hidden, ms, forward_ms):
    row = {"section": "time", "method": method, "projection": projection, "H": hidden, "B": 8, "T": 100}
    return row | {"time_per_step_ms": ms, "ratio_to_forward_step": ms / forward_ms, "rounds": 5}


def memory_row(method, projection, hidden, steps, mb, state=None):
    row = {"section": "memory", "method": method, "projection": projection, "H": hidden, "B": 8, "T": steps}
    return row | {"peak_memory_mb": mb, "state_mb": state}


def test_claims_are_computed_from_rows():
    rows = [
        time_row("forward", None, 32, 0.05, 0.05),
        time_row("uoro", "state", 32, 0.10, 0.05),  # 2x: holds
        time_row("uoro", "state", 128, 0.50, 0.1),  # 5x: does not
        time_row("rtrl", None, 32, 1.0, 0.05),
        time_row("rtrl", None, 64, 16.0, 0.05),
        time_row("rtrl", None, 128, 256.0, 0.05),  # exactly H^4
        {"section": "time", "method": "rtrl", "projection": None, "H": 512, "B": 8, "skipped": "too big"},
        memory_row("uoro", "state", 32, 100, 0.50, 0.07),
        memory_row("uoro", "state", 32, 1000, 0.52, 0.07),
        memory_row("uoro", "state", 32, 10000, 0.56, 0.07),  # 1.12x T = 100: does not hold
        memory_row("uoro", "state", 128, 100, 5.0, 0.6),
        memory_row("uoro", "state", 128, 10000, 5.1, 0.6),
        memory_row("uoro", "state", 512, 100, 50.0, 8.0),  # one T only: no claim at H = 512
        {"section": "memory", "method": "uoro", "projection": "state", "H": 512, "T": 10000, "skipped": "budget"},
        memory_row("uoro", "parameter", 32, 100, 1.0),  # other projections make no claim
        memory_row("uoro", "parameter", 32, 10000, 9.0),
        memory_row("bptt", None, 32, 100, 1.0),
        memory_row("bptt", None, 32, 10000, 130.0),
        memory_row("bptt", None, 128, 100, 2.0),
        memory_row("bptt", None, 128, 10000, 15.0),  # 7.5x: does not hold
    ]
    claims = {c["claim"]: (c["figure"], c["holds"]) for c in bench.claims_from(rows)}
    assert claims == {
        "UORO (state) peak memory at T=10000 <= 1.1x T=100, H=32": (1.12, False),
        "UORO (state) peak memory at T=10000 <= 1.1x T=100, H=128": (1.02, True),
        "UORO (state) step <= 3x a forward step, H=32": (2.0, True),
        "UORO (state) step <= 3x a forward step, H=128": (5.0, False),
        "RTRL time per step grows like H^4 (B H^2 P multiply-adds): fitted exponent over H = 32, 64, 128 >= 3": (
            4.0,
            True,
        ),
        "... its local exponent between the two largest H (64 -> 128) >= 3": (4.0, True),
        "BPTT peak memory grows with T: T=10000 >= 10x T=100, H=32": (130.0, True),
        "BPTT peak memory grows with T: T=10000 >= 10x T=100, H=128": (7.5, False),
    }


def test_rtrl_is_skipped_where_its_influence_matrix_is_gigabytes():
    reason = bench.skip_reason("rtrl", 512)
    assert reason.startswith("RTRL's influence matrix at H=512 is B x H x P = 8 x 512 x 279,040 floats = 4.3 GiB")
    assert bench.skip_reason("rtrl", 128) is None and bench.skip_reason("uoro_state", 512) is None
    assert math.isclose(bench.fitted_exponent([(2, 8.0), (4, 64.0), (8, 512.0)]), 3.0)


def test_report_renders_times_memory_and_skips():
    data = {
        "hardware": "cpu2",
        "torch": "2.14.1",
        "date": "2026-12-01",
        "command": "python benchmarks/bench_online.py",
        "setup": {"cell": "TanhRNNCell(input_size=32, H)", "readout": "a readout", "B": 8, "timing_rounds": 5},
        "memory_method": "peak RSS",
        "rows": [
            time_row("forward", None, 32, 0.05, 0.05),
            time_row("uoro", "state", 32, 1.0, 0.05),
            {**time_row("tbptt", None, 32, 5.0, 0.05), "k": 10},
            {"section": "time", "method": "rtrl", "projection": None, "H": 512, "B": 8, "skipped": "4.3 GiB"},
            memory_row("bptt", None, 32, 100, 1.234),
            {**memory_row("bptt", None, 32, 10000, 130.4), "in_use_mb": 0.004},
            memory_row("uoro", "state", 32, 100, 0.5, 0.0655),
            {"section": "memory", "method": "uoro", "projection": "state", "H": 32, "T": 10000, "skipped": "budget"},
            {"section": "memory", "method": "rtrl", "projection": None, "H": 512, "T": 100, "skipped": "4.3 GiB"},
            {"section": "memory", "method": "rtrl", "projection": None, "H": 512, "T": 10000, "skipped": "4.3 GiB"},
        ],
        "claims": [{"claim": "c", "figure": 1.5, "holds": False}],
    }
    text = renderer.render(data)
    assert "| method | H = 32 | H = 512 |" in text
    assert "| forward step (no_grad) | 0.05 ms |  |" in text
    assert "| UORO (state) | 1 ms (20.0x) |  |" in text and "| TruncatedBPTT (k=10) | 5 ms (100.0x) |  |" in text
    assert "| RTRL |  | skipped |" in text
    assert (
        "| 32 | BPTT (full) | 1.23 | 130 (0.00) |  |" in text
        and "| 32 | UORO (state) | 0.50 | skipped | 0.07 |" in text
    )
    assert "| 512 | RTRL | skipped | skipped |  |" in text
    assert "- RTRL at H = 512 (timing and every T): 4.3 GiB." in text
    assert "- UORO (state) at H = 32 (T = 10000): budget." in text
    assert text.endswith("| c | 1.5 | **no** |")


@pytest.mark.parametrize("key", ["uoro_state", "tbptt", "bptt"])
def test_runner_accumulates_finite_gradients(key):
    problem = bench.Problem(8)
    runner = bench.Runner(key, problem)
    runner.run(bench.TBPTT_K + 3)
    assert runner.t == bench.TBPTT_K + 3
    assert all(g.isfinite().all() and g.abs().sum() > 0 for g in runner.grads)
