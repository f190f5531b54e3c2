import json
from pathlib import Path

import pytest

from tests.benchmarks.test_bench_orthogonal import load


def test_quick_bench_flows_writes_every_kind_and_newton_statistics(tmp_path, monkeypatch):
    bench = load("bench_flows")
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    data = json.loads(Path(bench.main(["--quick"])).read_text())
    kinds = {row["kind"] for row in data["rows"]}
    assert kinds == {"plain", "lu", "householder", "aux", "aux_invertible", "aux (per-pixel slogdet)"}
    for row in data["rows"]:
        assert row["forward_logdet_ms"] > 0 and row["backward_ms"] > 0
        if row["kind"].startswith("aux") and "slogdet" not in row["kind"]:
            assert row["newton_iterations_max"] >= 1 and row["newton_failures"] >= 0
    assert any("per-pixel slogdet" in c["claim"] for c in data["claims"])


def test_quick_reproduce_glow_trains_every_kind_and_checks_inversion(tmp_path, monkeypatch):
    script = load("reproduce_glow")
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    monkeypatch.setattr(script, "RESULTS", tmp_path)
    data = json.loads(
        Path(script.main(["--quick", "--kinds", "lu", "aux", "aux_invertible", "householder"])).read_text()
    )
    assert {r["method"] for r in data["rows"]} == {"lu", "aux", "aux_invertible", "householder"}
    assert all(r["val_bpd"] > 0 for r in data["rows"])
    assert {i["method"] for i in data["inversions"]} == {"lu", "aux", "aux_invertible", "householder"}
    claims = {c["claim"].split(" (")[0].split(":")[0] for c in data["claims"]}
    assert "Newton inverts every trained aux_invertible model" in claims
    assert (tmp_path / "reproduce_glow-cpu2-quick-samples.png").exists() or any(tmp_path.glob("*-samples.png"))


@pytest.mark.slow
def test_quick_normflows_peer(tmp_path, monkeypatch):
    # Installs normflows into benchmarks/.peers from the package registry on first use.
    script = load("peer_normflows")
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    data = json.loads(Path(script.main(["--quick"])).read_text())
    assert data["rows"] and all(r["val_bpd"] > 0 for r in data["rows"])
