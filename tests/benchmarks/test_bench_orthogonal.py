import json
import math
import subprocess
import sys
from pathlib import Path

from tests.benchmarks.helpers import load, results_section

measures = load("_orthogonal_rows")


def quick_run(tmp_path, monkeypatch, bench, *argv):
    monkeypatch.setattr(bench, "QUICK_DIMS", (16,))
    monkeypatch.setattr(bench, "QUICK_BATCHES", (8, 300))
    monkeypatch.setattr(bench, "FCNN_QUICK", (16, 256))  # 4x4 digits, two batches of 128
    path = bench.main(["--quick", "--rounds", "1", "--output", str(tmp_path), *argv])
    return json.loads(Path(path).read_text())


def test_quick_benchmark_writes_schema(tmp_path, monkeypatch):
    bench = load("bench_orthogonal")
    data = quick_run(tmp_path, monkeypatch, bench)
    assert data["benchmark"] == "bench_orthogonal" and data["hardware"].startswith("cpu")
    assert {"torch", "date", "command", "rows", "claims", "peers", "fcnn"} <= set(data)
    maps = [row for row in data["rows"] if "section" not in row]
    assert {row["method"] for row in maps} == set(measures.METHODS)
    assert {(row["d"], row["batch"]) for row in maps} == {(16, 8), (16, 300)}
    peer = data["peers"]["geotorch"]
    assert peer["requirement"] == load("_peers").GEOTORCH and peer["triv"] == {
        "geotorch": "expm",
        "geotorch_cayley": "cayley",
    }
    geotorch_installed = "version" in peer
    if not geotorch_installed:  # no network: the rows say so instead of the run crashing
        assert peer["skipped"]
    for row in maps:
        if row["method"] in measures.GEOTORCH_METHODS and not geotorch_installed:
            assert row["skipped"].startswith("geotorch not available")
            continue
        assert "skipped" not in row, row
        assert row["forward_ms"] > 0 and row["both_ms"] > 0 and row["rounds"] == 1
        if row["method"] == "linear":
            assert row["both_ratio_to_linear"] == 1.0

    fcnn = [row for row in data["rows"] if row.get("section") == "fcnn_epoch"]
    assert [row["method"] for row in fcnn] == list(measures.FCNN_METHODS)
    assert data["fcnn"]["d"] == 16 and data["fcnn"]["rounds"] == 1 and data["fcnn"]["batch_size"] == 128
    assert data["fcnn"]["data"].startswith(("mnist5k: 256 of the 4,000 real MNIST", "random uniform pixels"))
    for row in fcnn:
        assert row["d"] == 16 and row["images"] == 256
        if row["method"] in measures.GEOTORCH_METHODS and not geotorch_installed:
            assert row["skipped"].startswith("geotorch not available")
            continue
        assert row["batches"] == 2 and row["rounds"] == 1 and row["epoch_s"] > 0
        assert math.isfinite(row["train_loss_last_epoch"]) and 1.0 < row["train_loss_first_epoch"] < 4.0
    assert next(row for row in fcnn if row["method"] == "aux")["epoch_ratio_to_aux"] == 1.0
    # d = 16 is below the grid of every map claim; the FCNN claims are there
    claims = [c["claim"] for c in data["claims"]]
    assert any(c.startswith("aux FCNN epoch >= 2x faster than the fastest other map") for c in claims)
    assert any("geotorch" in c for c in claims) == geotorch_installed


def test_geotorch_unavailable_is_recorded_not_raised(tmp_path, monkeypatch):
    bench = load("bench_orthogonal")
    monkeypatch.setattr(bench, "load_geotorch", lambda: (None, "pip install geotorch==0.4.0 failed: offline"))
    monkeypatch.setattr(measures, "FCNN_METHODS", {"aux": "aux", "cayley": "cayley", "geotorch": "aux"})
    data = quick_run(tmp_path, monkeypatch, bench)
    assert data["peers"]["geotorch"]["skipped"] == "pip install geotorch==0.4.0 failed: offline"
    skipped = [row for row in data["rows"] if row["method"] in measures.GEOTORCH_METHODS]
    assert len(skipped) == 2 * 2 + 1  # both trivializations at two batch sizes, and the FCNN row
    assert all(
        row["skipped"] == "geotorch not available: pip install geotorch==0.4.0 failed: offline" for row in skipped
    )
    assert all("epoch_s" in row for row in data["rows"] if row.get("section") and row["method"] != "geotorch")
    assert not any("geotorch" in c["claim"] for c in data["claims"])
    text = load("bench_orthogonal_render").render(data)
    assert "| 16 | 8 |" in text and "geotorch (expm, default) | geotorch (cayley) |" in text
    assert "| geotorch (expm, default) | skipped |" in text and "(not available)" in text
    assert "Skipped: geotorch not available: pip install geotorch==0.4.0 failed: offline." in text


def map_row(d, b, method, both, linear=None):
    row = {"d": d, "batch": b, "method": method, "forward_ms": both / 3, "both_ms": both}
    if linear:
        row.update(forward_ratio_to_linear=both / 3 / (linear / 3), both_ratio_to_linear=both / linear)
    return row


def fcnn_row(method, seconds):
    return {"section": "fcnn_epoch", "d": 784, "batch": 128, "images": 4000, "method": method, "epoch_s": seconds}


def test_claims_are_computed_from_rows():
    rows = [
        {
            "d": 784,
            "batch": 1024,
            "method": "linear",
            "forward_ms": 10,
            "both_ms": 30,
            "forward_ratio_to_linear": 1,
            "both_ratio_to_linear": 1,
        },
        {
            "d": 784,
            "batch": 1024,
            "method": "aux",
            "forward_ms": 12,
            "both_ms": 42,
            "forward_ratio_to_linear": 1.2,
            "both_ratio_to_linear": 1.4,
        },
        {"d": 784, "batch": 1024, "method": "householder_sequential", "forward_ms": 100, "both_ms": 400},
        {"d": 784, "batch": 1024, "method": "householder_wy", "forward_ms": 20, "both_ms": 100},
        {"d": 784, "batch": 1024, "method": "cayley", "forward_ms": 20, "both_ms": 84},
    ]
    claims = {c["claim"].split(" (")[0].split(" at ")[0]: c for c in measures.claims_from(rows)}
    aux = claims["aux forward+backward <= 1.3x nn.Linear"]
    assert aux["figure"] == 1.4 and aux["holds"] is False
    wy = claims["householder wy >= 5x faster than sequential"]
    assert wy["figure"] == 4.0 and wy["holds"] is False
    fastest = claims["aux faster than the fastest other orthogonal map"]
    assert fastest["figure"] == 2.0 and fastest["holds"] is True
    assert len(claims) == 4  # no geotorch rows, no FCNN rows: no claims about them


def test_geotorch_and_fcnn_claims_are_computed_from_rows():
    maps = [
        map_row(784, 1024, "linear", 30, linear=30),
        map_row(784, 1024, "aux", 42, linear=30),
        map_row(784, 1024, "cayley", 84),
        map_row(784, 1024, "geotorch", 126),  # 3.0x aux
        map_row(784, 1024, "geotorch_cayley", 35),  # faster than aux: both claims at d=784 fail
        map_row(2048, 1024, "linear", 80, linear=80),
        map_row(2048, 1024, "aux", 100, linear=80),
        map_row(2048, 1024, "householder_wy", 200),
        map_row(2048, 1024, "geotorch", 500),
        map_row(2048, 1024, "geotorch_cayley", 300),
        {"d": 2048, "batch": 1024, "method": "matrix_exp", "skipped": "too slow"},
        map_row(256, 1024, "aux", 10),  # below d = 784: no claim
        map_row(784, 128, "householder_sequential", 400),  # the FCNN's (d, B): its rows must not be mistaken for these
        map_row(784, 128, "householder_wy", 100),
        map_row(256, 1024, "geotorch", 1),
    ]
    fcnn = [
        fcnn_row("aux", 1.0),
        fcnn_row("householder_wy", 5.0),
        fcnn_row("cayley", 1.5),  # only 1.5x aux's epoch: the paper's 2x does not hold here
        fcnn_row("matrix_exp", 30.0),
        fcnn_row("geotorch", 40.0),
        {**fcnn_row("geotorch_cayley", 0), "skipped": "geotorch not available: offline"},
    ]
    claims = {c["claim"]: c for c in measures.claims_from(maps + fcnn)}
    expected = {
        "aux faster than the fastest other orthogonal map (geotorch_cayley) at d=784, B=1024": (0.83, False),
        "aux faster than geotorch's faster trivialization (geotorch_cayley) at d=784, B=1024": (0.83, False),
        "aux faster than the fastest other orthogonal map (householder_wy) at d=2048, B=1024": (2.0, True),
        "householder wy >= 5x faster than sequential (forward+backward) at d = 784 (worst batch)": (4.0, False),
        "aux faster than geotorch's faster trivialization (geotorch_cayley) at d=2048, B=1024": (3.0, True),
        "aux FCNN epoch >= 2x faster than the fastest other map (cayley) at d=784 (paper: 2-6x); figure = speed-up": (
            1.5,
            False,
        ),
        "aux FCNN epoch >= 2x faster than geotorch's faster trivialization (geotorch) at d=784 (paper: 2-6x); "
        "figure = speed-up": (40.0, True),
    }
    for text, (figure, holds) in expected.items():
        assert (claims[text]["figure"], claims[text]["holds"]) == (figure, holds), text
    assert len(claims) == len(expected) + 2  # and aux <= 1.3x nn.Linear (forward+backward, forward)
    # FCNN rows never enter the map claims, nor map rows the FCNN claims
    map_only = {c["claim"]: c for c in measures.claims_from(maps)}
    assert map_only == {k: v for k, v in claims.items() if "FCNN" not in k}
    fcnn_only = measures.claims_from(fcnn)
    assert [c["claim"] for c in fcnn_only] == [k for k in claims if "FCNN" in k]


def test_report_renders_geotorch_columns_and_fcnn_table_only_when_present():
    render = load("bench_orthogonal_render").render
    base = {"hardware": "cpu2", "torch": "2.14.1", "date": "2026-12-01", "command": "python b.py", "claims": []}
    maps = [map_row(784, 1024, "linear", 30, linear=30), map_row(784, 1024, "aux", 42, linear=30)]
    without = render({**base, "rows": maps})
    assert "| d | B | nn.Linear | aux |\n" in without  # no empty columns for methods that have no rows
    assert "geotorch" not in without and "FCNN" not in without
    data = {
        **base,
        "rows": maps + [map_row(784, 1024, "geotorch", 126, linear=30)] + [fcnn_row("aux", 1.0), fcnn_row("cayley", 2)],
        "peers": {"geotorch": {"requirement": "geotorch==0.4.0", "version": "0.4.0", "triv": {"geotorch": "expm"}}},
        "fcnn": {"data": "random uniform pixels", "optimizer": "Adam lr 0.001"},
    }
    data["rows"][-2].update(epoch_ratio_to_aux=1.0, rounds=3, train_loss_first_epoch=2.3, train_loss_last_epoch=0.5)
    data["rows"][-1].update(epoch_ratio_to_aux=2.0, rounds=2, train_loss_first_epoch=2.2, train_loss_last_epoch=0.4)
    text = render(data)
    assert "| d | B | nn.Linear | aux | geotorch (expm, default) |\n" in text
    assert "| 784 | 1024 | 30.00 ms | 1.40x | 4.20x |" in text and "| 784 | 128 |" not in text  # FCNN rows apart
    assert "geotorch (expm, default) is `triv='expm'`" in text and "data: random uniform pixels" in text
    assert "| aux | 1.000 | 1.00x | 3 | 2.300 -> 0.500 |" in text
    assert "| cayley | 2.000 | 2.00x | 2 | 2.200 -> 0.400 |" in text


def test_results_page_section_is_rendered_from_the_committed_results():
    report = load("report")
    assert results_section("bench_orthogonal") == report.sections()["bench_orthogonal"] + "\n"


def test_peer_installs_only_when_the_pinned_version_is_missing(tmp_path, monkeypatch):
    peers = load("_peers")
    monkeypatch.setattr(sys, "path", list(sys.path))
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        (tmp_path / "fakepeer_xyz").mkdir()
        (tmp_path / "fakepeer_xyz" / "__init__.py").write_text("VERSION = '1.0'\n")
        (tmp_path / "fakepeer_xyz-1.0.dist-info").mkdir()
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(peers.subprocess, "run", fake_pip)
    module, reason = peers.import_peer("fakepeer_xyz", "fakepeer_xyz==1.0", target=tmp_path)
    assert reason is None and module.VERSION == "1.0" and sys.path[0] == str(tmp_path)
    assert calls[0][-3:] == ["--target", str(tmp_path), "fakepeer_xyz==1.0"] and "--no-deps" in calls[0]
    assert peers.import_peer("fakepeer_xyz", "fakepeer_xyz==1.0", target=tmp_path)[0] is module
    assert len(calls) == 1  # the pinned version is there: no second install
    sys.modules.pop("fakepeer_xyz")


def test_peer_that_cannot_be_installed_gives_a_reason(tmp_path, monkeypatch):
    peers = load("_peers")
    monkeypatch.setattr(sys, "path", list(sys.path))
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for geotorch==0.4.0")
    monkeypatch.setattr(peers.subprocess, "run", lambda command, **kwargs: failed)
    module, reason = peers.import_peer("geotorch_not_here", "geotorch==0.4.0", target=tmp_path)
    assert module is None and reason.startswith("pip install geotorch==0.4.0 failed (exit 1)")
    assert "No matching distribution" in reason
