"""benchmarks/bench_compression_budget.py: the --quick run trains, compresses to the budget and fine-tunes each
model, writes the rows with test accuracy at every stage, the operations and the claims, and the results page shows
the committed run."""

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import ROOT, load, results_section

bench = load("bench_compression_budget")
renderer = load("bench_compression_budget_render")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench_compression_budget")
    path = Path(bench.main(["--quick", "--datasets", "digits", "--output", str(folder)]))
    return json.loads(path.read_text())


def test_the_quick_run_scores_every_stage_and_counts_the_operations(quick):
    assert [(row["model"], row["dataset"]) for row in quick["rows"]] == [("cnn", "digits"), ("fcnn", "digits")]
    for row in quick["rows"]:
        accuracy = row["test_accuracy"]
        assert set(accuracy) == {"dense", "compressed", "finetuned"} and all(0 <= v <= 1 for v in accuracy.values())
        assert row["drop_points_after_finetuning"] == pytest.approx(100 * (accuracy["dense"] - accuracy["finetuned"]))
        # the compressible layers: every candidate but the one-channel convolution the family refuses, compressed
        # or kept dense by the search
        compressible = [
            layer for layer in row["layers"] if layer["compressed"] or "1 input channel" not in layer["reason"]
        ]
        assert row["ops_compressible_layers"]["before"] == sum(layer["ops_before"] for layer in compressible)
        assert row["ops_compressible_layers"]["after"] == sum(layer["ops_after"] for layer in compressible)
        assert row["compressed_layers"] == [layer["name"] for layer in row["layers"] if layer["compressed"]]
        # the paired standard error of the drop over the --quick run's 200 test images: differences in {-1, 0, 1}
        # have a sample deviation of at most sqrt(n / (n - 1)), and a nonzero drop needs disagreements, so spread
        error, drop = row["drop_standard_error"], row["drop_points_after_finetuning"]
        assert error <= 100 / (200 - 1) ** 0.5 + 1e-9
        assert (error > 0) if abs(drop) > 1e-9 else (error >= 0)
        assert row["ops_all_candidates"]["before"] == sum(layer["ops_before"] for layer in row["layers"])
    cnn = quick["rows"][0]
    first = next(layer for layer in cnn["layers"] if layer["name"] == "features.0")
    assert not first["compressed"] and "1 input channel" in first["reason"]
    assert len(quick["claims"]) == 5  # two per row, and the CNN's search time
    table = renderer.render(quick)
    assert "| cnn | digits |" in table and "| fcnn | digits |" in table


def test_the_results_page_shows_the_committed_run():
    committed = sorted((ROOT / "benchmarks" / "results").glob("bench_compression_budget-*.json"))
    committed = [path for path in committed if not path.name.endswith("-quick.json")]
    assert committed, "no committed run of bench_compression_budget"
    section = results_section("bench_compression_budget")
    for path in committed:
        assert renderer.render(json.loads(path.read_text())) in section


def test_the_claims_of_a_row_run_with_several_seeds_take_their_means():
    def row(seed, drop, ratio, seconds):
        return {
            "model": "cnn",
            "dataset": "digits",
            "seed": seed,
            "drop_points_after_finetuning": drop,
            "ops_ratio_compressible_layers": ratio,
            "search_seconds": seconds,
        }

    rows = [row(0, 1.48, 2.5, 10.0), row(1, -0.74, 4.0, 130.0), row(2, 0.37, 3.1, 12.0)]
    drop, ratio, search = bench.claims_from(rows)
    assert "mean of 3 seeds" in drop["claim"]
    # the standard error of the mean over the seeds: the sample deviation over the root of their number
    spread = (sum((d - (1.48 - 0.74 + 0.37) / 3) ** 2 for d in (1.48, -0.74, 0.37)) / 2) ** 0.5 / 3**0.5
    assert f"+- {spread:.2f} over the seeds" in drop["claim"]
    assert drop["figure"] == pytest.approx(round((1.48 - 0.74 + 0.37) / 3, 2)) and drop["holds"]
    assert ratio["figure"] == pytest.approx(round((2.5 + 4.0 + 3.1) / 3, 2)) and ratio["holds"]
    assert search["figure"] == 130.0 and not search["holds"]  # the slowest seed's search
    lost = bench.claims_from([row(0, 0.74, 3.5, 5.0), row(1, 1.85, 3.5, 5.0)])[0]
    assert lost["figure"] == pytest.approx(1.295, abs=0.006) and not lost["holds"]
