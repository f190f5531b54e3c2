"""benchmarks/report.py: the results pages' tables (docs/results/*.md) are the rendering of the committed results,
and pages whose sections do not match the results are an error, never a silent skip."""

import json
import shutil

import pytest

from tests.benchmarks.helpers import ROOT, load

RESULTS = ROOT / "benchmarks" / "results"
PAGES = ROOT / "docs" / "results"
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


def pages_dir(tmp_path, **pages: str):
    """A folder of results pages ``NAME.md`` with the given texts."""
    folder = tmp_path / "pages"
    folder.mkdir()
    for name, text in pages.items():
        (folder / f"{name}.md").write_text(text)
    return folder


def test_results_pages_are_the_rendering_of_the_committed_results():
    bodies = report.sections(RESULTS)
    assert {"bench_flows", "bench_orthogonal", "reproduce_fcnn", "reproduce_rnn", "reproduce_glow"} <= set(bodies)
    texts = {str(path): text for path, text in report.read_pages(PAGES).items()}
    assert str(PAGES / "paper.md") in texts and str(PAGES / "benchmarks.md") in texts
    assert report.render_pages(texts, bodies) == texts, "docs/results is stale: run python -m benchmarks.report"
    # every benchmark with results on exactly one page (render_pages raises otherwise; counted here as well)
    for name in bodies:
        assert sum(name in report.marked(text) for text in texts.values()) == 1, name
    assert report.stale_pages(PAGES, RESULTS) == []
    assert report.main(["--check"]) == 0


def test_update_pages_rewrites_stale_sections_byte_for_byte(tmp_path):
    folder = tmp_path / "pages"
    shutil.copytree(PAGES, folder)
    text = (PAGES / "paper.md").read_text()
    start, end = text.index("<!-- reproduce_glow:start -->\n"), text.index("<!-- reproduce_glow:end -->")
    (folder / "paper.md").write_text(text[: start + len("<!-- reproduce_glow:start -->\n")] + "stale\n" + text[end:])
    assert report.stale_pages(folder, RESULTS) == [folder / "paper.md"]
    assert report.update_pages(folder, RESULTS) == [folder / "paper.md"]
    for page in PAGES.glob("*.md"):
        assert (folder / page.name).read_bytes() == page.read_bytes(), page.name
    assert report.update_pages(folder, RESULTS) == []


def test_check_exits_1_on_a_stale_page(tmp_path, monkeypatch, capsys):
    results = results_dir(tmp_path, "peer_normflows")
    pages = pages_dir(tmp_path, glow=section("peer_normflows"))
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "PAGES", pages)
    assert report.main(["--check"]) == 1
    assert "glow.md out of date: run python -m benchmarks.report" in capsys.readouterr().err
    assert report.main([]) == 0
    assert report.main(["--check"]) == 0


def test_results_without_a_section_are_an_error(tmp_path):
    results = results_dir(tmp_path, "peer_normflows", "bench_flows")
    pages = pages_dir(tmp_path, index="# title\n\n", speed="# title\n\n" + section("bench_flows"))
    with pytest.raises(report.ReportError, match="peer_normflows has results but no results page has a section for it"):
        report.update_pages(pages, results)
    assert (pages / "speed.md").read_text() == "# title\n\n" + section("bench_flows")  # nothing written
    (pages / "index.md").write_text(section("peer_normflows"))
    assert report.update_pages(pages, results) == [pages / "index.md", pages / "speed.md"]
    assert "normflows (LU, unconditional split priors)" in (pages / "index.md").read_text()
    assert "normflows" not in (pages / "speed.md").read_text()


def test_a_benchmark_on_two_pages_is_an_error(tmp_path):
    results = results_dir(tmp_path, "peer_normflows")
    pages = pages_dir(tmp_path, a=section("peer_normflows"), b=section("peer_normflows"))
    with pytest.raises(report.ReportError, match=r"peer_normflows has a section on more than one page \(a.md, b.md\)"):
        report.update_pages(pages, results)
    assert (pages / "a.md").read_text() == section("peer_normflows")


def test_a_section_without_results_is_an_error(tmp_path):
    results = results_dir(tmp_path, "peer_normflows")
    pages = {"paper.md": section("peer_normflows"), "speed.md": section("bench_flows")}
    with pytest.raises(report.ReportError, match=r"speed.md has a section .* no bench_flows-\*\.json results"):
        report.render_pages(pages, report.sections(results))
    # quick runs do not count as results
    shutil.copy(RESULTS / "bench_flows-cpu2.json", results / "bench_flows-cpu2-quick.json")
    assert set(report.sections(results)) == {"peer_normflows"}
    with pytest.raises(report.ReportError, match=r"no bench_flows-\*\.json results"):
        report.render_pages(pages, report.sections(results))


def test_a_marker_quoted_in_a_sentence_is_prose():
    text = "Put the lines `<!-- bench_flows:start -->` and `<!-- bench_flows:end -->` on a page.\n"
    assert report.marked(text) == set()
    assert report.render_pages({"design.md": text}, {}) == {"design.md": text}
    with pytest.raises(report.ReportError, match="bench_flows has results but no results page has a section"):
        report.render_pages({"design.md": text}, {"bench_flows": "table"})


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
        report.render_page(text, {"peer_normflows": "table"})


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


def test_each_benchmark_is_rendered_by_its_scripts_renderer(tmp_path, monkeypatch):
    assert report.renderer("bench_online") is load("bench_online_render").render
    assert report.renderer("reproduce_rnn_mnist5k") is load("reproduce_rnn_render").render  # a variant of reproduce_rnn
    assert report.renderer("reproduce_fcnn_mnist5k") is load("reproduce_fcnn_render").render
    with pytest.raises(report.ReportError, match="'mystery' has no renderer: no script benchmarks/mystery.py"):
        report.renderer("mystery")
    with pytest.raises(report.ReportError, match="'mnist5k' has no renderer: no script benchmarks/mnist5k.py"):
        report.renderer("mnist5k")  # a tool that writes no results, not a benchmark
    with pytest.raises(report.ReportError, match="'_online_problem' has no renderer: no script"):
        report.renderer("_online_problem")  # a helper
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_new.py").write_text("")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    with pytest.raises(report.ReportError, match=r"add render\(data\) -> str to benchmarks/bench_new_render.py"):
        report.renderer("bench_new_cpu")
