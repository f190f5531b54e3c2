"""benchmarks/online_family.py: the quick run's result file (structure, figures in range, claims computed from the
measured rows) and the claims' logic on hand-made rows."""

import copy
import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.helpers import ROOT, load

QUALITY = {"total_variance", "squared_bias", "squared_bias_se", "relative_variance", "relative_bias", "cosine", "draws"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("online_family")
    path = Path(load("online_family").main(["--quick", "--output", str(out)]))
    return path, json.loads(path.read_text())


def test_quick_run_measures_every_estimator_of_every_task(quick):
    script = load("online_family")
    path, data = quick
    assert path.name.startswith("online_family-cpu1") and path.name.endswith("-quick.json")
    assert data["benchmark"] == "online_family" and data["hardware"] == "cpu1"
    assert {(r["task"], r["method"]) for r in data["rows"]} == {
        (task, method) for task, methods in script.QUICK.items() for method in methods
    }
    for row in data["rows"]:
        for when in ("initial", "trained"):
            q = row[when]
            assert QUALITY <= set(q) and -1 <= q["cosine"] <= 1 + 1e-9 and q["total_variance"] >= 0
            stochastic = "UORO" in row["method"] or "KF-RTRL" in row["method"]
            assert q["draws"] == (data["setup"]["draws"] if stochastic else 1)
            assert (q["total_variance"] > 0) == stochastic
        assert row["ms_per_step"] > 0 and row["ms_per_step_median"] >= row["ms_per_step"]
        budget = data["setup"]["long_seconds" if row["task"] == "long copy" else "seconds"]
        assert row["train_seconds"] >= budget and row["optimizer_steps"] > 0 and row["curve"]
        assert math.isfinite(row["val_loss"]) and row["val_loss"] > 0
    # exact estimators: the estimate is the gradient
    for row in data["rows"]:
        if row["method"] in ("RTRL", "LRU, diagonal RTRL"):
            assert row["initial"]["cosine"] == pytest.approx(1, abs=1e-5)
            assert abs(row["initial"]["relative_bias"]) < 1e-8
    # RTRL's state: the hidden state and the H x P influence, float32
    rtrl = next(r for r in data["rows"] if r["method"] == "RTRL")
    hidden = data["setup"]["hidden"]
    assert rtrl["state_bytes_per_stream"] == 4 * hidden * (1 + rtrl["parameters"])
    assert (path.parent / path.name.replace(".json", ".png")).exists()


def test_quick_claims_are_computed_from_its_rows_and_render(quick):
    script = load("online_family")
    _, data = quick
    assert len(data["claims"]) == 4 and all({"claim", "figure", "holds"} <= set(c) for c in data["claims"])
    assert data["claims"] == json.loads(json.dumps(script.claims(data["rows"])))
    table = load("online_family_render").render(data)
    assert table.count("\n| ") >= len(data["rows"]) + len(data["claims"])


def row(task, method, *, variance=1.0, cosine=0.5, draws=10, **training):
    quality = {
        "total_variance": variance,
        "squared_bias": 0.0,
        "squared_bias_se": 0.1,
        "relative_variance": variance,
        "relative_bias": 0.0,
        "cosine": cosine,
        "draws": draws,
    }
    return {"task": task, "method": method, "initial": quality, **training}


def made_rows() -> list[dict]:
    return [
        row("copy", "UORO (state)", variance=10.0),
        row("copy", "KF-RTRL", variance=2.0),
        row("characters", "UORO (state)", variance=8.0, val_bits=3.0),
        row("characters", "UORO (preactivation)", variance=7.0, val_bits=2.9),
        row("characters", "KF-RTRL", variance=1.0, val_bits=2.5),
        row("characters", "SnAp-1", draws=1, variance=0.0, cosine=0.9, val_bits=2.8),
        row("characters", "RTRL", draws=1, variance=0.0, cosine=1.0, val_bits=2.7),
        row("long copy", "LRU, diagonal RTRL", draws=1, variance=0.0, cosine=1.0, val_loss=0.1, chance_loss=1.386),
        row("long copy", "tanh, UORO (preactivation)", val_loss=1.38, chance_loss=1.386, delay=100),
    ]


def test_claims_follow_the_numbers():
    claims = load("online_family_render").claims
    rows = made_rows()
    found = claims(rows)
    assert [c["holds"] for c in found] == [True, True, True, True]
    assert found[0]["figure"].startswith("5 (") and "SnAp-1 2.800 vs UORO (preactivation) 2.900" == found[1]["figure"]
    assert "100-step delay" in found[2]["claim"]
    flipped = copy.deepcopy(rows)
    flipped[1]["initial"]["total_variance"] = 11.0  # KF-RTRL above UORO (state) on copy
    flipped[5]["val_bits"] = 2.95  # SnAp-1 behind the preactivation UORO
    flipped[8]["val_loss"] = 0.5  # the tanh RNN learned the delay too
    flipped[6]["initial"]["cosine"] = 0.99  # RTRL off backprop
    assert [c["holds"] for c in claims(flipped)] == [False, False, False, False]
    diverged = copy.deepcopy(rows)
    diverged[7]["diverged"] = "ValueError: nan"  # an LRU run that blew up did not learn
    assert not claims(diverged)[2]["holds"]
    assert [c["holds"] for c in claims([])] == [False, False, False, False]  # nothing measured: nothing holds


COMMITTED = ROOT / "benchmarks" / "results" / "online_family-cpu1.json"


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed full run")
def test_committed_claims_are_those_of_its_rows():
    script = load("online_family")
    data = json.loads(COMMITTED.read_text())
    assert data["command"] == "python -m benchmarks.online_family" and not data["command"].endswith("--quick")
    assert data["claims"] == json.loads(json.dumps(script.claims(data["rows"])))
    assert load("online_family_render").render(data).startswith(f"**{data['hardware']}**")
