import pytest
import torch

from lightning_ortho.transforms.sparse_codes import keep_largest, representation_error


def test_keep_largest_is_the_best_s_sparse_approximation_under_an_orthonormal_dictionary():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(20, 6, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    codes = keep_largest(data @ q, 2)
    assert ((codes != 0).sum(1) == 2).all()
    best = representation_error(data, codes, q)
    # every other support of size 2 (with optimal values for it) is no better
    import itertools

    projected = data @ q
    for row in range(3):
        errors = []
        for support in itertools.combinations(range(6), 2):
            x = torch.zeros(6, dtype=torch.float64)
            x[list(support)] = projected[row, list(support)]
            errors.append((data[row] - q @ x).square().sum())
        chosen = (data[row] - q @ codes[row]).square().sum()
        assert chosen <= min(errors) + 1e-12
    assert 0 < best < 100


def test_bad_arguments():
    with pytest.raises(ValueError, match="s must be"):
        keep_largest(torch.zeros(3, 4), 5)
    with pytest.raises(ValueError, match=r"\(N, n\)"):
        keep_largest(torch.zeros(4), 1)
