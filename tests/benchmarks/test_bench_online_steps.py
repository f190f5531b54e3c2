"""benchmarks/bench_online_steps.py: the NumPy references of benchmarks/_numpy_online.py compute our estimators'
numbers (float64, a few steps; the check fails where they do not), and the --quick run writes the result schema with
the agreement of every row, its claims and its results-page table (not the timings)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.benchmarks.helpers import ROOT, load, results_section

bench = load("bench_online_steps")
renderer = load("bench_online_steps_render")
reference = load("_numpy_online")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench_online_steps")
    threads = torch.get_num_threads()
    path = Path(bench.main(["--quick", "--output", str(folder)]))
    assert torch.get_num_threads() == threads  # --threads 1 is given back
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("name", bench.ESTIMATORS)
@pytest.mark.parametrize("hidden", [5, 16])
def test_numpy_reference_computes_our_numbers_in_float64(name, hidden):
    # the new state and every gradient entry, 6 steps from a random state; UORO and KF-RTRL with the noise replayed
    assert bench.agreement(name, hidden, torch.float64, 6) <= 1e-10


@pytest.mark.parametrize("name", bench.ESTIMATORS)
def test_numpy_reference_computes_our_numbers_in_float32(name):
    assert bench.agreement(name, 16, torch.float32, 6) <= bench.TOLERANCE["float32"]


@pytest.mark.parametrize("name", bench.ESTIMATORS)
def test_the_check_fails_where_the_reference_computes_something_else(name):
    # a parameter of the reference moved by 1e-3: the state or a gradient moves by far more than the tolerance
    assert bench.agreement(name, 8, torch.float64, 3, perturb=1e-3) > 1e-5


@pytest.mark.parametrize("name", ["uoro", "kf_rtrl"])
def test_the_noise_is_what_the_estimator_draws(name):
    # NumPy's own generator draws other noise: the estimates differ (the replayed noise is what makes them agree).
    # KF-RTRL's estimate (A^T g) u^T is the same under a flip of both its signs (u and A change sign together), so
    # only some draws tell: over 12 steps NumPy's signs and torch's part somewhere.
    assert bench.agreement(name, 8, torch.float64, 12, replay_noise=False) > 1e-3


def test_generator_noise_replays_uoro_draws():
    # the first step of UORO from zero: h_tilde = beta * tau * nu, the direction of the first normal draw
    cell = bench.make_cell("uoro", 6, torch.float64)
    estimator = bench.UORO(cell, generator=3)
    state = estimator.initial_state(torch.zeros(1, 6, dtype=torch.float64))
    _, state = estimator.step(torch.randn(1, bench.INPUT_SIZE, dtype=torch.float64), state)
    noise = bench.GeneratorNoise(3, torch.float64)
    nu, tau = noise.normal(6), noise.signs(1)[0]
    h_tilde = state.tensors["h_tilde"][0].numpy()
    assert tau in (-1.0, 1.0)
    assert np.allclose(h_tilde / np.linalg.norm(h_tilde), tau * nu / np.linalg.norm(nu), atol=1e-12)


def test_numpy_noise_is_normal_and_fair_signs_in_the_dtype():
    noise = reference.Noise(0, np.float32)
    normal, signs = noise.normal(20000), noise.signs(20000)
    assert normal.dtype == np.float32 and signs.dtype == np.float32
    assert abs(normal.mean()) < 0.05 and abs(normal.std() - 1) < 0.05
    assert set(np.unique(signs)) == {-1.0, 1.0} and abs(signs.mean()) < 0.05


def test_numpy_references_keep_the_dtype():
    # float32 arrays stay float32 (and the LRU's state complex64): NumPy would silently widen on a float64 constant
    for name in bench.ESTIMATORS:
        cell = bench.make_cell(name, 4, torch.float32)
        ref = bench.make_reference(name, cell)
        h0, inputs, grads = bench.make_data(name, 4, torch.float32, 2)
        ref.initial(h0[0].numpy())
        h = ref.step(inputs[0][0].numpy())
        assert h.dtype == (np.complex64 if name == "diagonal_rtrl" else np.float32), name
        if name != "forward":
            assert {g.dtype for g in ref.gradient(grads[0][0].numpy()).values()} == {np.dtype(np.float32)}, name


def test_quick_run_writes_every_row(quick):
    path, data = quick
    assert path.name == f"bench_online_steps-{data['hardware']}-quick.json" and data["hardware"] == "cpu1"
    assert data["benchmark"] == "bench_online_steps"
    assert data["command"].startswith("python -m benchmarks.bench_online_steps --quick")
    assert {"torch", "date", "hardware_description", "rows", "claims", "setup", "total_seconds"} <= set(data)
    setup = data["setup"]
    assert setup["B"] == 1 and setup["threads"] == 1 and setup["input_size"] == bench.INPUT_SIZE
    assert setup["rflo_tau"] == bench.RFLO_TAU and setup["tbptt_k"] == bench.TBPTT_K and setup["numpy_threads"]
    hidden = bench.HIDDEN[1]
    assert [(r["dtype"], r["H"], r["estimator"]) for r in data["rows"]] == [
        (d, h, n) for d in bench.DTYPES for h in hidden for n in bench.ESTIMATORS
    ]
    for row in data["rows"]:
        assert row["B"] == 1 and row["rounds"] == 1 and row["steps_per_call"] == bench.STEPS_PER_CALL[1]
        assert row["ours_ms"] > 0 and row["numpy_ms"] > 0 and row["ratio"] > 0 and row["ratio_of_best"] > 0
        assert row["goal"] == (1.5 if row["estimator"] == "forward" else 1.0)
        assert row["holds"] == (row["ratio"] <= row["goal"])
        kind = "LinearRecurrentUnit" if row["estimator"] == "diagonal_rtrl" else "TanhRNNCell"
        assert row["cell"] == f"{kind}({bench.INPUT_SIZE}, {row['H']})"
        agreement = row["agreement"]
        assert agreement["steps"] == bench.CHECK_STEPS[1] and agreement["tolerance"] == bench.TOLERANCE[row["dtype"]]
        assert agreement["agrees"] and 0 <= agreement["max_error"] <= agreement["tolerance"], row


def test_claims_are_computed_from_the_rows(quick):
    _, data = quick
    assert data["claims"] == bench.claims_from(data["rows"])
    assert len(data["claims"]) == len(bench.ESTIMATORS) + len(bench.DTYPES)
    assert all(set(c) == {"claim", "figure", "holds"} and isinstance(c["holds"], bool) for c in data["claims"])
    agreement = [c for c in data["claims"] if c["claim"].startswith("every NumPy reference")]
    assert [c["holds"] for c in agreement] == [True, True]


def _row(name, hidden, dtype, ratio, error=0.0):
    return {
        "estimator": name,
        "H": hidden,
        "dtype": dtype,
        "ratio": ratio,
        "ours_ms": ratio * 0.1,
        "numpy_ms": 0.1,
        "goal": bench.GOALS[name],
        "holds": ratio <= bench.GOALS[name],
        "agreement": {"steps": 6, "max_error": error, "tolerance": bench.TOLERANCE[dtype], "agrees": error <= 1e-10},
    }


def test_claims_and_table_from_rows():
    rows = [
        _row("forward", 32, "float64", 1.4),
        _row("forward", 64, "float64", 1.2),
        _row("rtrl", 32, "float64", 0.9),
        _row("rtrl", 64, "float64", 1.3, error=1e-6),  # over the goal, and a reference that disagrees
    ]
    claims = {c["claim"]: (c["figure"], c["holds"]) for c in bench.claims_from(rows)}
    assert claims == {
        "forward step, one stream, one thread: ours / NumPy <= 1.5x at H = 32, H = 64, float64 (the largest ratio)": (
            1.4,
            True,
        ),
        "RTRL step + gradient, one stream, one thread: ours / NumPy <= 1x at H = 32, H = 64, float64 (the largest "
        "ratio)": (1.3, False),
        "every NumPy reference computes our state and gradients, float64: largest relative difference over 6 steps "
        "<= 1e-10": (1e-6, False),
    }
    data = {"hardware": "cpu1", "torch": "2", "date": "d", "command": "c", "rows": rows, "claims": []}
    lines = renderer.render(data).splitlines()
    assert "| estimator | goal | H = 32, float64 | H = 64, float64 |" in lines
    assert "| forward | <= 1.5x | 1.40x (0.14 / 0.1) | 1.20x (0.12 / 0.1) |" in lines
    assert "| RTRL | <= 1x | 0.90x (0.09 / 0.1) | **1.30x** (0.13 / 0.1) (disagrees) |" in lines


def test_results_page_shows_the_committed_table():
    committed = sorted((ROOT / "benchmarks" / "results").glob("bench_online_steps-*.json"))
    committed = [p for p in committed if not p.stem.endswith("-quick")]
    assert committed, "no committed result of bench_online_steps"
    section = results_section("bench_online_steps")
    for path in committed:
        assert renderer.render(json.loads(path.read_text())) in section
