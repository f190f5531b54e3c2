import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.test_bench_orthogonal import ROOT, load


@pytest.mark.parametrize("name", ["reproduce_fcnn", "reproduce_rnn"])
def test_quick_reproduction_writes_curves_and_claims(name, tmp_path, monkeypatch):
    script = load(name)
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    monkeypatch.setattr(script, "RESULTS", tmp_path)
    path = Path(script.main(["--quick"]))
    data = json.loads(path.read_text())
    assert data["benchmark"] == name and data["rows"] and data["setup"]["seeds"] == 1
    methods = {row["method"] for row in data["rows"]}
    expected = getattr(script, "METHODS", None) or script.TRANSITIONS
    assert set(data["curves"]) == methods == set(expected)
    assert {p["metric"] for c in data["curves"].values() for p in c} == {"val_error"}
    for row in data["rows"]:
        assert 0 <= row["val_error"] <= 100 and row["train_seconds"] > 0
    assert all({"claim", "figure", "holds"} <= set(c) for c in data["claims"]) and data["claims"]
    assert (tmp_path / path.name.replace(".json", ".png")).exists()


def point(mean: float, seconds: float = 1.0, metric: str = "val_error") -> list[dict]:
    """A one-epoch curve in aggregate's shape."""
    return [{"epoch": 1, "seeds": 1, "metric": metric, "mean": mean, "std": 0.0, "epoch_seconds_mean": seconds}]


def test_claims_logic():
    rnn = load("reproduce_rnn")
    names = list(rnn.TRANSITIONS)
    claims = rnn.claims_from({names[0]: point(5.0), names[1]: point(40.0), names[2]: point(6.5)})
    assert [c["holds"] for c in claims] == [True, True, True]
    assert [c["figure"] for c in claims] == [-1.5, 35.0, 33.5]
    claims = rnn.claims_from({names[0]: point(9.0), names[1]: point(12.0), names[2]: point(6.0)})
    assert [c["holds"] for c in claims] == [False, False, False]
    fcnn = load("reproduce_fcnn")
    curves = {"aux": point(5.0, 1.0), "cayley": point(4.5, 3.0), "householder": point(4.8, 1.5)}
    gap, speed = fcnn.claims_from(curves)
    assert gap["figure"] == 0.5 and gap["holds"] and speed["figure"] == 1.5 and not speed["holds"]
    assert "(cayley)" in gap["claim"] and "(householder)" in speed["claim"]


def test_glow_claims_logic():
    glow = load("reproduce_glow")
    curves = {
        k: point(v, metric="val_bpd") for k, v in {"aux": 3.02, "householder": 3.0, "aux_invertible": 3.1}.items()
    }
    inversions = [
        {"method": "aux", "newton_failures": 0, "reconstruction_max_error": 1e-6},
        {"method": "aux", "newton_failures": 3, "reconstruction_max_error": float("inf")},
        {"method": "aux_invertible", "newton_failures": 0, "reconstruction_max_error": 2e-3},
    ]
    tie, worse, aux, invertible = glow.claims_from(curves, inversions)
    assert (tie["figure"], tie["holds"]) == (0.02, True) and (worse["figure"], worse["holds"]) == (0.1, True)
    assert (aux["figure"], aux["holds"]) == (1, False) and (invertible["figure"], invertible["holds"]) == (1, False)


def test_claims_refuse_curves_of_another_metric():
    glow, rnn = load("reproduce_glow"), load("reproduce_rnn")
    with pytest.raises(ValueError, match="do not average 'val_bpd'"):
        glow.claims_from({"aux": point(3.0), "householder": point(3.0)}, [])  # val_error curves
    names = list(rnn.TRANSITIONS)
    with pytest.raises(ValueError, match="do not average 'val_error'"):
        rnn.claims_from({n: point(1.0, metric="val_bpd") for n in names[:3]})


def test_aggregate_means_and_stds_over_seeds_per_epoch():
    aggregate = load("_reproduce").aggregate
    rows = [
        {"method": "a", "seed": s, "epoch": e, "val_bpd": v, "train_seconds": t, "epoch_seconds": 1.0}
        for s, e, v, t in [(0, 1, 3.0, 1.0), (1, 1, 4.0, 3.0), (0, 2, 2.0, 2.0), (1, 2, 2.0, 4.0)]
    ] + [{"method": "b", "seed": 0, "epoch": 1, "val_bpd": 5.0, "train_seconds": 1.0, "epoch_seconds": 1.0}]
    curves = aggregate(rows, metric="val_bpd")
    assert curves == {
        "a": [
            {
                "epoch": 1,
                "seeds": 2,
                "metric": "val_bpd",
                "mean": 3.5,
                "std": 0.5,
                "train_seconds_mean": 2.0,
                "epoch_seconds_mean": 1.0,
            },
            {
                "epoch": 2,
                "seeds": 2,
                "metric": "val_bpd",
                "mean": 2.0,
                "std": 0.0,
                "train_seconds_mean": 3.0,
                "epoch_seconds_mean": 1.0,
            },
        ],
        "b": [
            {
                "epoch": 1,
                "seeds": 1,
                "metric": "val_bpd",
                "mean": 5.0,
                "std": 0.0,
                "train_seconds_mean": 1.0,
                "epoch_seconds_mean": 1.0,
            }
        ],
    }


RESULT_FILES_WITH_CURVES = sorted(
    p.name
    for p in (ROOT / "benchmarks" / "results").glob("*.json")
    if not p.stem.endswith("-quick") and "curves" in json.loads(p.read_text())
)


def test_the_reproductions_have_committed_results():
    assert {"reproduce_fcnn-cpu2.json", "reproduce_glow-cpu2.json"} <= set(RESULT_FILES_WITH_CURVES)


@pytest.mark.parametrize("name", RESULT_FILES_WITH_CURVES)
def test_committed_curves_are_the_aggregate_of_their_rows(name):
    data = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    metrics = {p.get("metric") for c in data["curves"].values() for p in c}
    assert len(metrics) == 1 and None not in metrics, f"{name}: old curves; recompute with aggregate(rows, metric=...)"
    assert data["curves"] == load("_reproduce").aggregate(data["rows"], metric=metrics.pop())


def test_quick_uoro_variance_reproduction(tmp_path, monkeypatch):
    script = load("reproduce_uoro")
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    path = Path(script.main(["--quick"]))
    data = json.loads(path.read_text())
    estimators = [r for r in data["rows"] if "total_variance" in r]
    assert {r["method"] for r in estimators} >= {"GIR, state", "fixed Q, Q0 = B^-1/4", "none (no spatial noise), GIR"}
    for row in estimators:
        assert row["total_variance"] > 0 and row["max_z"] < row["critical_z"]  # unbiased at the quick size too
    fixed = [r for r in estimators if "predicted_total_variance" in r]
    assert len(fixed) == 4
    for row in fixed:  # equation 6.5 within 4 standard errors
        assert abs(row["total_variance"] - row["predicted_total_variance"]) < 4 * row["total_variance_se"]
    assert len(data["claims"]) == 8 and all({"claim", "figure", "holds"} <= set(c) for c in data["claims"])


@pytest.mark.parametrize("tasks", [["influence", "adding"], pytest.param(["characters"], marks=pytest.mark.slow)])
def test_quick_uoro_training_reproduction(tasks, tmp_path, monkeypatch):
    script = load("reproduce_uoro_training")
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    path = Path(script.main(["--quick", "--tasks", *tasks]))
    data = json.loads(path.read_text())
    assert {r["task"] for r in data["rows"]} == set(tasks)
    metric = {"influence": "theta", "adding": "val_loss", "characters": "val_bits"}
    for row in data["rows"]:
        if "diverged" in row:  # a run the estimator stopped: the error is recorded, no metrics
            assert row["diverged"].startswith(("FloatingPointError", "ValueError"))
        else:
            assert row["train_seconds"] > 0 and math.isfinite(row[metric[row["task"]]])
    assert data["claims"] and all({"claim", "figure", "holds"} <= set(c) for c in data["claims"])
    assert (tmp_path / path.name.replace(".json", ".png")).exists()
