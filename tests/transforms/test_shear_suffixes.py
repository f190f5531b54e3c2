"""The S-DLA sweep's suffix products, built segment by segment and multiplied only on their non-identity columns,
give the choices of the dense construction (all ``A_k`` kept, full products; Rusu, arXiv 1812.03412, eqs. 21-23)."""

import pytest
import torch

from lightning_ortho.transforms import s_dla, shear_suffixes
from lightning_ortho.transforms import shear_updates as su
from lightning_ortho.transforms.shear_suffixes import suffix_products, suffix_statistics


def _statistics(n: int, seed: int, sparse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(3 * n, n, generator=g, dtype=torch.float64)
    x = torch.randn(3 * n, n, generator=g, dtype=torch.float64)
    if sparse:  # zero code columns: exactly tied scores once a shear fills one
        x[:, n // 2 :] = 0
    return y.T @ x, x.T @ x


def _dense_suffixes(entries: list[su.Entry], n: int) -> list[torch.Tensor]:
    suffix, product = [], torch.eye(n, dtype=torch.float64)
    for entry in reversed(entries):
        suffix.append(product.clone())
        su.right(product, *entry)
    return suffix[::-1]


def _dense_sweep(z, w, pairs, cores, bits):
    """The sweep with every A_k kept and full products (the construction the fast one must reproduce)."""
    z, w = s_dla._check_statistics(z, w, "reference", rescale=True)
    n = z.shape[0]
    entries = su.entries_of_blocks(pairs, cores, n, "reference")
    for k, a_k in enumerate(_dense_suffixes(entries, n)):
        a_w = a_k @ w
        m = a_k.T @ (z - a_w)
        scale = float((a_w * a_k).sum())
        entries[k] = s_dla._pick(
            m, a_k.square().sum(0), w.diagonal().clone(), bits, rounded_scaling_score=False, scale=scale,
            incumbent=entries[k][:2],
        )  # fmt: skip
        su.right_transposed(z, *entries[k])
        su.left(w, *entries[k])
        su.right_transposed(w, *entries[k])
    return su.blocks_of_entries(entries, n, z.device)


@pytest.mark.parametrize("m", [1, 2, 5, 17, 30])
@pytest.mark.parametrize("ratio", [0, 10**9], ids=["entry by entry", "matrix product"])
def test_suffix_products_are_the_dense_ones_bit_for_bit(m: int, ratio: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shear_suffixes, "SPARSE_RATIO", ratio)  # both ways of multiplying the columns
    n = 7
    g = torch.Generator().manual_seed(m)
    entries = []
    for _ in range(m):
        a, b = (int(v) for v in torch.randint(0, n, (2,), generator=g))
        entries.append((a, b, float(torch.randn((), generator=g, dtype=torch.float64)) + (2.0 if a == b else 0.0)))
    dense = _dense_suffixes(entries, n)
    got = list(suffix_products(list(entries), n))
    assert [k for k, _, _ in got] == list(range(m))
    eye = torch.eye(n, dtype=torch.float64)
    for k, a_k, columns in got:
        assert torch.equal(a_k, dense[k])
        differs = (dense[k] != eye).any(dim=0).nonzero().flatten()
        assert set(differs.tolist()) <= set(columns.tolist())
        z, w = _statistics(n, k, False)
        a_w, product = suffix_statistics(a_k, columns, z, w)
        torch.testing.assert_close(a_w, a_k @ w, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(product, a_k.T @ (z - a_k @ w), rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("sparse", [False, True], ids=["generic", "zero code columns"])
@pytest.mark.parametrize("bits", [None, 2])
@pytest.mark.parametrize("ratio", [0, 16, 10**9], ids=["entry by entry", "default", "matrix product"])
def test_sweep_makes_the_choices_of_the_dense_sweep(
    sparse: bool, bits: int | None, ratio: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shear_suffixes, "SPARSE_RATIO", ratio)
    n, m = 16, 24
    z, w = _statistics(n, 3, sparse)
    pairs, cores = s_dla.shear_greedy_init(z, w, m, bits)
    fast_pairs, fast_cores = s_dla.shear_sweep(z, w, 1.0, pairs, cores, bits)
    dense_pairs, dense_cores = _dense_sweep(z, w, pairs, cores, bits)
    assert torch.equal(fast_pairs, dense_pairs)
    torch.testing.assert_close(fast_cores, dense_cores, rtol=1e-10, atol=0)
    if bits is not None:  # rounded values: the same stored cores
        assert torch.equal(fast_cores, dense_cores)


def test_entry_optima_is_zero_where_the_objective_does_not_depend_on_the_entry() -> None:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(4, 4, generator=g, dtype=torch.float64)
    a_norms = torch.tensor([1.0, 0.0, 2.0, 3.0], dtype=torch.float64)
    x_norms = torch.tensor([0.5, 1.0, 0.0, 1e-200], dtype=torch.float64)  # 1e-200 * a_norms underflows to 0 nowhere
    values, decrease = su.entry_optima(m, a_norms, x_norms)
    denominator = a_norms[:, None] * x_norms[None, :]
    positive = denominator > 0
    torch.testing.assert_close(values[positive], m[positive] / denominator[positive], rtol=0, atol=0)
    torch.testing.assert_close(decrease[positive], -m[positive].square() / denominator[positive], rtol=0, atol=0)
    assert not values[~positive].any() and not decrease[~positive].any()
