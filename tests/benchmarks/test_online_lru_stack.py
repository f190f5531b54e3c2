"""benchmarks/online_lru_stack.py: the quick run's result file (structure, figures in range, the claim computed from
the rows) and the claim's logic on hand-made rows (it flips when a number crosses the threshold)."""

import copy
import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("online_lru_stack")
    path = Path(load("online_lru_stack").main(["--quick", "--output", str(out)]))
    return path, json.loads(path.read_text())


def test_quick_run_measures_the_stack_and_reads_the_references(quick):
    script = load("online_lru_stack")
    path, data = quick
    assert path.name == "online_lru_stack-cpu1-quick.json"
    assert data["benchmark"] == "online_lru_stack" and data["hardware"] == "cpu1"
    setup = data["setup"]
    assert setup["layers"] == 2 and setup["delay"] == script.QUICK["delay"] and setup["update"]
    stack = data["rows"][0]
    assert stack["method"] == script.STACK and stack["source"] == "measured"
    assert stack["delay"] == setup["delay"] and stack["chance_loss"] == pytest.approx(math.log(4))
    assert stack["train_seconds"] >= setup["seconds"] and stack["optimizer_steps"] == stack["time_steps"] > 0
    assert stack["ms_per_step"] > 0 and stack["ms_per_step_median"] >= stack["ms_per_step"]
    assert stack["train_ms_per_step"] == pytest.approx(1e3 * stack["train_seconds"] / stack["time_steps"])
    assert stack["curve"] and all(len(point) == 3 for point in stack["curve"])
    assert math.isfinite(stack["val_loss"]) and stack["val_loss"] >= 0
    # the comparison rows are the committed online_family figures, copied unchanged
    reference = json.loads(script.REFERENCE.read_text())
    committed = {r["method"]: r for r in reference["rows"] if r["task"] == "long copy"}
    copied = {r["method"]: r for r in data["rows"][1:]}
    assert set(copied) == {script.SINGLE_LRU, script.UORO_TANH}
    for method, row in copied.items():
        assert row["source"].startswith("online_family") and row["delay"] == 100
        for key in ("val_loss", "optimizer_steps", "ms_per_step", "parameters"):
            assert row[key] == committed[method][key]


def test_quick_claim_is_computed_from_its_rows_and_renders(quick):
    script = load("online_lru_stack")
    _, data = quick
    assert data["claims"] == json.loads(json.dumps(script.claims(data["rows"])))
    # the quick run's delay (10) is not online_family's (100): the claim cannot hold on it
    assert len(data["claims"]) == 1 and data["claims"][0]["holds"] is False
    table = load("online_lru_stack_render").render(data)
    assert table.count("\n| ") >= len(data["rows"]) + len(data["claims"]) + 1


def made_rows(stack_loss: float, tanh_loss: float, *, stack_delay: int = 100) -> list[dict]:
    script = load("online_lru_stack")
    chance = math.log(4)
    return [
        {"method": script.STACK, "layers": 2, "delay": stack_delay, "chance_loss": chance, "val_loss": stack_loss},
        {"method": script.SINGLE_LRU, "delay": 100, "chance_loss": chance, "val_loss": 0.07},
        {"method": script.UORO_TANH, "delay": 100, "chance_loss": chance, "val_loss": tanh_loss},
    ]


def test_claim_flips_with_the_stack_loss_and_the_tanh_loss():
    claims = load("online_lru_stack").claims
    threshold = 0.5 * math.log(4)
    assert claims(made_rows(threshold - 1e-3, 1.45))[0]["holds"]
    assert not claims(made_rows(threshold + 1e-3, 1.45))[0]["holds"]  # the stack did not learn
    assert not claims(made_rows(0.1, threshold - 1e-3))[0]["holds"]  # the tanh RNN did learn
    assert not claims(made_rows(0.1, 1.45, stack_delay=10))[0]["holds"]  # not the same task


def test_claim_does_not_hold_without_a_measurement():
    claims = load("online_lru_stack").claims
    rows = made_rows(0.1, 1.45)
    diverged = copy.deepcopy(rows)
    diverged[0]["diverged"] = "FloatingPointError: NaN"
    assert not claims(diverged)[0]["holds"]
    assert not claims([r for r in rows if "tanh" not in r["method"]])[0]["holds"]
    assert not claims(rows[1:])[0]["holds"]
    assert "0.100" in claims(rows)[0]["figure"] and "1.450" in claims(rows)[0]["figure"]
