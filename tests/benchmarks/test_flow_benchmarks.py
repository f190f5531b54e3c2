import json
from pathlib import Path

import pytest
import torch

from lightning_ortho.nn.newton import DEFAULT_TOLERANCE
from tests.benchmarks.helpers import load


def test_quick_bench_flows_writes_every_kind_and_newton_statistics(tmp_path):
    bench = load("bench_flows")
    data = json.loads(Path(bench.main(["--quick", "--output", str(tmp_path)])).read_text())
    kinds = {row["kind"] for row in data["rows"]}
    assert kinds == {"plain", "lu", "householder", "aux", "aux_invertible", "aux (per-pixel slogdet)"}
    tolerance = DEFAULT_TOLERANCE[torch.float32]
    for row in data["rows"]:
        assert row["forward_logdet_ms"] > 0 and row["backward_ms"] > 0
        if row["kind"] in ("aux", "aux_invertible"):
            assert 1 <= row["newton_iterations_max"] and row["newton_iterations_mean"] <= row["newton_iterations_max"]
            # converged means relative residual <= tolerance: the count and the worst residual must agree
            assert 0 <= row["newton_failures"] <= row["pixels"]
            assert (row["newton_failures"] == 0) == (row["newton_worst_residual"] <= tolerance), row
        else:
            assert "newton_failures" not in row
    # aux_invertible is invertible by construction (Theorem 2): every pixel must invert
    invertible = [r for r in data["rows"] if r["kind"] == "aux_invertible"]
    assert invertible and all(r["newton_failures"] == 0 for r in invertible)
    claims = {c["claim"]: c for c in data["claims"]}
    assert any("per-pixel slogdet" in c for c in claims)
    newton = claims["Newton inverts every pixel of aux_invertible (provably invertible)"]
    assert newton["figure"] == 0 and newton["holds"] is True


def test_quick_reproduce_glow_trains_every_kind_and_checks_inversion(tmp_path):
    script = load("reproduce_glow")
    argv = ["--quick", "--output", str(tmp_path), "--kinds", "lu", "aux", "aux_invertible", "householder"]
    data = json.loads(Path(script.main(argv)).read_text())
    assert {r["method"] for r in data["rows"]} == {"lu", "aux", "aux_invertible", "householder"}
    assert all(r["val_bpd"] > 0 for r in data["rows"])
    assert {i["method"] for i in data["inversions"]} == {"lu", "aux", "aux_invertible", "householder"}
    # aux_invertible is invertible by construction: every Newton solve converges and the images come back
    invertible = next(i for i in data["inversions"] if i["method"] == "aux_invertible")
    assert invertible["newton_failures"] == 0 and invertible["reconstruction_max_error"] <= 1e-3
    claims = {c["claim"].split(" (")[0].split(":")[0]: c for c in data["claims"]}
    assert claims["Newton inverts every trained aux_invertible model"]["figure"] == 0
    hardware = load("_common").hardware_name(torch.device("cpu"))
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        f"reproduce_glow-{hardware}-quick-samples.png",
        f"reproduce_glow-{hardware}-quick.png",
    ]


@pytest.mark.slow
def test_quick_normflows_peer(tmp_path):
    # Installs normflows into benchmarks/.peers from the package registry on first use.
    script = load("peer_normflows")
    data = json.loads(Path(script.main(["--quick", "--output", str(tmp_path)])).read_text())
    assert data["rows"] and all(r["val_bpd"] > 0 for r in data["rows"])
