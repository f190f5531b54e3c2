import json
from pathlib import Path

import pytest

from tests.benchmarks.test_bench_orthogonal import load


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
    for row in data["rows"]:
        assert 0 <= row["val_error"] <= 100 and row["train_seconds"] > 0
    assert all({"claim", "figure", "holds"} <= set(c) for c in data["claims"]) and data["claims"]
    assert (tmp_path / path.name.replace(".json", ".png")).exists()


def test_claims_logic():
    rnn = load("reproduce_rnn")
    names = list(rnn.TRANSITIONS)
    curve = lambda e: [{"val_error_mean": e, "epoch_seconds_mean": 1.0}]  # noqa: E731
    claims = rnn.claims_from({names[0]: curve(5.0), names[1]: curve(40.0), names[2]: curve(6.5)})
    assert [c["holds"] for c in claims] == [True, True, True]
    claims = rnn.claims_from({names[0]: curve(9.0), names[1]: curve(12.0), names[2]: curve(6.0)})
    assert [c["holds"] for c in claims] == [False, False, False]
    fcnn = load("reproduce_fcnn")
    curves = {
        "aux": [{"val_error_mean": 5.0, "epoch_seconds_mean": 1.0}],
        "cayley": [{"val_error_mean": 4.5, "epoch_seconds_mean": 3.0}],
        "householder": [{"val_error_mean": 4.8, "epoch_seconds_mean": 1.5}],
    }
    gap, speed = fcnn.claims_from(curves)
    assert gap["figure"] == 0.5 and gap["holds"] and speed["figure"] == 1.5 and not speed["holds"]
