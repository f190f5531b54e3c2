"""Products of 2x2 blocks (Rusu eqs. 2-3): float64 dense references, layer schedule, inverse, costs, autograd."""

import itertools

import pytest
import torch

from lightning_ortho.transforms import BinaryBlockProduct, BlockProduct, OpCount, SingularBlockError, binary_cores
from lightning_ortho.transforms.blocks import embed_block, schedule_layers

DT = torch.float64


def random_pairs(n: int, m: int, generator: torch.Generator) -> list[tuple[int, int]]:
    """Random pairs, many sharing coordinates (small n), some repeated exactly."""
    pairs = []
    for _ in range(m):
        i, j = torch.randperm(n, generator=generator)[:2].tolist()
        pairs.append((i, j))
    pairs[m // 2] = pairs[0]  # an exact repeat
    return pairs


def dense_product(n, pairs, cores):
    """R = R_m ... R_1 by multiplying the embedded dense blocks one by one (differentiable)."""
    matrix = torch.eye(n, dtype=cores.dtype)
    for (i, j), core in zip(pairs, cores, strict=True):
        matrix = embed_block(n, i, j, core) @ matrix
    return matrix


def sequential_apply(x, pairs, cores):
    """Block after block, one Python step each."""
    y = x.clone()
    for (i, j), core in zip(pairs, cores, strict=True):
        xi, xj = y[..., i].clone(), y[..., j].clone()
        y[..., i] = core[0, 0] * xi + core[0, 1] * xj
        y[..., j] = core[1, 0] * xi + core[1, 1] * xj
    return y


def close(a, b, atol):
    """``max |a - b| <= atol * max(1, max |b|)``: relative to the scale of the reference, no elementwise rtol."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= atol * max(1.0, float(b.abs().max()))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1)


def make(n=7, m=15, gen=None, **kwargs):
    pairs = random_pairs(n, m, gen)
    cores = torch.randn(m, 2, 2, dtype=DT, generator=gen) + 2 * torch.eye(2, dtype=DT)
    return pairs, cores, BlockProduct(n, pairs, cores, **kwargs)


def test_embed_block_is_eq2():
    core = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=DT)
    expected = torch.eye(4, dtype=DT)
    expected[1, 1], expected[1, 3], expected[3, 1], expected[3, 3] = 1.0, 2.0, 3.0, 4.0
    assert torch.equal(embed_block(4, 1, 3, core), expected)


def test_matrix_equals_dense_product_in_order(gen):
    pairs, cores, product = make(gen=gen)
    assert close(product.matrix(), dense_product(7, pairs, cores), atol=1e-12)
    # the order matters: the reversed product differs
    assert not close(product.matrix(), dense_product(7, pairs[::-1], cores.flip(0)), atol=1e-3)


def test_forward_equals_sequential_and_matrix(gen):
    pairs, cores, product = make(gen=gen)
    x = torch.randn(3, 5, 7, dtype=DT, generator=gen)
    y = product(x)
    assert y.shape == x.shape
    assert close(y, sequential_apply(x, pairs, cores), atol=1e-12)
    assert close(y, x @ product.matrix().T, atol=1e-12)
    assert close(product(x[0, 0]), y[0, 0], atol=1e-12)  # unbatched (n,)


def test_layers_are_disjoint_and_respect_order(gen):
    pairs, _, product = make(n=9, m=40, gen=gen)
    layer_of = product.layer_of.tolist()
    for a, b in itertools.combinations(range(40), 2):
        if set(pairs[a]) & set(pairs[b]):
            assert layer_of[a] < layer_of[b]
    for layer in product.layers():
        touched = [c for k in layer.tolist() for c in pairs[k]]
        assert len(touched) == len(set(touched))
    assert product.num_layers < 40  # really fewer steps than blocks
    assert sum(len(layer) for layer in product.layers()) == 40


def test_number_of_layers_is_minimal_on_known_cases():
    # q stages of perfect matchings (an M-transform): exactly q layers
    n, q = 8, 3
    pairs = [(2 * k, 2 * k + 1) for k in range(4)] + [(k, k + 4) for k in range(4)] + [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert BlockProduct(n, pairs).num_layers == q
    assert BlockProduct(4, [(0, 1), (1, 2), (2, 3)]).num_layers == 3  # a chain
    assert BlockProduct(4, [(0, 1), (0, 1), (1, 0)]).num_layers == 3  # repeats
    assert BlockProduct(6, [(0, 1), (2, 3), (4, 5)]).num_layers == 1
    # a late block on untouched coordinates goes into the first layer
    assert schedule_layers(torch.tensor([[0, 1], [1, 2], [2, 3], [4, 5]]), 6).tolist() == [0, 1, 2, 0]


def test_transpose(gen):
    _, _, product = make(gen=gen)
    assert close(product.transpose().matrix(), product.matrix().T, atol=1e-12)


def test_inverse_round_trip(gen):
    _, _, product = make(gen=gen)
    x = torch.randn(10, 7, dtype=DT, generator=gen)
    inverse = product.inverse()
    assert close(inverse(product(x)), x, atol=1e-10)
    assert close(inverse.matrix() @ product.matrix(), torch.eye(7, dtype=DT), atol=1e-10)


def test_singular_block_raises():
    cores = torch.eye(2, dtype=DT).repeat(3, 1, 1)
    cores[1] = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    with pytest.raises(SingularBlockError, match="block 1 on pair \\(2, 3\\)"):
        BlockProduct(4, [(0, 1), (2, 3), (1, 2)], cores).inverse()


def test_binary_product_is_orthonormal_and_binary_under_inverse(gen):
    n, m = 8, 30
    pairs = random_pairs(n, m, gen)
    index = torch.randint(0, 16, (m,), generator=gen)
    product = BinaryBlockProduct(n, pairs, index, dtype=DT)
    assert list(product.parameters()) == []
    assert close(product.matrix(), dense_product(n, pairs, binary_cores()[index]), atol=1e-12)
    x = torch.randn(20, n, dtype=DT, generator=gen)
    assert close(product(x).norm(dim=-1), x.norm(dim=-1), atol=1e-12)
    inverse = product.inverse()
    assert isinstance(inverse, BinaryBlockProduct)
    assert close(inverse(product(x)), x, atol=1e-12)
    assert close(inverse.matrix(), product.matrix().T, atol=1e-12)


def test_float32_binary_module_keeps_float64_precision():
    product = BinaryBlockProduct(4, [(0, 1), (1, 2), (2, 3)], [0, 1, 3])  # float32 buffers
    x = torch.randn(5, 4, dtype=DT)
    assert product(x).dtype == DT
    assert close(product(x).norm(dim=-1), x.norm(dim=-1), atol=1e-14)


def test_op_count_generic_and_special_cores():
    r = 2**-0.5
    assert BlockProduct(3, [(0, 1)], torch.randn(1, 2, 2)).op_count() == OpCount(additions=2, multiplications=4)
    shear = torch.tensor([[[1.0, 0.0], [0.3, 1.0]], [[1.0, 0.3], [0.0, 1.0]]])
    assert BlockProduct(3, [(0, 1), (1, 2)], shear).op_count() == OpCount(additions=2, multiplications=2)
    scaling = torch.tensor([[[0.5, 0.0], [0.0, 1.0]]])
    assert BlockProduct(3, [(0, 2)], scaling).op_count() == OpCount(shifts=1)
    g1 = torch.tensor([[[r, -r], [r, r]]])  # common magnitude factored out per row
    assert BlockProduct(2, [(0, 1)], g1).op_count() == OpCount(additions=2, multiplications=2)
    assert BlockProduct(2, [(0, 1)], binary_cores()[9:10]).op_count() == OpCount()


def test_op_count_sopot_blocks():
    # every entry has exactly p = 2 greedy terms: 4p shifts and 4p - 2 additions (Rusu, R_p-transforms)
    core = torch.tensor([[[0.75, 3.0], [-0.375, 1.5]]], dtype=DT)
    assert BlockProduct(2, [(0, 1)], core).op_count(terms=2) == OpCount(additions=6, shifts=8)
    # a shear in R_p: p shifts + p additions
    shear = torch.tensor([[[1.0, 0.0], [0.75, 1.0]]], dtype=DT)
    assert BlockProduct(2, [(0, 1)], shear).op_count(terms=2) == OpCount(additions=2, shifts=2)
    with pytest.raises(ValueError, match="not an exact sum of at most 1"):
        BlockProduct(2, [(0, 1)], shear).op_count(terms=1)


def test_op_count_binary_products():
    n = 4
    pairs = [(0, 1), (2, 3), (0, 2), (1, 3)]  # M-transform with q = 2, G1 cores
    assert BinaryBlockProduct(n, pairs, [0, 1, 2, 3]).op_count() == OpCount(additions=8, multiplications=8)
    assert BinaryBlockProduct(n, pairs, [8, 9, 15, 3]).op_count() == OpCount(additions=2, multiplications=2)


def test_gradients_match_dense_formula(gen):
    pairs, cores, product = make(n=6, m=10, gen=gen)
    x = torch.randn(4, 6, dtype=DT, generator=gen)
    target = torch.randn(4, 6, dtype=DT, generator=gen)
    loss = ((product(x) - target) ** 2).sum()
    (grad,) = torch.autograd.grad(loss, product.blocks)
    dense_cores = cores.clone().requires_grad_(True)
    dense_loss = ((x @ dense_product(6, pairs, dense_cores).T - target) ** 2).sum()
    (expected,) = torch.autograd.grad(dense_loss, dense_cores)
    assert close(grad, expected, atol=1e-10)
    (matrix_grad,) = torch.autograd.grad(product.matrix().sum(), product.blocks)
    (expected_matrix,) = torch.autograd.grad(dense_product(6, pairs, dense_cores).sum(), dense_cores)
    assert close(matrix_grad, expected_matrix, atol=1e-10)
    xg = x.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: product(v), (xg,))


def test_parameters_buffers_and_identity_init():
    product = BlockProduct(5, [(0, 1), (3, 4)])
    assert [name for name, _ in product.named_parameters()] == ["blocks"]
    assert product.blocks.shape == (2, 2, 2)
    x = torch.randn(3, 5)
    assert torch.equal(product(x), x)
    fixed = BlockProduct(5, [(0, 1)], trainable=False)
    assert list(fixed.parameters()) == [] and "blocks" in dict(fixed.named_buffers())
    empty = BlockProduct(3, [])
    assert empty.num_layers == 0 and torch.equal(empty(x[:, :3]), x[:, :3])
    assert torch.equal(empty.matrix(), torch.eye(3))
    double = product.double()
    assert double.blocks.dtype == DT and double.pairs.dtype == torch.int64
    clone = BlockProduct(5, [(0, 1), (3, 4)])
    clone.load_state_dict(product.state_dict())


@pytest.mark.parametrize(
    ("pairs", "error", "match"),
    [
        ([(0, 5)], ValueError, "out of range"),
        ([(-1, 2)], ValueError, "out of range"),
        ([(2, 2)], ValueError, "i == j"),
        ([(0, 1, 2)], ValueError, "shape \\(m, 2\\)"),
        (torch.tensor([[0.0, 1.0]]), TypeError, "integers"),
    ],
)
def test_bad_pairs_raise(pairs, error, match):
    with pytest.raises(error, match=match):
        BlockProduct(5, pairs)


def test_bad_blocks_and_inputs_raise():
    with pytest.raises(ValueError, match="shape \\(2, 2, 2\\)"):
        BlockProduct(4, [(0, 1), (1, 2)], torch.randn(3, 2, 2))
    with pytest.raises(ValueError, match="NaN"):
        BlockProduct(4, [(0, 1)], torch.full((1, 2, 2), float("nan")))
    with pytest.raises(ValueError, match="n must be"):
        BlockProduct(1, [])
    with pytest.raises(ValueError, match="0..15"):
        BinaryBlockProduct(4, [(0, 1)], [16])
    with pytest.raises(ValueError, match="1 pairs but 2"):
        BinaryBlockProduct(4, [(0, 1)], [1, 2])
    product = BlockProduct(4, [(0, 1)])
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        product(torch.randn(2, 5))
    with pytest.raises(ValueError, match="NaN"):
        product(torch.tensor([[1.0, float("nan"), 0.0, 0.0]]))
    with pytest.raises(TypeError, match="floating"):
        product(torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="does not match"):
        product(torch.randn(2, 4, dtype=DT))


def test_op_count_spec_section_11_and_deferred_scaling(gen):
    n = 64
    pairs = random_pairs(n, 32, gen)
    b = BinaryBlockProduct(n, pairs, torch.randint(0, 8, (32,), generator=gen))
    assert b.op_count() == OpCount(additions=64, multiplications=64)  # Rusu's experiments, B with m = 32
    for q, scale in ((8, OpCount(shifts=n)), (3, OpCount(multiplications=n))):
        stages = [torch.randperm(n, generator=gen).view(-1, 2).tolist() for _ in range(q)]
        m = BinaryBlockProduct(
            n, [p for stage in stages for p in stage], torch.randint(0, 8, (n * q // 2,), generator=gen)
        )
        assert m.op_count() == OpCount(additions=n * q, multiplications=n * q)
        assert (
            m.op_count(defer_scaling=True) == OpCount(additions=n * q) + scale
        )  # Rusu, Algorithm 3: nq adds, n shifts
    # hand count: (0,1) G1 -> pending 1,1,0; (1,2) G1 levels coordinate 2 (1 mul) -> 1,2,2; end: 1 mul + 2 shifts
    chain = BinaryBlockProduct(3, [(0, 1), (1, 2)], [0, 3])
    assert chain.op_count(defer_scaling=True) == OpCount(additions=4, multiplications=2, shifts=2)
    # a signed swap (t = 9) carries the pending power along: (0,1) G1, (1,2) swap, (0,2) G1 stays level
    swapped = BinaryBlockProduct(3, [(0, 1), (1, 2), (0, 2)], [0, 8, 1])
    assert swapped.op_count(defer_scaling=True) == OpCount(additions=4, shifts=2)
    # a diagonal sign change (t = 11) does not: (0,2) levels coordinate 2 (1 mul) -> 2,1,2; end: 1 mul + 2 shifts
    diagonal = BinaryBlockProduct(3, [(0, 1), (1, 2), (0, 2)], [0, 10, 1])
    assert diagonal.op_count(defer_scaling=True) == OpCount(additions=4, multiplications=2, shifts=2)
    # an even difference is levelled with a shift: -> 2,2,0; (1,2) shifts coordinate 2 -> 2,3,3; end 1 shift + 2 mul
    even = BinaryBlockProduct(3, [(0, 1), (0, 1), (1, 2)], [0, 3, 1])
    assert even.op_count(defer_scaling=True) == OpCount(additions=6, multiplications=2, shifts=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_grad_chunked_path_equals_the_autograd_path_and_the_dense_product(gen, dtype):
    """Inputs of >= _BAG_MIN_ELEMENTS entries that need no gradient take the chunked embedding_bag path; it must give
    what the batch-first autograd path and the dense product give (leading dims, a partial last chunk, a
    non-contiguous input, coordinates that a layer leaves alone)."""
    from lightning_ortho.transforms import blocks

    n = 40
    pairs, cores, product = make(n=n, m=90, gen=gen)
    product = product.to(dtype)
    rows = blocks._CHUNK_ELEMENTS * torch.get_num_threads() // n * 2 + 7  # two full chunks and a partial one
    assert rows * n >= blocks._BAG_MIN_ELEMENTS
    x = torch.randn(rows, 2 * n, dtype=dtype, generator=gen)[:, ::2]  # non-contiguous
    with torch.no_grad():
        fast = product(x)
    recorded = product(x.clone().requires_grad_())  # the cores are trainable: autograd path
    assert fast.grad_fn is None and recorded.grad_fn is not None and fast.is_contiguous()
    atol = 1e-12 if dtype == torch.float64 else 2e-5
    assert close(fast, recorded, atol=atol)
    assert close(fast, x.double() @ dense_product(n, pairs, cores).T, atol=atol)
    frozen = BlockProduct(n, pairs, cores.to(dtype), trainable=False)
    assert close(frozen(x.reshape(rows // 3 if rows % 3 == 0 else 1, -1, n)).reshape(rows, n), fast, atol=atol)
    assert frozen(torch.empty(0, n, dtype=dtype)).shape == (0, n)
