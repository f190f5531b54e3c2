"""benchmarks/bench_orthogonal_weights.py: the --quick run times every implementation on every shape (or says why
not), writes the result schema with the ratio of ours to the fastest peer and the claim, and the results page shows
the committed run (not the timings)."""

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import ROOT, load, results_section

bench = load("bench_orthogonal_weights")
renderer = load("bench_orthogonal_weights_render")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench_orthogonal_weights")
    path = Path(bench.main(["--quick", "--rounds", "1", "--output", str(folder)]))
    return json.loads(path.read_text())


def test_the_table_has_a_column_for_every_implementation_in_the_order_run():
    assert renderer.COLUMNS == (*bench.OURS, *bench.TORCH, *bench.GEOTORCH_TRIV)


def test_the_quick_run_times_every_implementation_or_says_why_not(quick):
    names = {*bench.OURS, *bench.TORCH, *bench.GEOTORCH_TRIV}
    assert [row["shape"] for row in quick["rows"]] == list(bench.QUICK_SHAPES)
    for row in quick["rows"]:
        assert set(row["seconds"]) | set(row["not_run"]) == names
        assert all(seconds > 0 for seconds in row["seconds"].values())
        assert set(bench.OURS) <= set(row["seconds"])  # ours always runs
        peers = {name: s for name, s in row["seconds"].items() if name not in bench.OURS}
        if peers:
            fastest = min(peers, key=peers.get)
            ours = min(row["seconds"][name] for name in bench.OURS)
            assert row["fastest_peer"] == fastest and row["ratio"] == pytest.approx(ours / peers[fastest])
    worst = max(row["ratio"] for row in quick["rows"] if "ratio" in row)
    (claim,) = quick["claims"]
    assert claim["figure"] == round(worst, 3) and claim["holds"] == (worst <= 1.0)
    table = renderer.render(quick)
    assert all(row["shape"] in table for row in quick["rows"])


def test_a_square_forming_map_of_a_weight_too_tall_for_memory_is_not_run(monkeypatch):
    monkeypatch.setattr(bench, "memory_limit", lambda: 1)
    (row,) = bench.measure({"tall": (40, 4)}, rounds=1, budget=0.1, geotorch=None, missing="not installed here")
    assert set(row["not_run"]) == {"torch householder", "torch cayley", "torch matrix_exp", *bench.GEOTORCH_TRIV}
    assert "forms a 40 x 40 matrix" in row["not_run"]["torch cayley"]
    assert row["not_run"]["geotorch expm"] == "geotorch not available: not installed here"
    assert set(bench.OURS) == set(row["seconds"])


def test_the_results_page_shows_the_committed_run():
    committed = sorted((ROOT / "benchmarks" / "results").glob("bench_orthogonal_weights-*.json"))
    committed = [path for path in committed if not path.name.endswith("-quick.json")]
    assert committed, "no committed run of bench_orthogonal_weights"
    section = results_section("bench_orthogonal_weights")
    for path in committed:
        assert renderer.render(json.loads(path.read_text())) in section
