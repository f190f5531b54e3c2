import json
import math
import tempfile
from pathlib import Path

import pytest

from tests.benchmarks.helpers import ROOT, load


@pytest.mark.parametrize("name", ["reproduce_fcnn", "reproduce_rnn"])
def test_quick_reproduction_writes_curves_and_claims(name, tmp_path, monkeypatch):
    script = load(name)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = Path(script.main(["--quick", "--output", str(tmp_path)]))
    assert not list(scratch.iterdir())  # each fit's scratch folder (Lightning's root) is removed after it
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


def test_quick_uoro_variance_reproduction(tmp_path):
    script = load("reproduce_uoro")
    path = Path(script.main(["--quick", "--output", str(tmp_path)]))
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
def test_quick_uoro_training_reproduction(tasks, tmp_path):
    script = load("reproduce_uoro_training")
    path = Path(script.main(["--quick", "--output", str(tmp_path), "--tasks", *tasks]))
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


def test_tagged_timing_run_writes_its_own_file_and_renders_below_the_full_result(tmp_path):
    rnn = load("reproduce_rnn")
    argv = ["--quick", "--tag", "timing", "--transitions", "aux", "cayley", "--output", str(tmp_path)]
    path = Path(rnn.main(argv))
    assert path.name.startswith("reproduce_rnn_timing-cpu") and path.name.endswith("-quick.json")
    assert not list(tmp_path.glob("reproduce_rnn-*")) and not list(
        tmp_path.glob("*.png")
    )  # the full result is left alone
    data = json.loads(path.read_text())
    assert data["benchmark"] == "reproduce_rnn" and data["tag"] == "timing" and data["claims"] == []
    assert {r["method"] for r in data["rows"]} == {rnn.AUX, "cayley"}
    assert all(r["epoch_seconds"] > 0 for r in data["rows"])
    # in the results-page section of reproduce_rnn, after the full result's table (file names sort "-" before "_")
    results = tmp_path / "results"
    results.mkdir()
    (results / "reproduce_rnn_timing-cpu1.json").write_text(path.read_text())
    (results / "reproduce_rnn-cpu2.json").write_text((ROOT / "benchmarks/results/reproduce_rnn-cpu2.json").read_text())
    body = load("report").sections(results)["reproduce_rnn"]
    full, timing = body.split("\n\nTime per epoch (timing run `timing`): ")
    assert full == load("reproduce_rnn_render").render(json.loads((results / "reproduce_rnn-cpu2.json").read_text()))
    lines = timing.splitlines()
    assert lines[2] == "| transition | seeds x epochs | seconds per epoch, mean | fastest | mean vs aux |"
    assert lines[4].startswith("| aux (1 auxiliary reflection) | 1 x 1 |") and lines[4].endswith("| 1.00x |")
    assert lines[5].startswith("| cayley | 1 x 1 |") and len(lines) == 6


def test_timing_table_means_over_seeds_and_epochs():
    rows = [
        {"method": m, "seed": s, "epoch": e, "epoch_seconds": t}
        for m, s, e, t in [
            ("aux (1 auxiliary reflection)", 0, 1, 10.0),
            ("aux (1 auxiliary reflection)", 0, 2, 8.0),
            ("cayley", 0, 1, 30.0),
            ("cayley", 0, 2, 24.0),
        ]
    ]
    data = {"tag": "timing", "hardware": "cpu1", "torch": "2", "date": "d", "command": "c", "rows": rows}
    lines = load("reproduce_rnn_render").render(data).splitlines()
    assert lines[4:] == [
        "| aux (1 auxiliary reflection) | 1 x 2 | 9 | 8 | 1.00x |",
        "| cayley | 1 x 2 | 27 | 24 | 3.00x |",
    ]


def test_tag_must_be_a_plain_name(capsys):
    with pytest.raises(SystemExit):
        load("reproduce_rnn").main(["--tag", "../x"])
    assert "--tag must be lower-case letters and digits" in capsys.readouterr().err
