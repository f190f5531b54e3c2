import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_benchmark_writes_schema(tmp_path, monkeypatch):
    bench = load("bench_orthogonal")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "QUICK_DIMS", (16,))
    monkeypatch.setattr(bench, "QUICK_BATCHES", (8, 300))
    path = bench.main(["--quick", "--rounds", "1"])
    data = json.loads(Path(path).read_text())
    assert data["benchmark"] == "bench_orthogonal" and data["hardware"].startswith("cpu")
    assert {"torch", "date", "command", "rows", "claims"} <= set(data)
    methods = {row["method"] for row in data["rows"]}
    assert methods == set(bench.METHODS)
    for row in data["rows"]:
        assert row["forward_ms"] > 0 and row["both_ms"] > 0
        if row["method"] == "linear":
            assert row["both_ratio_to_linear"] == 1.0


def test_claims_are_computed_from_rows():
    bench = load("bench_orthogonal")
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
    claims = {c["claim"].split(" (")[0].split(" at ")[0]: c for c in bench.claims_from(rows)}
    aux = claims["aux forward+backward <= 1.3x nn.Linear"]
    assert aux["figure"] == 1.4 and aux["holds"] is False
    wy = claims["householder wy >= 5x faster than sequential"]
    assert wy["figure"] == 4.0 and wy["holds"] is False
    fastest = claims["aux faster than the fastest other orthogonal map"]
    assert fastest["figure"] == 2.0 and fastest["holds"] is True
