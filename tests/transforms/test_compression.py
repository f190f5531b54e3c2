import copy
import io

import pytest
import torch
from torch import nn

from lightning_ortho.nn import SVDLinear
from lightning_ortho.transforms.binary_cores import G1_INDICES, G2_INDICES, IDENTITY_INDEX, binary_cores
from lightning_ortho.transforms.blocks import BinaryBlockProduct, BlockProduct, embed_block
from lightning_ortho.transforms.compression import (
    FactorizedLinear,
    NotAffineError,
    compress_linear,
    restore_factorized,
)
from lightning_ortho.transforms.costs import OpCount
from lightning_ortho.transforms.factorized_linear import STATE_FORMAT, restore_factorized_on_load

F64 = torch.float64


def dense_product(n, pairs, cores):
    """R = R_m ... R_1 from eq. (2)-(3), block 0 acting first (plain matrix products)."""
    matrix = torch.eye(n, dtype=F64)
    for (i, j), core in zip(pairs, cores, strict=True):
        matrix = embed_block(n, i, j, core.to(F64)) @ matrix
    return matrix


def random_pairs(n, m, generator):
    return [tuple(torch.randperm(n, generator=generator)[:2].tolist()) for _ in range(m)]


def random_mask(out, n, s, generator):
    index = torch.rand(out, n, generator=generator).argsort(dim=1)[:, :s]
    return torch.zeros(out, n, dtype=torch.bool).scatter_(1, index, True)


def dictionary_and_dense(kind, n=10, m=14, seed=1):
    generator = torch.Generator().manual_seed(seed)
    pairs = random_pairs(n, m, generator)
    if kind == "binary":
        index = torch.randint(0, 15, (m,), generator=generator)
        cores = binary_cores(F64)[index]
        return BinaryBlockProduct(n, pairs, index, dtype=F64), dense_product(n, pairs, cores)
    cores = torch.randn(m, 2, 2, generator=generator, dtype=F64) + 2 * torch.eye(2, dtype=F64)
    return BlockProduct(n, pairs, cores), dense_product(n, pairs, cores)


def linear_with(weight, bias=None):
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None).to(weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def structured_layer(out=24, n=16, rank=4):
    """A low-rank-plus-noise weight, the kind of structure trained layers have."""
    weight = torch.randn(out, rank, dtype=F64) @ torch.randn(rank, n, dtype=F64) + 0.1 * torch.randn(out, n, dtype=F64)
    return linear_with(weight, torch.randn(out, dtype=F64))


def dense_error(weight, approximation):
    return float(100 * (weight - approximation).square().sum() / weight.square().sum())


def factors(module):
    """``(C, T)`` of a FactorizedLinear from its parts: masked codes and the transform applied to the identity."""
    codes = torch.where(module.mask, module.codes.detach(), 0)
    eye = torch.eye(module.in_features, dtype=codes.dtype)
    return codes, module.transform(eye).T  # rows of forward(I) are T e_i


# ------------------------------------------------------------------------------------------ FactorizedLinear


@pytest.mark.parametrize("kind", ["binary", "general"])
def test_forward_is_c_times_d_transpose_x_plus_b(kind):
    dictionary, d = dictionary_and_dense(kind)
    generator = torch.Generator().manual_seed(2)
    codes = torch.randn(7, 10, generator=generator, dtype=F64)  # dense: entries off the mask must be dropped
    mask = random_mask(7, 10, 3, generator)
    bias = torch.randn(7, generator=generator, dtype=F64)
    module = FactorizedLinear.from_dictionary(dictionary, codes, bias, mask=mask)
    x = torch.randn(2, 3, 10, generator=generator, dtype=F64)
    weight = torch.where(mask, codes, 0) @ d.T
    torch.testing.assert_close(module(x), x @ weight.T + bias, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(module.dense_weight(), weight, rtol=1e-12, atol=1e-12)
    assert module(x).shape == (2, 3, 7)
    assert [name for name, _ in module.named_parameters()] == ["codes", "bias"]  # the transform is fixed


def test_codes_train_only_on_their_support():
    dictionary, _ = dictionary_and_dense("binary")
    generator = torch.Generator().manual_seed(3)
    mask = random_mask(6, 10, 2, generator)
    module = FactorizedLinear.from_dictionary(dictionary, torch.randn(6, 10, dtype=F64), mask=mask)
    start = module.codes.detach().clone()
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1, weight_decay=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        module(torch.randn(16, 10, dtype=F64)).square().sum().backward()
        assert bool((module.codes.grad[~mask] == 0).all()) and bool((module.codes.grad[mask] != 0).any())
        optimizer.step()
    assert bool((module.codes[~mask] == 0).all())
    assert bool((module.codes[mask] != start[mask]).all())
    x = torch.randn(4, 10, dtype=F64)
    before = module(x)
    with torch.no_grad():
        module.codes[~mask] = 5.0  # whatever lands off the support never reaches the output
    torch.testing.assert_close(module(x), before, rtol=0, atol=0)


def test_op_count_is_transform_plus_sparse_rows():
    pairs = [(0, 1), (2, 3), (1, 2), (4, 5), (0, 5)]
    index = [G1_INDICES[0], G2_INDICES[0], G1_INDICES[3], IDENTITY_INDEX, G1_INDICES[5]]
    dictionary = BinaryBlockProduct(6, pairs, index, dtype=F64)
    codes = torch.tensor(
        [
            [0.3, 0.0, -1.7, 2.2, 0.0, 0.0],  # 3 generic nonzeros: 2 additions, 3 multiplications
            [0.0] * 6,  # empty row: free
            [0.0, 0.9, 0.0, 0.0, 0.0, 0.0],  # 1 nonzero: 1 multiplication
            [1.0, -1.0, 0.0, 0.0, 0.0, 0.0],  # +-1 entries: 1 addition, no multiplication
            [0.5, 0.0, 0.25, 0.0, 0.0, 0.0],  # powers of two: 1 addition, 2 shifts
        ],
        dtype=F64,
    )
    module = FactorizedLinear.from_dictionary(dictionary, codes, torch.zeros(5, dtype=F64))
    transform = OpCount(additions=2 * 3, multiplications=2 * 3)  # 3 G1 cores, 2 adds + 2 mults each; G2 free
    assert module.transform_op_count() == transform
    assert module.codes_op_count() == OpCount(additions=2 + 1 + 1, multiplications=3 + 1, shifts=2)
    assert module.op_count() == OpCount(additions=6 + 4, multiplications=6 + 4, shifts=2)
    assert module.dense_op_count() == OpCount(additions=5 * 5, multiplications=5 * 6)
    assert module.nnz == 8


@pytest.mark.parametrize("kind", ["binary", "general"])
def test_state_dict_round_trip(kind):
    dictionary, _ = dictionary_and_dense(kind, seed=4)
    generator = torch.Generator().manual_seed(4)
    mask = random_mask(5, 10, 3, generator)
    module = FactorizedLinear.from_dictionary(
        dictionary, torch.randn(5, 10, dtype=F64), torch.randn(5, dtype=F64), mask=mask
    )
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    rebuilt = FactorizedLinear.from_state_dict(torch.load(buffer))
    x = torch.randn(8, 10, dtype=F64)
    assert torch.equal(rebuilt(x), module(x)) and torch.equal(rebuilt.mask, mask)
    assert type(rebuilt.transform) is type(module.transform)

    model = nn.Sequential(nn.Linear(10, 10).double(), nn.ReLU(), nn.Linear(10, 5).double())
    compressed = nn.Sequential(model[0], nn.ReLU(), module)
    fresh = nn.Sequential(nn.Linear(10, 10).double(), nn.ReLU(), nn.Linear(10, 5).double())
    assert restore_factorized(fresh, compressed.state_dict()) == ["2"]
    fresh.load_state_dict(compressed.state_dict())
    assert torch.equal(fresh(x), compressed(x))


def test_a_state_saved_before_the_marker_loads_and_a_marked_one_rebuilds_by_marker():
    dictionary, _ = dictionary_and_dense("binary", seed=5)
    module = FactorizedLinear.from_dictionary(dictionary, torch.randn(5, 10, dtype=F64), torch.randn(5, dtype=F64))
    compressed = nn.Sequential(nn.Linear(10, 10).double(), nn.ReLU(), module)
    state = compressed.state_dict()
    assert state["2._extra_state"]["format"] == STATE_FORMAT
    old = {k: v for k, v in state.items() if not k.endswith("_extra_state")}  # as saved by the first release
    x = torch.randn(4, 10, dtype=F64)
    for saved in (state, old):
        fresh = restore_factorized_on_load(nn.Sequential(nn.Linear(10, 10).double(), nn.ReLU(), nn.Linear(10, 5)))
        fresh.load_state_dict(saved)  # the pre-hook rebuilds layer 2 first
        assert isinstance(fresh[2], FactorizedLinear) and torch.equal(fresh(x), compressed(x))
    smaller = FactorizedLinear.from_dictionary(dictionary, torch.randn(3, 10, dtype=F64))
    with pytest.raises(ValueError, match="rebuild the module"):
        smaller.set_extra_state(state["2._extra_state"])


def test_a_dense_state_loads_into_a_compressed_model_as_linear_layers_keeping_what_trains():
    dense = nn.Sequential(nn.Linear(10, 10).double(), nn.ReLU(), nn.Linear(10, 5).double())
    saved = copy.deepcopy(dense.state_dict())  # e.g. a checkpoint written before compression
    compressed = nn.Sequential(dense[0], nn.ReLU(), compress_linear(dense[2], s=3, m=8, progress=False))
    compressed[2].codes.requires_grad_(False)  # frozen by the user, bias still trained
    compressed[2].eval()
    assert restore_factorized(compressed, saved) == ["2"]
    restored = compressed[2]
    assert type(restored) is nn.Linear and (restored.in_features, restored.out_features) == (10, 5)
    assert not restored.weight.requires_grad and restored.bias.requires_grad and not restored.training
    compressed.load_state_dict(saved)  # strict
    x = torch.randn(4, 10, dtype=F64)
    assert torch.equal(compressed(x), dense(x))
    # and forth again: a compressed state into the model that is dense now
    state = nn.Sequential(dense[0], nn.ReLU(), compress_linear(dense[2], s=3, m=8, progress=False)).state_dict()
    assert restore_factorized(compressed, state) == ["2"] and isinstance(compressed[2], FactorizedLinear)
    assert not compressed[2].codes.requires_grad and not compressed[2].training  # from the layer it replaced


def test_a_dense_state_of_another_kind_of_layer_is_refused_by_name():
    compressed = nn.Sequential(compress_linear(nn.Linear(6, 4), s=2, m=4, progress=False))
    with pytest.raises(RuntimeError, match=r"'0'.*not the state of an nn.Linear.*freshly built model"):
        restore_factorized(compressed, {"0.u": torch.zeros(4, 4), "0.v": torch.zeros(6, 4)})
    assert restore_factorized(compressed, {}) == [] and isinstance(compressed[0], FactorizedLinear)  # partial state


def test_from_state_dict_names_missing_keys():
    with pytest.raises(KeyError, match="layer.codes"):
        FactorizedLinear.from_state_dict({"layer.mask": torch.ones(2, 2, dtype=torch.bool)}, prefix="layer.")


# ------------------------------------------------------------------------------------------ compress_linear


@pytest.mark.parametrize("family", ["b", "m"])
def test_compress_linear_error_is_the_dense_relative_error(family):
    layer = linear_with(torch.randn(12, 24, dtype=F64), torch.randn(12, dtype=F64))
    kwargs = {"m": 16} if family == "b" else {"q": 2}
    module = compress_linear(layer, family, s=4, **kwargs)
    codes, transform = factors(module)
    expected = dense_error(layer.weight.detach(), codes @ transform)
    assert module.error == pytest.approx(expected, rel=1e-10) and module.report.error == module.error
    assert 0 < module.error < 100
    assert module.mask.sum(dim=1).tolist() == [4] * 12  # exactly s per row
    x = torch.randn(5, 24, dtype=F64)
    torch.testing.assert_close(module(x), x @ (codes @ transform).T + layer.bias.detach(), rtol=1e-12, atol=1e-12)
    report = module.report
    assert report.dense_ops == OpCount(additions=12 * 23, multiplications=12 * 24)
    assert report.factorized_ops == module.op_count() == report.transform_ops + report.code_ops
    assert report.code_ops == OpCount(additions=12 * 3, multiplications=12 * 4)
    assert report.blocks == module.transform.num_blocks == (16 if family == "b" else 2 * 12)


def test_support_has_s_entries_per_row_even_where_the_codes_vanish():
    layer = linear_with(torch.eye(6, dtype=F64))  # W D = D: rows with fewer than s nonzeros
    module = compress_linear(layer, s=3, m=2)
    assert module.error == pytest.approx(0, abs=1e-20)
    assert int((module.codes != 0).sum()) < 18 and module.mask.sum(dim=1).tolist() == [3] * 6
    nonzero = (module.codes != 0).sum(dim=1)
    assert module.codes_op_count().additions == int((nonzero - 1).clamp_min(0).sum())  # zeros on the support: free


def test_more_nonzeros_and_more_blocks_lower_the_error():
    layer = structured_layer()
    by_s = [compress_linear(layer, s=s, m=16).error for s in (1, 2, 4, 8)]
    by_m = [compress_linear(layer, s=2, m=m).error for m in (2, 8, 32)]
    by_q = [compress_linear(layer, "m", s=2, q=q).error for q in (1, 4)]
    assert by_s == sorted(by_s, reverse=True) and by_s[-1] < by_s[0] / 4
    assert by_m == sorted(by_m, reverse=True) and by_m[-1] < by_m[0] / 2
    assert by_q[1] < by_q[0]


def test_defaults_cost_well_below_the_dense_layer():
    layer = nn.Linear(32, 24)
    module = compress_linear(layer)
    total = lambda c: c.additions + c.multiplications + c.shifts  # noqa: E731
    assert (module.report.s, module.report.blocks) == (4, 48)  # s = in // 8, m = out * in // 16
    assert total(module.op_count()) < 0.3 * total(module.dense_op_count())
    assert module.codes.dtype == torch.float32 and module(torch.randn(3, 32)).dtype == torch.float32
    wide = compress_linear(linear_with(layer.weight.detach().double(), layer.bias.detach().double()))
    torch.testing.assert_close(module.codes.detach(), wide.codes.detach().float())  # learned in float64 either way


def test_svd_linear_is_materialised_exactly():
    layer = SVDLinear(12, 8, orthogonal="householder").double()
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(6, 12, dtype=F64)
    full = compress_linear(layer, s=12, m=8)  # s = in: the codes hold W D exactly
    torch.testing.assert_close(full(x), layer(x), rtol=1e-10, atol=1e-10)
    assert full.error < 1e-20
    u, vt = layer.left.matrix().detach(), layer.right.matrix().detach()
    sigma = torch.zeros(8, 12, dtype=F64)
    sigma[range(8), range(8)] = layer.singular_values.detach()
    weight = u @ sigma @ vt  # U Sigma V^T from the layer's own factors
    sparse = compress_linear(layer, s=3, m=8)
    codes, transform = factors(sparse)
    assert sparse.error == pytest.approx(dense_error(weight, codes @ transform), rel=1e-8)
    torch.testing.assert_close(sparse.bias.detach(), layer.bias.detach())


def test_generic_affine_modules_and_non_affine_ones():
    composite = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 4)).double()
    with pytest.raises(TypeError, match="in_features"):
        compress_linear(composite)
    module = compress_linear(composite, s=6, m=6, in_features=6)
    x = torch.randn(3, 6, dtype=F64)
    torch.testing.assert_close(module(x), composite(x), rtol=1e-10, atol=1e-10)
    with pytest.raises(NotAffineError, match="not affine"):
        compress_linear(nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4)), in_features=6)
    with pytest.raises(NotAffineError, match="orthogonal='aux' is not linear"):
        compress_linear(SVDLinear(8, 8, orthogonal="aux"))


def test_data_refit_is_the_least_squares_optimum_on_the_support():
    layer = structured_layer()
    data = torch.randn(200, 16, dtype=F64) * torch.linspace(0.1, 3, 16, dtype=F64) + 1.0
    plain = compress_linear(layer, s=3, m=16)
    aware = compress_linear(layer, s=3, m=16, data=data)
    assert torch.equal(aware.mask, plain.mask) and plain.report.output_error is None
    target = layer(data).detach()

    def output_error(module):
        return float(100 * (target - module(data).detach()).square().sum() / target.square().sum())

    assert aware.report.output_error == pytest.approx(output_error(aware), rel=1e-9)
    assert output_error(aware) < output_error(plain)
    (target - aware(data)).square().sum().backward()  # stationary in the support's values and the bias
    (target - plain(data)).square().sum().backward()
    assert aware.codes.grad[aware.mask].abs().max() < 1e-8 * plain.codes.grad[plain.mask].abs().max()
    assert aware.bias.grad.abs().max() < 1e-8 * (1 + plain.bias.grad.abs().max())
    codes, transform = factors(aware)
    assert aware.error == pytest.approx(dense_error(layer.weight.detach(), codes @ transform), rel=1e-10)


def bad_weight(value):
    weight = torch.randn(4, 6)
    weight[1, 2] = value
    return linear_with(weight)


@pytest.mark.parametrize(
    ("make", "kwargs", "error", "match"),
    [
        (lambda: nn.Linear(6, 4), {"family": "x"}, ValueError, "family must be one of"),
        (lambda: nn.Linear(6, 4), {"s": 0}, ValueError, r"s must be an int in \[1, 6\]"),
        (lambda: nn.Linear(6, 4), {"s": 7}, ValueError, r"s must be an int in \[1, 6\]"),
        (lambda: nn.Linear(7, 4), {"family": "m"}, ValueError, "even in_features"),
        (lambda: nn.Linear(1, 4), {}, ValueError, "in_features >= 2"),
        (lambda: bad_weight(float("nan")), {}, ValueError, "NaN or inf"),
        (lambda: linear_with(torch.zeros(4, 6)), {}, ValueError, "all zeros"),
        (lambda: nn.Linear(6, 4), {"q": 2}, ValueError, "stages of family 'm'"),
        (lambda: nn.Linear(6, 4), {"family": "m", "m": 4}, ValueError, "number of blocks"),
        (lambda: nn.Linear(6, 4), {"bits": 2}, ValueError, "SOPOT terms"),
        (lambda: nn.Linear(6, 4), {"iterations": 0}, ValueError, "iterations must be an int"),
        (lambda: nn.Linear(6, 4), {"data": torch.randn(5, 3)}, ValueError, r"data must be a floating \(N, 6\)"),
        (lambda: nn.ReLU(), {}, TypeError, "in_features"),
    ],
)
def test_bad_input_is_refused_clearly(make, kwargs, error, match):
    with pytest.raises(error, match=match):
        compress_linear(make(), **kwargs)


@pytest.mark.parametrize("family", ["b", "m", "shear", "b4x4"])
def test_one_input_feature_is_refused_for_every_family_without_pointing_to_another(family):
    # No family can factor a single input (2x2 blocks act on pairs), so the advice is to keep the layer dense.
    with pytest.raises(ValueError, match="in_features >= 2") as caught:
        compress_linear(nn.Linear(1, 4), family)
    assert "family=" not in str(caught.value).split("got 1")[1] and "keep it dense" in str(caught.value)


def test_shear_family_error_is_the_dense_relative_error():
    layer = structured_layer(out=12, n=8)
    module = compress_linear(layer, "shear", s=3, m=8, bits=2, iterations=2)
    assert module.report.transform_ops.multiplications == 0  # SOPOT shears and power-of-two scalings: shifts
    assert module.report.transform_ops.shifts > 0
    codes, transform = factors(module)
    assert module.error == pytest.approx(dense_error(layer.weight.detach(), codes @ transform), rel=1e-8)
    x = torch.randn(4, 8, dtype=F64)
    torch.testing.assert_close(module(x), x @ (codes @ transform).T + layer.bias.detach(), rtol=1e-10, atol=1e-10)
