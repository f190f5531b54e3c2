"""benchmarks/bench_small.py: the --quick run writes every row and its claims are computed from the rows; the goal
logic, an over-budget compress_linear recorded as such, and the results-page table."""

import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.helpers import load

bench = load("bench_small")
small_rows = load("_small_rows")
renderer = load("bench_small_render")
processes = load("_small_processes")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench_small")
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    path = Path(bench.main(["--quick", "--output", str(folder)]))
    # the recipe's fits set threads and deterministic mode: both are given back
    assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled() == deterministic
    return path, json.loads(path.read_text())


def test_quick_run_writes_every_row(quick):
    path, data = quick
    assert path.name == f"bench_small-{data['hardware']}-quick.json" and data["hardware"] == "cpu1"
    assert data["benchmark"] == "bench_small" and data["command"].startswith("python -m benchmarks.bench_small --quick")
    assert {"torch", "date", "rows", "claims", "setup", "total_seconds"} <= set(data)
    assert [r["section"] for r in data["rows"]] == [
        "aux_linear",
        "uoro_bptt",
        "uoro_bptt_orthogonal",
        "orthogonal_rnn",
        "compress",
        "online_recipe",
        "uoro_bandwidth",
    ]
    for row in data["rows"]:
        assert {"what", "figure", "unit", "goal", "holds"} <= set(row) and "skipped" not in row, row
        assert row["figure"] > 0
        if row["unit"] == "x":
            assert row["rounds"] == 1 and row["ratio_of_best"] > 0
    compress = next(r for r in data["rows"] if r["section"] == "compress")
    assert compress["n"] == 32 and compress["goal"] is None and compress["holds"] is None  # no goal at n = 32
    assert 0 <= compress["error"] <= 100 and compress["blocks"] > 0
    recipe = next(r for r in data["rows"] if r["section"] == "online_recipe")
    assert recipe["spinners"] == 1 and recipe["default_threads_s"] > 0 and recipe["one_thread_s"] > 0
    for online in (r for r in data["rows"] if r["section"].startswith("uoro_bptt")):  # the breakdown is there
        assert 0 < online["estimator_ms_per_step"] and online["estimator_over_bptt"] > 0
        assert "the estimator's own step + gradient" in renderer.details(online)
    bandwidth = next(r for r in data["rows"] if r["section"] == "uoro_bandwidth")
    assert bandwidth["parameters"] == 64 * 64 + 64 * 32 + 64  # w_tilde holds one row of P per stream
    assert bandwidth["w_tilde_mb"] == pytest.approx(8 * bandwidth["parameters"] * 4 / 2**20)


def test_claims_are_the_rows_with_a_goal(quick):
    _, data = quick
    assert data["claims"] == bench.claims_from(data["rows"])
    assert len(data["claims"]) == 6  # every row but compress at n = 32
    for claim, row in zip(data["claims"], [r for r in data["rows"] if r["goal"]], strict=True):
        assert claim["claim"] == f"{row['what']}: goal {row['goal']}"
        assert claim["figure"] == round(row["figure"], 3) and claim["holds"] == row["holds"]


def test_goals_and_claims_from_rows():
    row = small_rows.table_row
    assert row("aux_linear", "a", 1.4)["holds"] is True and row("aux_linear", "a", 1.6)["holds"] is False
    assert row("uoro_bandwidth", "b", 0.6)["holds"] is True and row("uoro_bandwidth", "b", 0.4)["holds"] is False
    assert row("uoro_bandwidth", "b", 0.4)["goal"] == ">= 0.5"
    fast = row("compress", "c256", 12.0, goal=20.0, n=256, budget_s=300.0)
    over = row("compress", "c784", None, goal=120.0, n=784, budget_s=300.0, skipped="over budget: not done after 300 s")
    unknown = row("compress", "c784", None, goal=120.0, n=784, budget_s=60.0, skipped="over budget")
    info = row("aux_linear", "a512", 2.0, goal="(information)")
    assert (info["goal"], info["holds"]) == ("(information)", None)
    assert (fast["goal"], fast["holds"], over["holds"], unknown["holds"]) == ("<= 20s", True, False, None)
    assert bench.claims_from([fast, over, unknown, info]) == [
        {"claim": "c256: goal <= 20s", "figure": 12.0, "holds": True},
        {"claim": "c784: goal <= 120s", "figure": "> 300 s", "holds": False},  # stopped after more than the goal
    ]


def test_render_shows_every_row():
    row = small_rows.table_row
    rows = [
        row("aux_linear", "aux 64", 1.234, d=64, aux_ms=0.2, linear_ms=0.1, ratio_of_best=1.2),
        row("compress", "compress 784", None, goal=120.0, budget_s=300.0, skipped="over budget: not done after 300 s"),
    ]
    data = {"hardware": "cpu1", "torch": "2", "date": "d", "command": "c", "rows": rows}
    data["claims"] = bench.claims_from(rows)
    lines = renderer.render(data).splitlines()
    assert lines[2] == "| what | measured | goal | holds | details |"
    assert lines[4] == "| aux 64 | 1.23x | <= 1.5x | yes | 0.2 / 0.1 ms; best rounds 1.20x |"
    assert lines[5] == "| compress 784 | skipped: over budget: not done after 300 s | <= 120s | **no** |  |"
    assert lines[-1] == "| compress 784: goal <= 120s | > 300 s | **no** |"


def test_compress_child_reports_seconds_or_over_budget(capsys):
    processes.compress_child(8, None, 60.0)
    done = json.loads(capsys.readouterr().out)
    assert done["seconds"] > 0 and done["blocks"] > 0 and "over_budget" not in done
    processes.compress_child(128, None, 1e-4)  # about a second of work: the timer stops it
    stopped = json.loads(capsys.readouterr().out)
    assert stopped["over_budget"] is True and stopped["seconds"] < 1.0


def test_the_recipe_is_built_as_the_cli_builds_it():
    model, data, trainer, seed = processes.build_recipe({"chunks_per_epoch": 2}, num_threads=1)
    assert type(model).__name__ == "OnlineRNNModule" and model.num_threads == 1
    assert model.cell.input_size == data.input_size and model.output_size == data.output_size
    assert data.chunks_per_epoch == 2 and trainer == {"accelerator": "cpu", "devices": 1, "deterministic": True}
    assert seed == 0


def test_online_rows_take_the_readout_in_closed_form_with_the_autograd_gradients():
    """Runner(readout="closed_form") (the uoro rows' protocol) accumulates the gradients of readout="autograd"."""
    problem = small_rows.Problem(6, batch=3)
    runners = []
    for readout in ("autograd", "closed_form"):
        torch.manual_seed(0)
        runner = small_rows.Runner("uoro_state", problem, estimator=small_rows.UORO(problem.cell), readout=readout)
        runner.run(5)
        runners.append(runner)
    for a, b in zip(runners[0].grads, runners[1].grads, strict=True):
        assert a.abs().max() > 0
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="readout must be 'autograd' or 'closed_form'"):
        small_rows.Runner("uoro_state", problem, readout="manual")
