"""S-DLA's choices must not depend on floating-point rounding: the same data gives the same shears on any CPU, BLAS
kernel or thread count. Exact ties are common (a zero code column that a shear fills becomes a copy of another
column, so every shear reading either one has the same score), and an exact argmin let the rounding of the sums
decide them. These tests change only what must not matter (summation order, scale, rounding-level noise in the
statistics) and require identical choices."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.transforms.s_dla import learn_shear_transform, omp_codes, shear_greedy_init, shear_sweep
from lightning_ortho.transforms.sparse_codes import keep_largest
from lightning_ortho.transforms.statistics import principal_basis

F64 = torch.float64


def _tie_prone(seed: int = 0) -> torch.Tensor:
    """``(500, 8)`` data whose OMP codes (s = 3) leave a column zero: the greedy init meets exact ties."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(500, 8, generator=g, dtype=F64) @ torch.randn(8, 8, generator=g, dtype=F64)


def _noisy(matrix: torch.Tensor, seed: int, symmetric: bool = False) -> torch.Tensor:
    """``matrix`` with a relative perturbation of ~1e-14 per entry: what another summation order may give."""
    noise = torch.empty_like(matrix).uniform_(-1e-14, 1e-14, generator=torch.Generator().manual_seed(seed))
    if symmetric:
        noise = (noise + noise.T) / 2
    return matrix * (1 + noise)


def _same_blocks(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], exact: bool) -> None:
    assert a[0].tolist() == b[0].tolist()
    if exact:  # rounded values: sums of powers of two, equal bit for bit when the choice is the same
        assert torch.equal(a[1], b[1])
    else:
        torch.testing.assert_close(a[1], b[1], rtol=1e-9, atol=1e-12)


def test_stable_argmin_ties_go_to_the_preferred_entry_then_row_major_order() -> None:
    from lightning_ortho.transforms.shear_updates import TIE_RTOL, stable_argmin

    scores = torch.tensor([[0.0, -1.0, -0.5], [-1.0 - 1e-15, 0.0, -1.0 + 1e-15], [-0.99, 0.0, float("inf")]], dtype=F64)
    assert stable_argmin(scores, 1.0) == (0, 1)  # three entries within rounding of -1: the first in row-major order
    assert stable_argmin(scores, 1.0, preferred=(1, 2)) == (1, 2)  # a tied incumbent stays
    assert stable_argmin(scores, 1.0, preferred=(2, 0)) == (0, 1)  # -0.99 is not tied: it does not stay
    assert stable_argmin(scores, 1.0, preferred=(2, 2)) == (0, 1)
    # A real difference decides however small the scores; near-zero scores are ties relative to the scale.
    assert stable_argmin(scores * 1e-300, 1e-300) == (0, 1)
    assert stable_argmin(torch.tensor([[-1.0, -1.5], [0.0, 0.0]], dtype=F64) * 1e-300, 1e-300) == (0, 1)
    small = torch.tensor([[1.0, -1e-3 * TIE_RTOL], [-2e-3 * TIE_RTOL, 1.0]], dtype=F64)
    assert stable_argmin(small, 1.0) == (0, 1)
    assert stable_argmin(small, 1e-12) == (1, 0)


@pytest.mark.parametrize("bits", [None, 2])
def test_greedy_init_and_sweep_ignore_rounding_noise_in_the_statistics(bits: int | None) -> None:
    y = _tie_prone()
    x = keep_largest(y @ principal_basis(y.T @ y), 3)
    z, w = y.T @ x, x.T @ x
    assert bool((w.diagonal() == 0).any())  # the zero code column that makes exact ties
    expected = shear_greedy_init(z, w, 16, bits)
    for seed in range(6):
        _same_blocks(shear_greedy_init(_noisy(z, seed), _noisy(w, seed + 100, True), 16, bits), expected, bits == 2)
    codes = omp_codes(y, torch.eye(8, dtype=F64), 3)  # a sweep from the init's blocks, for other codes
    z, w, energy = y.T @ codes, codes.T @ codes, float(y.square().sum())
    expected_sweep = shear_sweep(z, w, energy, *expected, bits)
    for seed in range(6):
        noisy = shear_sweep(_noisy(z, seed), _noisy(w, seed + 100, True), energy, *expected, bits)
        _same_blocks(noisy, expected_sweep, bits == 2)


@pytest.fixture(scope="module")
def reference() -> dict:
    y = _tie_prone()
    return {bits: learn_shear_transform(y, 16, 3, bits=bits, iterations=3) for bits in (None, 2)}


@pytest.mark.parametrize("bits", [None, 2])
@pytest.mark.parametrize("variant", ["reversed rows", "permuted rows", "times 3", "times 2^-600"])
def test_learner_choices_invariant_to_row_order_and_scale(reference: dict, variant: str, bits: int | None) -> None:
    # Row order changes every BLAS summation, a factor 3 every rounding, 2^-600 the range (the statistics would
    # underflow without the learner's power-of-two rescaling); none changes the math, so none may change a choice.
    y = _tie_prone()
    permutation = torch.randperm(500, generator=torch.Generator().manual_seed(1))
    data = {
        "reversed rows": y.flip(0),
        "permuted rows": y[permutation],
        "times 3": 3 * y,
        "times 2^-600": torch.ldexp(y, torch.tensor(-600)),
    }[variant]
    result, expected = learn_shear_transform(data, 16, 3, bits=bits, iterations=3), reference[bits]
    _same_blocks(
        (result.transform.pairs, result.transform.blocks),
        (expected.transform.pairs, expected.transform.blocks),
        bits == 2,
    )
    assert result.initial_error == pytest.approx(expected.initial_error, rel=1e-9)
    assert result.errors == pytest.approx(expected.errors, rel=1e-9)


def test_principal_basis_sign_ignores_rounding_noise_on_mirror_symmetric_data() -> None:
    # Mirror-augmented data (rows and their reversals): Y^T Y commutes with the reversal, so every principal
    # vector is symmetric or antisymmetric, and an antisymmetric one has two largest entries of equal magnitude
    # and opposite sign; the basis's sign must not be chosen by the rounding of eigh.
    g = torch.Generator().manual_seed(3)
    y = torch.randn(300, 8, generator=g, dtype=F64).cumsum(1)
    gram = torch.cat([y, y.flip(1)]).T @ torch.cat([y, y.flip(1)])
    expected = principal_basis(gram)
    magnitude = expected.abs()
    assert bool(((magnitude - magnitude.flip(0)).abs() < 1e-9).all())  # every column has equal mirrored entries
    for seed in range(6):
        torch.testing.assert_close(principal_basis(_noisy(gram, seed, True)), expected, rtol=0, atol=1e-8)
