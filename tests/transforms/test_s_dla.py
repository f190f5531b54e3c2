"""Tests of S-DLA (Rusu's shears and scalings) in batch-first orientation: closed forms against line searches and brute force
over dense matrices, rounding, costs, OMP against scikit-learn, and the learner."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import minimize_scalar
from sklearn.linear_model import orthogonal_mp

from lightning_ortho.transforms.blocks import BlockProduct
from lightning_ortho.transforms.s_dla import (
    ShearTransformResult,
    learn_shear_transform,
    omp_codes,
    shear_error,
    shear_greedy_init,
    shear_sweep,
)
from lightning_ortho.transforms.shear_updates import entry_optima, scaling_decrease
from lightning_ortho.transforms.sopot import sopot
from lightning_ortho.transforms.sparse_codes import keep_largest, representation_error

F64 = torch.float64


def _data(n: int, count: int, seed: int, s: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes ``X`` with ``s`` nonzeros per row and data ``Y = X (I + G)^T + 0.3 noise`` (so that shears pay off;
    with ``Y`` independent of ``X`` every pick is a shrinking scaling)."""
    g = torch.Generator().manual_seed(seed)
    x = keep_largest(torch.randn(count, n, generator=g, dtype=F64), s)
    mix = torch.eye(n, dtype=F64) + torch.randn(n, n, generator=g, dtype=F64)
    return x @ mix.T + 0.3 * torch.randn(count, n, generator=g, dtype=F64), x


def _dense(n: int, blocks: list[tuple[tuple[int, int], list[list[float]]]]) -> torch.Tensor:
    if not blocks:
        return torch.eye(n, dtype=F64)
    cores = torch.tensor([core for _, core in blocks], dtype=F64)
    return BlockProduct(n, [pair for pair, _ in blocks], cores, trainable=False).matrix()


def _objective(y: torch.Tensor, x: torch.Tensor, d: torch.Tensor) -> float:
    return float((y - x @ d.T).square().sum())


def _candidates(n: int) -> list[tuple[str, int, int]]:
    """Every lower/upper shear on i < j and every scaling, independent of the module's entry bookkeeping."""
    shears = [(kind, i, j) for i in range(n) for j in range(i + 1, n) for kind in ("lower", "upper")]
    return shears + [("scale", i, (i + 1) % n) for i in range(n)]


def _block(kind: str, i: int, j: int, v: float) -> tuple[tuple[int, int], list[list[float]]]:
    """The block with free parameter ``v`` (shear value, or ``g - 1`` for a scaling)."""
    core = {"lower": [[1.0, 0.0], [v, 1.0]], "upper": [[1.0, v], [0.0, 1.0]], "scale": [[1.0 + v, 0.0], [0.0, 1.0]]}
    return (i, j), core[kind]


def _parabola(f) -> tuple[float, float]:
    """Exact minimiser and decrease ``min f - f(0)`` of a quadratic from three evaluations."""
    f0, fp, fm = f(0.0), f(1.0), f(-1.0)
    alpha, beta = (fp + fm - 2 * f0) / 2, (fp - fm) / 2
    return -beta / (2 * alpha), -(beta**2) / (4 * alpha)


def _round(kind: str, v: float, bits: int | None) -> float:
    """Stored parameter (shear value or g - 1) as the paper rounds it."""
    if bits is None:
        return v
    if kind != "scale":
        return float(sopot(torch.tensor(v, dtype=F64), bits))
    g = 1.0 + v
    e = math.log2(abs(g))
    return math.copysign(2.0 ** math.copysign(math.floor(abs(e) + 0.5), e), g) - 1.0


def _brute_pick(objective, n: int, bits: int | None, rounded_scaling: bool):
    """Brute force over every candidate: returns (pair, core) of the argmin and the margin to the runner-up."""
    base = objective(None)
    scored = []
    for kind, i, j in _candidates(n):
        v, decrease = _parabola(lambda t, kind=kind, i=i, j=j: objective(_block(kind, i, j, t)))
        if kind == "scale" and rounded_scaling:
            decrease = objective(_block(kind, i, j, _round(kind, v, bits))) - base
        scored.append((decrease, _block(kind, i, j, _round(kind, v, bits))))
    scored.sort(key=lambda item: item[0])
    return scored[0][1], scored[1][0] - scored[0][0]


def _assert_blocks(pairs: torch.Tensor, cores: torch.Tensor, expected: list) -> None:
    assert pairs.tolist() == [list(pair) for pair, _ in expected]
    torch.testing.assert_close(cores, torch.tensor([core for _, core in expected], dtype=F64), rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------------------------- closed forms
def test_closed_forms_equal_line_search_on_dense_objective() -> None:
    # Eqs. (18)-(20): b_opt, c_opt, g_opt and their minima against Brent's method on ||Y - X S^T||^2.
    n = 4
    y, x = _data(n, 40, 0)
    z, w = y.T @ x, x.T @ x
    values, decrease = entry_optima(z - w, torch.ones(n, dtype=F64), w.diagonal())
    base = _objective(y, x, torch.eye(n, dtype=F64))
    for kind, i, j in _candidates(n):
        result = minimize_scalar(lambda t: _objective(y, x, _dense(n, [_block(kind, i, j, t)])), tol=1e-12)
        if kind == "lower":  # b_opt = (Z_ji - W_ij) / W_ii, min -(Z_ji - W_ij)^2 / W_ii
            closed, minimum = values[j, i], decrease[j, i]
            assert float(closed) == pytest.approx(float((z[j, i] - w[i, j]) / w[i, i]), rel=1e-14)
            assert float(minimum) == pytest.approx(float(-((z[j, i] - w[i, j]) ** 2) / w[i, i]), rel=1e-14)
        elif kind == "upper":  # c_opt = (Z_ij - W_ji) / W_jj
            closed, minimum = values[i, j], decrease[i, j]
            assert float(closed) == pytest.approx(float((z[i, j] - w[j, i]) / w[j, j]), rel=1e-14)
        else:  # g_opt = Z_ii / W_ii
            closed, minimum = values[i, i], decrease[i, i]
            assert float(1 + closed) == pytest.approx(float(z[i, i] / w[i, i]), rel=1e-13)
        assert float(closed) == pytest.approx(result.x, rel=1e-6, abs=1e-8)
        assert float(minimum) == pytest.approx(result.fun - base, rel=1e-9, abs=1e-9)


def test_scaling_decrease_formula_at_any_g() -> None:
    n = 3
    y, x = _data(n, 30, 1)
    z, w = y.T @ x, x.T @ x
    base = _objective(y, x, torch.eye(n, dtype=F64))
    for g in (-2.0, 0.25, 0.5, 1.7):
        formula = scaling_decrease(
            (z - w).diagonal(), torch.ones(n, dtype=F64), w.diagonal(), torch.full((n,), g, dtype=F64)
        )
        for i in range(n):
            dense = _objective(y, x, _dense(n, [_block("scale", i, (i + 1) % n, g - 1)])) - base
            assert float(formula[i]) == pytest.approx(dense, rel=1e-12, abs=1e-10)


# ---------------------------------------------------------------------------------------------------- init
@pytest.mark.parametrize("bits", [None, 1, 2])
def test_greedy_picks_equal_brute_force(bits: int | None) -> None:
    # Each pick is the brute-force argmin over all (i, j, kind) given X_k = X S_1^T .. S_{k-1}^T; shears scored
    # unrounded, scalings at the rounded g; the stored value rounded.
    # Seed 12 picks lower, upper, scaling, upper; scoring the scaling at its unrounded g would change the picks.
    n, m = 4, 4
    y, x = _data(n, 50, 12)
    pairs, cores = shear_greedy_init(y.T @ x, x.T @ x, m, bits)
    expected = []
    for _ in range(m):
        current = x @ _dense(n, expected).T

        def objective(block, current=current):
            return _objective(y, current, _dense(n, [block] if block else []))

        block, margin = _brute_pick(objective, n, bits, rounded_scaling=True)
        assert margin > 1e-6  # the argmin is well separated, so the comparison is meaningful
        expected.append(block)
    _assert_blocks(pairs, cores, expected)


def test_greedy_init_from_summed_batch_statistics_equals_full_batch() -> None:
    y, x = _data(6, 80, 3)
    full = shear_greedy_init(y.T @ x, x.T @ x, 5, 2)
    z = y[:30].T @ x[:30] + y[30:].T @ x[30:]
    w = x[:30].T @ x[:30] + x[30:].T @ x[30:]
    streamed = shear_greedy_init(z, w, 5, 2)
    assert torch.equal(full[0], streamed[0])
    torch.testing.assert_close(full[1], streamed[1], rtol=1e-12, atol=0)


# --------------------------------------------------------------------------------------------------- sweep
@pytest.mark.parametrize("bits", [None, 1, 2])
def test_sweep_repicks_each_block_as_brute_force(bits: int | None) -> None:
    # Eqs. (21)-(23): block k removed and re-chosen among all shears/scalings (any position) with the blocks
    # before k already re-chosen and those after k old; all scores unrounded, stored values rounded. Seed 91
    # re-picks lower, scaling, upper; scoring the scaling at its rounded g would change the picks.
    n = 4
    y, x = _data(n, 50, 91)
    old = [((0, 1), [[1.0, 0.0], [0.5, 1.0]]), ((2, 3), [[1.0, -0.25], [0.0, 1.0]]), ((1, 2), [[2.0, 0.0], [0.0, 1.0]])]
    pairs = torch.tensor([pair for pair, _ in old])
    cores = torch.tensor([core for _, core in old], dtype=F64)
    new_pairs, new_cores = shear_sweep(y.T @ x, x.T @ x, float(y.square().sum()), pairs, cores, bits)
    blocks = list(old)
    for k in range(len(blocks)):

        def objective(block, k=k):
            return _objective(y, x, _dense(n, blocks[:k] + ([block] if block else []) + blocks[k + 1 :]))

        block, margin = _brute_pick(objective, n, bits, rounded_scaling=False)
        assert margin > 1e-6
        blocks[k] = block
    _assert_blocks(new_pairs, new_cores, blocks)


def test_sweeps_with_fixed_codes_never_increase_the_error() -> None:
    y, _ = _data(8, 200, 5)
    y = y @ torch.randn(8, 8, generator=torch.Generator().manual_seed(5), dtype=F64)
    pairs, cores = shear_greedy_init(y.T @ keep_largest(y, 3), keep_largest(y, 3).T @ keep_largest(y, 3), 10, None)
    x = omp_codes(y, _dense_from(pairs, cores, 8), 3)
    z, w, energy = y.T @ x, x.T @ x, float(y.square().sum())
    errors = [shear_error(z, w, energy, _dense_from(pairs, cores, 8))]
    for _ in range(4):
        pairs, cores = shear_sweep(z, w, energy, pairs, cores, None)
        d = _dense_from(pairs, cores, 8)
        errors.append(shear_error(z, w, energy, d))
        assert errors[-1] == pytest.approx(float(representation_error(y, x, d)), rel=1e-10)
    assert all(b <= a + 1e-10 for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < errors[0] - 1e-3, errors


def _dense_from(pairs: torch.Tensor, cores: torch.Tensor, n: int) -> torch.Tensor:
    return BlockProduct(n, pairs, cores, trainable=False).matrix()


# --------------------------------------------------------------------------------------------- error, OMP
def test_shear_error_equals_dense_representation_error() -> None:
    y, x = _data(5, 60, 6)
    d = torch.randn(5, 5, generator=torch.Generator().manual_seed(6), dtype=F64)
    expected = float(representation_error(y, x, d))
    assert shear_error(y.T @ x, x.T @ x, y.square().sum(), d) == pytest.approx(expected, rel=1e-12)


def test_omp_codes_match_sklearn_on_normalised_dictionary() -> None:
    g = torch.Generator().manual_seed(7)
    n, s = 8, 3
    d = torch.randn(n, n, generator=g, dtype=F64) * torch.linspace(0.2, 5.0, n, dtype=F64)
    y = torch.randn(40, n, generator=g, dtype=F64)
    y[5] = 0.0
    codes = omp_codes(y, d, s)
    norms = d.norm(dim=0)
    rows = torch.arange(40) != 5  # scikit-learn warns on a zero sample; omp_codes gives it zero codes
    reference = orthogonal_mp((d / norms).numpy(), y[rows].T.numpy(), n_nonzero_coefs=s).T / norms.numpy()
    torch.testing.assert_close(codes[rows], torch.from_numpy(reference), rtol=1e-10, atol=1e-12)
    counts = (codes != 0).sum(1)
    assert counts[5] == 0
    assert bool((counts[rows] == s).all())


# ----------------------------------------------------------------------------------------- rounding, costs
@pytest.mark.parametrize("bits", [1, 2])
def test_stored_values_are_sopot_and_scalings_powers_of_two(bits: int) -> None:
    y, _ = _data(8, 300, 8)
    y = y @ torch.randn(8, 8, generator=torch.Generator().manual_seed(8), dtype=F64)
    result = learn_shear_transform(y, 16, 3, bits=bits, iterations=2)
    result.transform.op_count(terms=bits)  # raises unless every entry is a sum of <= bits signed powers of two
    cores = result.transform.blocks
    scaling = (cores[:, 0, 1] == 0) & (cores[:, 1, 0] == 0) & (cores[:, 0, 0] != 1)
    shear_values = torch.where(cores[:, 0, 1] != 0, cores[:, 0, 1], cores[:, 1, 0])[~scaling]
    assert bool((shear_values != 0).any())
    assert torch.equal(sopot(shear_values, bits), shear_values)
    mantissa, _ = torch.frexp(cores[scaling, 0, 0].abs())
    assert bool((mantissa == 0.5).all())


def test_one_bit_cost_of_32_blocks_at_n64() -> None:
    # Rusu's experiments: S (m = 32, p = 1) needs at most 32 additions + 32 shifts and no multiplication at n = 64.
    y, _ = _data(64, 300, 9)
    result = learn_shear_transform(y, 32, 4, bits=1, iterations=1)
    cost = result.transform.op_count(terms=1)
    assert cost.multiplications == 0
    assert cost.additions <= 32 and cost.shifts <= 32
    assert cost.shifts > 0


@pytest.mark.parametrize("bits", [None, 1])
def test_inverse_round_trips(bits: int | None) -> None:
    y, _ = _data(6, 120, 10)
    transform = learn_shear_transform(y, 12, 2, bits=bits, iterations=2).transform
    inverse = transform.inverse()
    torch.testing.assert_close(inverse(transform(y)), y, rtol=0, atol=1e-10)
    product = inverse.matrix() @ transform.matrix()
    if bits is None:
        torch.testing.assert_close(product, torch.eye(6, dtype=F64), rtol=0, atol=1e-10)
    else:  # SOPOT shears and power-of-two scalings invert exactly
        assert torch.equal(product, torch.eye(6, dtype=F64))


# -------------------------------------------------------------------------------------------------- learner
@pytest.mark.parametrize("bits", [None, 2])
def test_learning_lowers_the_error_below_the_initial_error(bits: int | None) -> None:
    # Data on which learning pays off by far more than any rounding could change, and no pick is close to a tie
    # (every runner-up is worse than the best by > 3e-5 of the objective; ties are at 1e-9). Seen (seed 2):
    # bits=None 22.85 -> 7.60, bits=2 20.85 -> 10.68 after 15 sweeps. (Seed 0, asserted here before, has exact
    # ties; their former tie-breaking by rounding noise gave 16.89 -> 14.49 on one CPU, 16.36 -> 16.06 on another.)
    g = torch.Generator().manual_seed(2)
    y = torch.randn(500, 8, generator=g, dtype=F64) @ torch.randn(8, 8, generator=g, dtype=F64)
    result = learn_shear_transform(y, 16, 3, bits=bits)
    assert isinstance(result, ShearTransformResult)
    assert len(result.errors) == 15
    assert result.errors[-1] < 0.75 * result.initial_error, (result.initial_error, result.errors)
    d = result.transform.matrix()
    assert result.errors[-1] == pytest.approx(float(representation_error(y, result.codes, d)), rel=1e-10)
    assert bool(((result.codes != 0).sum(1) <= 3).all())
    assert result.transform.blocks.dtype == F64 and not result.transform.trainable


def test_tol_stops_early_and_float32_keeps_dtype() -> None:
    g = torch.Generator().manual_seed(12)
    y = torch.randn(200, 6, generator=g) @ torch.randn(6, 6, generator=g)
    result = learn_shear_transform(y, 6, 2, bits=1, iterations=15, tol=1e3)
    assert len(result.errors) == 2
    assert result.codes.dtype == torch.float32 and result.transform.blocks.dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"Y": torch.tensor([[1.0, float("nan")], [0.0, 1.0]])}, "NaN"),
        ({"s": 5}, "s must be an int in"),
        ({"m": 0}, "m .number of blocks. must be an int >= 1"),
        ({"bits": 0}, "bits must be None"),
        ({"bits": True}, "bits must be None"),
        ({"Y": [[1.0, 2.0], [3.0, 4.0]]}, "floating-point tensor"),
        ({"iterations": 0}, "iterations"),
        ({"tol": -1.0}, "tol must be None"),
    ],
)
def test_learner_rejects_bad_input(kwargs: dict, match: str) -> None:
    args = {"Y": torch.randn(20, 4, dtype=F64), "m": 3, "s": 2} | kwargs
    with pytest.raises(ValueError, match=match):
        learn_shear_transform(args.pop("Y"), args.pop("m"), args.pop("s"), **args)


def test_statistics_functions_reject_bad_input() -> None:
    y, x = _data(4, 20, 13)
    z, w = y.T @ x, x.T @ x
    pairs, cores = torch.tensor([[0, 1]]), torch.tensor([[[1.0, 1.0], [1.0, 1.0]]], dtype=F64)
    with pytest.raises(ValueError, match="not a shear"):
        shear_sweep(z, w, 1.0, pairs, cores, None)
    with pytest.raises(ValueError, match="one shape"):
        shear_greedy_init(z, w[:3, :3], 2, None)
    with pytest.raises(ValueError, match="NaN or inf"):
        shear_greedy_init(z * float("nan"), w, 2, None)
    with pytest.raises(ValueError, match="data_energy"):
        shear_error(z, w, 0.0, torch.eye(4, dtype=F64))
    with pytest.raises(ValueError, match="column 2 is zero"):
        omp_codes(y, torch.eye(4, dtype=F64) * torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=F64), 2)
    with pytest.raises(ValueError, match="s must be an int in"):
        omp_codes(y, torch.eye(4, dtype=F64), 5)
