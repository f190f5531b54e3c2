"""benchmarks/bench_transforms.py: the --quick run writes the result schema, and its numbers are recomputed here
independently (the timed products against float64 dense matrices built block by block, operation counts from
the formulas, the identity basis' error from the patches, the claims from the rows)."""

import json
import math
import re

import numpy as np
import pytest
import torch

from tests.benchmarks.helpers import ROOT, load, results_section

bench = load("bench_transforms")
renderer = load("bench_transforms_render")
report = load("report")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_transforms")
    path = bench.main(["--quick", "--output", str(tmp)])
    assert path.parent == tmp and path.name.endswith("-quick.json") and path.with_suffix(".png").exists()
    return json.loads(path.read_text())


def section(data, name):
    return [row for row in data["rows"] if row["section"] == name]


def test_quick_run_writes_the_schema(quick):
    assert quick["benchmark"] == "bench_transforms" and quick["hardware"] == "cpu1"
    assert {"torch", "date", "command", "rows", "claims", "learn", "apply", "compress", "total_seconds"} <= set(quick)
    learned = section(quick, "learn")
    timed = [r for r in learned if "seconds" in r]
    assert [(r["family"], r["label"]) for r in timed] == [(f, bench._label(p)) for f, p in bench.QUICK_LEARN_GRID]
    assert {r["family"] for r in learned if "seconds" not in r} == {"identity", "pca", "dct"}
    for row in timed:
        assert row["n"] == 64 and row["patches"] == bench.QUICK_PATCHES and row["seconds"] > 0
        assert 0 < row["error"] < 100 and row["transform_ops"]["total"] > 0
    applied = section(quick, "apply")
    assert {(r["n"], r["method"], r["threads"]) for r in applied} == {
        (n, method, 1) for n in bench.QUICK_APPLY_DIMS for method in bench.APPLY_METHODS
    }
    for row in applied:
        assert row["batch"] == bench.QUICK_APPLY_BATCH and row["forward_ms"] > 0 and row["rounds"] == 1
        assert row["max_error_vs_float64"] < 1e-5
    compressed = section(quick, "compress")
    assert [(r["family"], r["fit"]) for r in compressed] == [("dense", None), ("dense_continued", None)] + [
        (family, fit) for family, _ in bench.QUICK_COMPRESS_GRID for fit in bench.FITS
    ]
    for row in compressed[2:]:
        assert set(row["layer_errors"]) == set(bench.LAYERS) and len(row["val_acc_curve"]) == 1
        assert 0 <= row["val_acc_compressed"] <= 100 and 0 <= row["val_acc_finetuned"] <= 100
        assert ("layer_output_errors" in row) == (row["fit"] == "data")
    assert all(set(c) == {"claim", "figure", "holds"} and isinstance(c["holds"], bool) for c in quick["claims"])


def dense_float64(product) -> np.ndarray:
    """The product's matrix, multiplying the embedded 2x2 cores one by one in float64 (numpy, no library code)."""
    r = 1 / math.sqrt(2)
    g1 = [  # binary_cores' table, t = 1..8 (row-major [[a, c], [b, d]])
        [[-r, r], [r, r]],
        [[r, r], [-r, r]],
        [[r, -r], [r, r]],
        [[r, r], [r, -r]],
        [[r, -r], [-r, -r]],
        [[-r, -r], [r, -r]],
        [[-r, r], [-r, -r]],
        [[-r, -r], [-r, r]],
    ]
    matrix = np.eye(product.n)
    for (i, j), k in zip(product.pairs.tolist(), product.core_index.tolist(), strict=True):
        block = np.eye(product.n)
        block[np.ix_([i, j], [i, j])] = g1[k]
        matrix = block @ matrix
    return matrix


@pytest.mark.parametrize("n", [64, 128])
def test_timed_products_equal_the_dense_float64_product(n):
    x = torch.randn(bench.QUICK_APPLY_BATCH, n, generator=torch.Generator().manual_seed(3))
    for product, stages in ((bench.fft_like(n), int(math.log2(n))), (bench.m_like(n), bench.M_STAGES)):
        assert product.num_blocks == stages * n // 2 and product.num_layers == stages
        expected = x.double().numpy() @ dense_float64(product).T
        with torch.no_grad():
            fast = product(x)  # float32, the chunked path that is timed
        recorded = product(x.clone().requires_grad_())  # the autograd path
        assert np.abs(fast.double().numpy() - expected).max() < 1e-5
        assert np.abs(recorded.detach().double().numpy() - expected).max() < 1e-5


def test_operation_counts_and_speed_ups_recomputed(quick):
    for row in section(quick, "apply"):
        n = row["n"]
        if row["method"] == "linear":
            expected = {"additions": n * (n - 1), "multiplications": n * n, "shifts": 0}
            assert row["speedup_vs_linear"] == 1.0 and row["bytes"] == 4 * n * n
        else:
            stages = int(math.log2(n)) if row["method"].startswith("b_fft") else bench.M_STAGES
            blocks = stages * n // 2
            assert (row["blocks"], row["layers"]) == (blocks, stages)
            expected = {"additions": 2 * blocks, "multiplications": 2 * blocks, "shifts": 0}  # 4 per G1 block
            linear = next(r for r in section(quick, "apply") if r["n"] == n and r["method"] == "linear")
            assert row["speedup_vs_linear"] == pytest.approx(linear["forward_ms"] / row["forward_ms"])
        assert row["ops_per_row"] == {**expected, "total": sum(expected.values())}
    # the dense FCNN: three 64 x 64 layers and a 64 -> 10 head, n^2 multiplications and n (n - 1) additions per row
    dense_total = 3 * (64 * 64 + 64 * 63) + (10 * 64 + 10 * 63)
    compressed = section(quick, "compress")
    assert compressed[0]["ops"]["total"] == dense_total == 25654
    for row in compressed[2:]:
        ops = row["ops"]
        assert ops["total"] == ops["additions"] + ops["multiplications"] + ops["shifts"]
        assert ops["total"] == row["transform_ops"]["total"] + row["code_ops"]["total"]
        assert row["ops_ratio"] == pytest.approx(ops["total"] / dense_total)
    b_rows = [r for r in compressed if r["family"] == "b" and r["fit"] == "weights"]
    for row in b_rows:  # 4 transforms of m blocks, at most 4 operations each (G1; a signed permutation is free)
        assert 0 < row["transform_ops"]["total"] <= 4 * 4 * row["m"]


def test_identity_basis_error_recomputed_from_the_patches(quick):
    y = bench.patches(bench.QUICK_PATCHES, bench.QUICK_PATCH_STRIDE).double().numpy()
    s = bench.LEARN_S
    kept = np.take_along_axis(y, np.argsort(-np.abs(y), axis=1)[:, :s], axis=1)
    error = 100 * (1 - (kept**2).sum() / (y**2).sum())  # T_s(Y) drops everything but s entries per row
    row = next(r for r in section(quick, "learn") if r["family"] == "identity")
    assert row["error"] == pytest.approx(error, rel=1e-9)
    basis = bench.dct_basis(8)
    assert torch.allclose(basis.T @ basis, torch.eye(64, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(basis[:, 0], torch.full((64,), 1 / 8, dtype=torch.float64))


def test_claims_are_computed_from_rows(quick):
    claims = {c["claim"]: c for c in quick["claims"]}
    rows = section(quick, "apply")
    largest = max(bench.QUICK_APPLY_DIMS)
    speed = next(c for k, c in claims.items() if k.startswith("B, FFT-like (log2 n stages) >= 5x faster"))
    b = next(r for r in rows if r["n"] == largest and r["method"] == "b_fft")
    assert speed["figure"] == round(b["speedup_vs_linear"], 2) and speed["holds"] == (b["speedup_vs_linear"] >= 5)
    dense = section(quick, "compress")[0]
    gap = next(c for k, c in claims.items() if k.startswith("the best compressed digits FCNN"))
    within = [r for r in section(quick, "compress")[2:] if r["ops_ratio"] <= bench.OPS_BUDGET]
    best = max(r["val_acc_finetuned"] for r in within)
    assert gap["figure"] == round(dense["val_acc"] - best, 2) and gap["holds"] == (dense["val_acc"] - best <= 1)
    learn = [c for k, c in claims.items() if "learns in seconds" in k]
    assert len(learn) == 5 and all(c["holds"] == (c["figure"] < 60) for c in learn)  # b, m, shear, b4x4, fast


def test_crossover_and_live_blocks():
    rows = [
        {"n": n, "method": "b_fft", "threads": 1, "speedup_vs_linear": s}
        for n, s in ((256, 0.5), (512, 1.2), (1024, 0.9), (2048, 2.0), (4096, 5.0))
    ]
    assert bench.crossover(rows, "b_fft", 1) == 2048  # faster at 512, but not from there on
    assert bench.crossover(rows, "b_fft", 2) is None
    from lightning_ortho.transforms import BinaryBlockProduct

    # t = 2 (rotation -45) undone by t = 3 (rotation +45) on the same pair: nothing is left
    assert bench.live_blocks(BinaryBlockProduct(4, [(0, 1), (0, 1)], [1, 2])) == 0
    # a block on coordinate 1 in between keeps all three
    assert bench.live_blocks(BinaryBlockProduct(4, [(0, 1), (1, 2), (0, 1)], [1, 0, 2])) == 3
    # a block on other coordinates in between does not
    assert bench.live_blocks(BinaryBlockProduct(4, [(0, 1), (2, 3), (0, 1)], [1, 0, 2])) == 1


def test_report_renders_the_quick_result(quick):
    text = renderer.render(quick)
    assert text.startswith("Reproduce: `python -m benchmarks.bench_transforms`\n")
    assert "| transform | blocks (live) | layers | seconds | error (%) |" in text
    assert re.search(r"\| 64 \| 1 \| [\d.]+ \| [\d.]+ \([\d.]+x\) \|", text)
    assert "| dense (1 epochs) | | 25,654 (" in text and "| b m=32, s=4 | data |" in text
    assert text.count("| claim | measured | holds |") == 1


def test_results_page_section_is_rendered_from_the_committed_results():
    """As report.sections() renders it (result files in name order, smoke runs skipped), without reading the other
    benchmarks' files."""
    paths = sorted(
        p for p in (ROOT / "benchmarks" / "results").glob("bench_transforms-*.json") if not p.stem.endswith("-quick")
    )
    if not paths:
        pytest.skip("no committed bench_transforms results")
    body = "\n\n".join(renderer.render(json.loads(p.read_text())) for p in paths)
    assert results_section("bench_transforms") == body + "\n"
    assert report.renderer("bench_transforms") is renderer.render
