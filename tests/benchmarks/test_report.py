"""benchmarks/report.py: the README's tables are the rendering of the committed results, and a README whose
sections do not match the results is an error, never a silent skip."""

import json
import shutil

import pytest

from tests.benchmarks.helpers import ROOT, load

RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
report = load("report")


def section(name: str, body: str = "old\n") -> str:
    return f"<!-- {name}:start -->\n{body}<!-- {name}:end -->\n"


def results_dir(tmp_path, *names: str):
    """A results folder with copies of committed result files (``name`` -> ``name-cpu2.json``)."""
    folder = tmp_path / "results"
    folder.mkdir()
    for name in names:
        shutil.copy(RESULTS / f"{name}-cpu2.json", folder / f"{name}-cpu2.json")
    return folder


def test_readme_is_the_rendering_of_the_committed_results():
    bodies = report.sections(RESULTS)
    assert {"bench_flows", "bench_orthogonal", "reproduce_fcnn", "reproduce_rnn", "reproduce_glow"} <= set(bodies)
    text = README.read_text()
    assert report.render_readme(text, bodies) == text, "README.md is stale: run python -m benchmarks.report"
    assert report.main(["--check"]) == 0


def test_update_readme_rewrites_stale_sections_byte_for_byte(tmp_path):
    text = README.read_text()
    start, end = text.index("<!-- reproduce_glow:start -->\n"), text.index("<!-- reproduce_glow:end -->")
    stale = text[: start + len("<!-- reproduce_glow:start -->\n")] + "stale table\n" + text[end:]
    readme = tmp_path / "README.md"
    readme.write_text(stale)
    assert report.update_readme(readme, RESULTS) is True
    assert readme.read_bytes() == README.read_bytes()
    assert report.update_readme(readme, RESULTS) is False


def test_results_without_a_readme_section_are_an_error(tmp_path):
    results = results_dir(tmp_path, "peer_normflows", "bench_flows")
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\n" + section("bench_flows"))
    with pytest.raises(report.ReportError, match="peer_normflows has results but the README has no section"):
        report.update_readme(readme, results)
    assert readme.read_text() == "# title\n\n" + section("bench_flows")  # nothing written
    readme.write_text(section("bench_flows") + section("peer_normflows"))
    assert report.update_readme(readme, results) is True
    assert "normflows (LU, unconditional split priors)" in readme.read_text()


def test_a_readme_section_without_results_is_an_error(tmp_path):
    results = results_dir(tmp_path, "peer_normflows")
    text = section("peer_normflows") + section("bench_flows")
    with pytest.raises(report.ReportError, match=r"no bench_flows-\*\.json results"):
        report.render_readme(text, report.sections(results))
    # quick runs do not count as results
    shutil.copy(RESULTS / "bench_flows-cpu2.json", results / "bench_flows-cpu2-quick.json")
    assert set(report.sections(results)) == {"peer_normflows"}
    with pytest.raises(report.ReportError, match=r"no bench_flows-\*\.json results"):
        report.render_readme(text, report.sections(results))


@pytest.mark.parametrize(
    "text",
    [
        "<!-- peer_normflows:start -->\nbody\n",
        "<!-- peer_normflows:end -->\n<!-- peer_normflows:start -->\n",
        section("peer_normflows") + section("peer_normflows"),
    ],
)
def test_unbalanced_markers_are_an_error(text):
    with pytest.raises(report.ReportError, match="expected one <!-- peer_normflows:start --> before one"):
        report.render_readme(text, {"peer_normflows": "table"})


def test_unrenderable_results_are_an_error(tmp_path):
    results = results_dir(tmp_path, "peer_normflows")
    data = json.loads((results / "peer_normflows-cpu2.json").read_text())
    for curve in data["curves"].values():  # the shape before metric-neutral keys
        for point in curve:
            point["val_error_mean"], point["val_error_std"] = point.pop("mean"), point.pop("std")
            del point["metric"]
    (results / "peer_normflows-cpu2.json").write_text(json.dumps(data))
    with pytest.raises(
        report.ReportError, match=r"peer_normflows-cpu2\.json: cannot render: .*aggregate\(data\['rows'\]"
    ):
        report.sections(results)
    (results / "peer_normflows-cpu2.json").unlink()
    (results / "mystery-cpu2.json").write_text(json.dumps({"benchmark": "mystery", "rows": [], "claims": []}))
    with pytest.raises(report.ReportError, match="'mystery' has no renderer"):
        report.sections(results)


def test_reproduction_table_from_aggregated_rows():
    aggregate = load("_reproduce").aggregate
    rows = [
        {"method": m, "seed": s, "epoch": e, "val_bpd": v, "train_seconds": 2.0 * e, "epoch_seconds": 2.0}
        for m, s, e, v in [
            ("slow", 0, 1, 4.0),
            ("slow", 0, 2, 3.5),
            ("slow", 1, 1, 3.0),
            ("slow", 1, 2, 3.9),
            ("fast", 0, 1, 3.0),
            ("fast", 0, 2, 2.5),
        ]
    ]
    data = {
        "benchmark": "reproduce_glow",
        "hardware": "cpu2",
        "torch": "2.0",
        "date": "2026-01-01",
        "command": "python x.py",
        "setup": {"epochs": 2},
        "rows": rows,
        "claims": [{"claim": "c", "figure": 1, "holds": False}],
        "curves": aggregate(rows, metric="val_bpd"),
    }
    lines = load("_render").render_reproduction(data).splitlines()
    assert lines[0] == "**cpu2**, torch 2.0, 2026-01-01: `python x.py` (epochs 2)."
    assert lines[2].startswith("| run | final validation bits/dim |")
    # sorted by final mean; final mean ± std over seeds; mean over seeds of each seed's best epoch; s/epoch
    assert lines[4:6] == [
        "| fast | 2.500 ± 0.000 (1 seeds) | 2.500 | 2.00 |",
        "| slow | 3.700 ± 0.200 (2 seeds) | 3.250 | 2.00 |",
    ]
    assert lines[-1] == "| c | 1 | **no** |"


def test_each_benchmark_is_rendered_by_its_script():
    assert report.renderer("bench_online") is load("bench_online").render
    assert report.renderer("reproduce_rnn_mnist5k") is load("reproduce_rnn").render  # a variant of reproduce_rnn
    assert report.renderer("reproduce_fcnn_mnist5k") is load("reproduce_fcnn").render
    with pytest.raises(report.ReportError, match="'mystery' has no renderer: no script benchmarks/mystery.py"):
        report.renderer("mystery")
    with pytest.raises(report.ReportError, match=r"add render\(data\) -> str to benchmarks/mnist5k.py"):
        report.renderer("mnist5k")  # a helper module, not a benchmark
