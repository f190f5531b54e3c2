"""benchmarks/reproduce_transforms.py: the quick run writes the result format, and its errors are what an
independent computation gives (2-D DCT and WHT by scipy, op counts by the stated formulas)."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.fft
import scipy.linalg
import torch

from tests.benchmarks.helpers import load

FAMILIES = {
    "identity",
    "DCT 2-D",
    "WHT",
    "Haar 2-D",
    "PCA",
    "learned dense",
    "B",
    "M",
    "shear (1 bit)",
    "shear (exact)",
    "B⊗",
}
ROW_KEYS = {"family", "label", "error", "additions", "multiplications", "shifts", "total_ops", "coding", "seconds"}


def top_s_error(y: np.ndarray, coefficients: np.ndarray, inverse, s: int) -> float:
    """Error (%) of keeping the ``s`` largest coefficients of each row and mapping back with ``inverse``."""
    kept = np.zeros_like(coefficients)
    index = np.argsort(-np.abs(coefficients), axis=1)[:, :s]
    np.put_along_axis(kept, index, np.take_along_axis(coefficients, index, axis=1), axis=1)
    return float(100 * np.square(y - inverse(kept)).sum() / np.square(y).sum())


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    script = load("reproduce_transforms")
    folder = tmp_path_factory.mktemp("results")
    path = Path(script.main(["--quick", "--output", str(folder)]))
    return script, path, json.loads(path.read_text())


def test_quick_run_writes_the_result_format(quick):
    script, path, data = quick
    assert path.name.endswith("-quick.json") and path.with_suffix(".png").exists()
    assert data["benchmark"] == "reproduce_transforms" and data["hardware"].startswith("cpu")
    assert {"torch", "date", "command", "rows", "claims", "setup", "peers", "op_count_sources"} <= set(data)
    assert data["setup"]["s"] == 4 and data["setup"]["n"] == 64 and data["setup"]["quick"]
    assert FAMILIES <= {row["family"] for row in data["rows"]}
    for row in data["rows"]:
        assert ROW_KEYS <= set(row), row
        assert 0 <= row["error"] <= 100
        assert row["total_ops"] == row["additions"] + row["multiplications"] + row["shifts"]
    assert data["claims"] and all({"claim", "figure", "holds"} <= set(c) for c in data["claims"])
    assert all(isinstance(c["holds"], bool) for c in data["claims"])
    peer = data["peers"]["pyfaust"]
    assert peer["requirement"] == script.PYFAUST and ("version" in peer) != ("error" in peer)  # exactly one
    if "version" in peer:  # FAµST rows carry the same fields and the matched B size
        faust = [row for row in data["rows"] if row["family"].startswith("FAµST")]
        assert {row["matched_b_m"] for row in faust if "matched_b_m" in row} == set(data["setup"]["b_sizes"])
    # B and M: the blocks are binary, so the counts follow the paper's formulas.
    for row in data["rows"]:
        if row["family"] == "B":
            g1 = row["additions"] // 2
            assert row["additions"] == row["multiplications"] == 2 * g1 and g1 <= row["value"]
        if row["family"] == "M":
            assert (row["additions"], row["multiplications"], row["shifts"]) == (64 * row["value"], 0, 64)
        if row["family"] == "B⊗":  # 4x4 blocks: 12 additions + 4 shifts each; scored on the held-out patches
            assert (row["additions"], row["multiplications"], row["shifts"]) == (12 * row["value"], 0, 4 * row["value"])
            assert row["error"] == row["held_out_error"] and 0 < row["train_error"] < 100
            assert row["train_patches"] + row["held_out_patches"] == data["setup"]["patches"]
            assert row["held_out_patches"] == round(0.25 * data["setup"]["patches"])


def test_errors_match_an_independent_computation(quick):
    _, _, data = quick
    from lightning_ortho.datamodules import ImagePatchesDataModule

    setup = data["setup"]
    module = ImagePatchesDataModule(val_fraction=0, max_patches=setup["max_patches"], seed=0)
    y = module.all_patches().double().numpy()
    assert y.shape == (setup["patches"], 64)
    rows = {row["family"]: row for row in data["rows"]}

    blocks = y.reshape(-1, 8, 8)
    dct = scipy.fft.dctn(blocks, type=2, norm="ortho", axes=(1, 2)).reshape(-1, 64)
    inverse = lambda c: scipy.fft.idctn(c.reshape(-1, 8, 8), type=2, norm="ortho", axes=(1, 2)).reshape(-1, 64)
    assert rows["DCT 2-D"]["error"] == pytest.approx(top_s_error(y, dct, inverse, 4), rel=1e-9)
    assert (rows["DCT 2-D"]["additions"], rows["DCT 2-D"]["multiplications"]) == (16 * 29, 16 * 11)

    h = scipy.linalg.hadamard(64) / 8.0
    assert rows["WHT"]["error"] == pytest.approx(top_s_error(y, y @ h, lambda c: c @ h.T, 4), rel=1e-9)
    assert (rows["WHT"]["additions"], rows["WHT"]["shifts"]) == (64 * 6, 64)

    identity = top_s_error(y, y, lambda c: c, 4)
    assert rows["identity"]["error"] == pytest.approx(identity, rel=1e-9)


def test_haar_and_wht_as_b_transform_are_what_they_claim():
    script = load("reproduce_transforms")
    haar = script.haar_2d()
    assert torch.allclose(haar.T @ haar, torch.eye(64, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(haar[:, 0], torch.full((64,), 1 / 8, dtype=torch.float64))  # the DC atom
    wht = script.wht_as_b_transform()
    assert wht.num_blocks == 192
    assert torch.allclose(wht.matrix().double(), torch.from_numpy(scipy.linalg.hadamard(64) / 8.0), atol=1e-12)
    ops = wht.op_count(defer_scaling=True)
    assert (ops.additions, ops.multiplications, ops.shifts) == (384, 0, 64)


def test_claims_logic():
    script = load("reproduce_transforms")

    def r(family, value, error, ops, **extra):
        return {
            "family": family,
            "label": f"{family} {value}",
            "value": value,
            "error": error,
            "total_ops": ops,
            **extra,
        }

    rows = [
        r("B", 64, 50.0, 256),
        r("B", 128, 45.0, 512),
        r("B", 256, 44.0, 1024),
        r("M", 2, 60.0, 192),
        r("M", 4, 44.0, 320),
        r("M", 8, 50.0, 576),
        r("shear (1 bit)", 64, 55.0, 100),
        r("shear (1 bit)", 128, 54.5, 200),
        r("shear (exact)", 64, 54.5, 120),
        r("shear (exact)", 128, 52.0, 250),
        r("DCT 2-D", 0, 36.0, 704),
        r("PCA", 0, 38.0, 8128),
    ]
    claims = {
        c["claim"].split(" (")[0]: c for c in script.claims_from(rows, {"error": 41.0, "blocks": 192, "total_ops": 768})
    }
    assert claims["error falls with m: B"]["holds"]
    assert claims["B beats M at equal block count m = nq/2"]["figure"] == "10.00 / -1.00 / 6.00"
    assert not claims["B beats M at equal block count m = nq/2"]["holds"]
    shear = claims["1-bit shears are close to exact ones"]
    assert shear["figure"] == "0.50 / 2.50" and not shear["holds"]
    assert not claims["B_m-DLA at m = 256 reaches the WHT, itself a B-transform of 192 G1 blocks"]["holds"]
