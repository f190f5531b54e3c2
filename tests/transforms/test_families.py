"""The family table: every place that chooses a family reads it, and family "b4x4" (B⊗_m-DLA, 4x4 Hadamard blocks)
works in each of them: compress_linear, FastTransformModule (streaming) and TransformCompression."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.models.fast_transform_module import FastTransformModule
from lightning_ortho.transforms.b4_dla import learn_b4x4_transform
from lightning_ortho.transforms.compression import compress_linear, default_hyperparameters
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.families import FAMILIES, FAMILY_TABLE, quad_product_as_pairs
from lightning_ortho.transforms.quad_cores import QuadBlockProduct, quad_cores
from tests.conftest import make_tiny_trainer

F64 = torch.float64


def dense_quad_product(n: int, quads, index) -> torch.Tensor:  # noqa: ANN001
    """``B_m ... B_1`` by plain matrix products, each ``B_k`` the identity with core ``index[k]`` on ``quads[k]``."""
    cores, matrix = quad_cores(F64), torch.eye(n, dtype=F64)
    for quad, k in zip(quads, index, strict=True):
        block = torch.eye(n, dtype=F64)
        block[torch.tensor(quad)[:, None], torch.tensor(quad)[None, :]] = cores[k]
        matrix = block @ matrix
    return matrix


def test_the_table_lists_every_family_with_its_hyperparameters_and_constraints() -> None:
    assert FAMILIES == ("b", "m", "shear", "b4x4")
    takes = {name: spec.takes for name, spec in FAMILY_TABLE.items()}
    assert takes == {"b": ("m",), "m": ("q",), "shear": ("m", "bits"), "b4x4": ("m",)}
    b4x4 = FAMILY_TABLE["b4x4"]
    assert [n for n in range(1, 7) if b4x4.feature_problem(n) is None] == [4, 5, 6]
    assert [n for n in range(1, 7) if FAMILY_TABLE["m"].feature_problem(n) is None] == [2, 4, 6]
    assert [n for n in range(1, 7) if FAMILY_TABLE["b"].feature_problem(n) is None] == [2, 3, 4, 5, 6]
    for name, spec in FAMILY_TABLE.items():
        for n, out in ((4, 3), (32, 24), (64, 200)):
            defaults = default_hyperparameters(name, n, out)
            assert defaults == spec.defaults(n, out) and set(defaults) == {"s", *set(spec.takes) - {"bits"}}
            assert 1 <= defaults["s"] <= n and all(v >= 1 for v in defaults.values())


def test_b4x4_defaults_keep_the_transform_near_an_eighth_of_the_dense_count() -> None:
    # m = clamp(out in // 64, in // 4, in): 16 operations per block.
    assert default_hyperparameters("b4x4", 32, 24) == {"s": 4, "m": 12}
    assert default_hyperparameters("b4x4", 32, 2) == {"s": 4, "m": 8}  # at least in // 4
    assert default_hyperparameters("b4x4", 16, 4096) == {"s": 2, "m": 16}  # at most in


def test_every_one_of_the_768_cores_as_2x2_blocks_is_the_same_matrix_exactly() -> None:
    cores = quad_cores(F64)
    for k in range(768):
        pairs = quad_product_as_pairs(QuadBlockProduct(4, [[0, 1, 2, 3]], [k], dtype=F64))
        assert torch.equal(pairs.matrix(), cores[k]), k
        assert 4 <= pairs.num_blocks <= 6
        assert pairs.op_count() == OpCount(additions=8, shifts=4)  # the butterfly; swaps and signs are free


def test_a_product_of_4x4_blocks_as_2x2_blocks_is_the_dense_product() -> None:
    g = torch.Generator().manual_seed(0)
    n, m = 9, 7
    quads = [sorted(torch.randperm(n, generator=g)[:4].tolist()) for _ in range(m)]
    index = torch.randint(0, 768, (m,), generator=g).tolist()
    expected = dense_quad_product(n, quads, index)
    pairs = quad_product_as_pairs(QuadBlockProduct(n, quads, index, dtype=F64))
    assert torch.equal(pairs.matrix(), expected)
    x = torch.randn(3, n, dtype=F64, generator=g)
    torch.testing.assert_close(pairs(x), x @ expected.T, rtol=1e-15, atol=1e-15)
    assert quad_product_as_pairs(QuadBlockProduct(n, [], [], dtype=F64)).num_blocks == 0


def test_compress_linear_with_b4x4_is_the_learned_transform_and_codes() -> None:
    g = torch.Generator().manual_seed(1)
    layer = nn.Linear(16, 12).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(12, 16, dtype=F64, generator=g).cumsum(1))
    weight, bias = layer.weight.detach(), layer.bias.detach()
    module = compress_linear(layer, "b4x4", s=3, m=6, iterations=2)
    learned = learn_b4x4_transform(weight, 6, 3, iterations=2)  # the in-memory learner on the rows of W
    quads, index = learned.transform.quads.tolist(), learned.transform.core_index.tolist()
    d = dense_quad_product(16, quads, index)
    codes = module.sparse_codes().detach()
    torch.testing.assert_close(codes, learned.codes, rtol=1e-12, atol=1e-12)  # T_s(W D): s per row
    assert module.mask.sum(1).tolist() == [3] * 12
    dense = codes @ d.T  # C D^T
    torch.testing.assert_close(module.dense_weight().detach(), dense, rtol=0, atol=1e-12)
    x = torch.randn(5, 16, dtype=F64, generator=g)
    torch.testing.assert_close(module(x), x @ dense.T + bias, rtol=1e-12, atol=1e-12)
    expected_error = float(100 * (weight - dense).square().sum() / weight.square().sum())
    assert module.error == pytest.approx(expected_error, rel=1e-10) and module.error == module.report.error
    assert module.error == pytest.approx(learned.errors[-1], rel=1e-9)
    report = module.report
    assert (report.family, report.blocks, report.stages, report.bits) == ("b4x4", 6, None, None)
    # what runs: each 4x4 block as its butterfly of 2x2 blocks, 8 additions + 4 shifts (the paper counts 12 + 4)
    assert report.transform_ops == module.transform_op_count() == OpCount(additions=8 * 6, shifts=4 * 6)
    assert learned.transform.transpose().op_count() == OpCount(additions=12 * 6, shifts=4 * 6)
    nonzero = (codes != 0).sum(1)
    assert report.code_ops == OpCount(additions=int((nonzero - 1).sum()), multiplications=int(nonzero.sum()))
    assert report.factorized_ops == report.transform_ops + report.code_ops
    assert report.planned_steps == report.steps == 6 * (1 + 2)  # greedy picks, then 2 sweeps of re-picks


@pytest.mark.parametrize(
    ("make", "kwargs", "match"),
    [
        (lambda: nn.Linear(3, 4), {}, r"family='b4x4' needs in_features >= 4 .* got 3; use family='b' or 'shear'"),
        (lambda: nn.Linear(6, 4), {"q": 2}, "q is the stages of family 'm' only; family 'b4x4' takes m"),
        (lambda: nn.Linear(6, 4), {"bits": 2}, "SOPOT terms per shear of family 'shear' only"),
        (lambda: nn.Linear(6, 4), {"m": 0}, r"m must be an int >= 1"),
    ],
)
def test_b4x4_refuses_what_it_cannot_take(make, kwargs, match) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=match):
        compress_linear(make(), "b4x4", **kwargs)


def test_the_odd_in_features_advice_for_m_names_every_family_that_fits() -> None:
    with pytest.raises(ValueError, match=r"even in_features .* use family='b', 'shear' or 'b4x4'"):
        compress_linear(nn.Linear(7, 4), "m")


def _walks(count: int = 300, n: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, n, generator=g).cumsum(1)


def test_fast_transform_module_b4x4_learns_what_the_in_memory_learner_learns(tmp_path) -> None:  # noqa: ANN001
    data = _walks()
    loader = DataLoader(TensorDataset(data, torch.zeros(len(data))), batch_size=64, shuffle=False)
    # tol above rounding: streamed and in-memory sums differ in their last bits (summation order).
    module = FastTransformModule(family="b4x4", m=8, s=3, iterations=4, tol=1e-9)
    trainer = make_tiny_trainer(tmp_path, max_epochs=30, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    expected = learn_b4x4_transform(data.double(), 8, 3, iterations=4, tol=1e-9)
    learned = module.transform(F64)
    assert isinstance(learned, QuadBlockProduct)
    assert learned.quads.tolist() == expected.transform.quads.tolist()
    assert learned.core_index.tolist() == expected.transform.core_index.tolist()
    assert module.learner.finished and trainer.current_epoch == 3 + len(expected.errors)
    assert float(trainer.callback_metrics["train_error"]) == pytest.approx(expected.errors[-1], rel=1e-6)
    assert float(trainer.callback_metrics["additions"]) == 12 * 8 and float(trainer.callback_metrics["shifts"]) == 32
    assert float(trainer.callback_metrics["multiplications"]) == 0


def test_fast_transform_module_names_every_family_and_b4x4_needs_four_features(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=r"'b', 'm' or 'shear' \(2x2 blocks\) or 'b4x4' \(4x4 blocks\), got 'dct'"):
        FastTransformModule(family="dct")
    loader = DataLoader(TensorDataset(_walks(count=64, n=3)), batch_size=32)
    with pytest.raises(ValueError, match="n >= 4"):
        make_tiny_trainer(tmp_path, max_epochs=2).fit(FastTransformModule(family="b4x4"), train_dataloaders=loader)


class TinyRegression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def test_transform_compression_compresses_with_b4x4(tmp_path) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x[:, :3].sin()), batch_size=32)
    model = TinyRegression()
    callback = TransformCompression(family="b4x4", m=4, s=2, metric=None, verbose=False, progress=False)
    make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(model, train_dataloaders=loader)
    assert [row["module"] for row in callback.report] == ["net.0", "net.2"]
    for row in callback.report:
        assert (row["family"], row["blocks"], row["s"]) == ("b4x4", 4, 2)
        # the butterflies that run: 8 additions + 4 shifts per 4x4 block
        assert (row["transform_ops_additions"], row["transform_ops_shifts"]) == (8 * 4, 4 * 4)
    with pytest.raises(ValueError, match="q is the stages of family 'm' only; family 'b4x4' takes m"):
        TransformCompression(family="b4x4", q=3)


def test_a_b4x4_compressed_layer_is_rebuilt_from_its_state_dict() -> None:
    from lightning_ortho.transforms.factorized_linear import FactorizedLinear

    layer = nn.Linear(8, 5)
    module = compress_linear(layer, "b4x4", s=2, m=3)
    rebuilt = FactorizedLinear.from_state_dict(module.state_dict())
    x = torch.randn(4, 8)
    assert torch.equal(rebuilt(x), module(x))
    assert rebuilt.transform.num_blocks == module.transform.num_blocks  # the 2x2 form, 4 to 6 blocks per 4x4 block
    assert 4 * 3 <= module.transform.num_blocks <= 6 * 3 and module.report.blocks == 3


def test_a_layer_too_wide_for_the_b4x4_scan_is_refused_before_any_work():
    from torch import nn

    from lightning_ortho.transforms import compress_linear

    with pytest.raises(ValueError, match="in_features <= 128"):
        compress_linear(nn.Linear(200, 8), family="b4x4")
