"""Sufficient statistics: sums over batches equal the in-memory quantities, and streamed learning equals
the in-memory learners."""

from __future__ import annotations

import pytest
import torch

from lightning_ortho.transforms import learn_b_transform, learn_m_transform
from lightning_ortho.transforms.b_dla import BTransformLearner
from lightning_ortho.transforms.m_dla import MTransformLearner
from lightning_ortho.transforms.s_dla import ShearTransformLearner, learn_shear_transform
from lightning_ortho.transforms.sparse_codes import keep_largest, representation_error
from lightning_ortho.transforms.statistics import TransformStatistics, fit_in_memory, principal_basis

DT = torch.float64


def _walks(count: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, n, generator=g, dtype=DT).cumsum(1)


def _stream(learner, data: torch.Tensor, batch: int, max_passes: int = 100) -> list:  # noqa: ANN001
    """Drive a learner as the Lightning module does: batches per pass, sums, one update per pass."""
    errors = []
    for _ in range(max_passes):
        if learner.finished:
            return errors
        statistics = TransformStatistics.zeros(data.shape[1])
        for start in range(0, data.shape[0], batch):
            chunk = data[start : start + batch].float()  # a float32 data module
            statistics.add(chunk, learner.encode(chunk), with_gram=learner.needs_gram)
        errors.append(learner.update(statistics))
    raise AssertionError("the learner did not finish")


def test_sums_over_batches_equal_the_whole_data() -> None:
    y = _walks(300, 6, 0)
    x = keep_largest(torch.randn(300, 6, generator=torch.Generator().manual_seed(1), dtype=DT), 2)
    statistics = TransformStatistics.zeros(6)
    for start in range(0, 300, 64):
        statistics.add(y[start : start + 64], x[start : start + 64], with_gram=True)
    torch.testing.assert_close(statistics.gram, y.T @ y, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(statistics.cross, y.T @ x, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(statistics.code_gram, x.T @ x, rtol=1e-12, atol=1e-9)
    assert float(statistics.count) == 300
    assert float(statistics.data_energy) == pytest.approx(float(y.square().sum()), rel=1e-13)
    assert float(statistics.code_energy) == pytest.approx(float(x.square().sum()), rel=1e-13)
    # The error from the sums equals the error from the data for any dictionary, orthonormal or not.
    d = torch.randn(6, 6, generator=torch.Generator().manual_seed(2), dtype=DT)
    assert statistics.error(d) == pytest.approx(float(representation_error(y, x, d)), rel=1e-10)


def test_all_reduce_sums_the_processes() -> None:
    y = _walks(40, 4, 3)
    halves = [TransformStatistics.zeros(4), TransformStatistics.zeros(4)]
    halves[0].add(y[:20], y[:20] * 2, with_gram=True)
    halves[1].add(y[20:], y[20:] * 2, with_gram=True)
    other = halves[1]
    halves[0].all_reduce(lambda flat: flat + torch.cat([getattr(other, f).reshape(-1) for f in FIELDS]))
    whole = TransformStatistics.zeros(4)
    whole.add(y, y * 2, with_gram=True)
    for name in FIELDS:
        torch.testing.assert_close(getattr(halves[0], name), getattr(whole, name), rtol=1e-12, atol=1e-9)


FIELDS = ("gram", "cross", "code_gram", "data_energy", "code_energy", "count")


def test_add_rejects_bad_batches() -> None:
    statistics = TransformStatistics.zeros(4)
    with pytest.raises(ValueError, match=r"data must be \(B, 4\)"):
        statistics.add(torch.zeros(3, 5), None)
    with pytest.raises(ValueError, match="NaN or inf features"):
        statistics.add(torch.tensor([[0.0, float("nan"), 0.0, 0.0]]), None)
    with pytest.raises(ValueError, match="codes must have the data's shape"):
        statistics.add(torch.zeros(3, 4), torch.zeros(2, 4))


def test_principal_basis_is_the_svd_basis_with_a_fixed_sign_and_order() -> None:
    y = _walks(200, 8, 4)
    basis = principal_basis(y.T @ y)
    torch.testing.assert_close(basis.T @ basis, torch.eye(8, dtype=DT), atol=1e-12, rtol=0)
    _, singular, vh = torch.linalg.svd(y, full_matrices=False)
    torch.testing.assert_close((vh @ basis).abs(), torch.eye(8, dtype=DT), atol=1e-9, rtol=0)
    pivots = basis.abs().argmax(dim=0)
    assert bool((basis[pivots, torch.arange(8)] > 0).all())
    torch.testing.assert_close(torch.linalg.norm(y @ basis, dim=0), singular, rtol=1e-10, atol=0)


@pytest.mark.parametrize("batch", [37, 128])
def test_streamed_b_learning_equals_the_in_memory_learner(batch: int) -> None:
    y = _walks(400, 16, 5)
    # tol above rounding (not 0): streamed and in-memory sums differ in their last bits, and the pass count below
    # must not hang on whether two equal errors compare equal on this CPU.
    expected = learn_b_transform(y.float().double(), 12, 3, iterations=6, tol=1e-9)
    learner = BTransformLearner(16, 12, 3, iterations=6, tol=1e-9)
    passes = _stream(learner, y, batch)
    assert learner.transform().pairs.tolist() == expected.transform.pairs.tolist()
    assert learner.transform().core_index.tolist() == expected.transform.core_index.tolist()
    torch.testing.assert_close(torch.tensor(learner.errors), torch.tensor(expected.errors), rtol=1e-9, atol=0)
    assert learner.initial_error == pytest.approx(expected.initial_error, rel=1e-9)
    # basis pass, greedy pass, then one pass per measured error (initial + one per sweep).
    assert len(passes) == 2 + 1 + len(expected.errors)
    assert passes[2] == pytest.approx(expected.initial_error, rel=1e-9)
    # the first pass has no transform yet: its error is that of T_s(Y), the identity
    identity = torch.eye(16, dtype=DT)
    assert passes[0] == pytest.approx(float(representation_error(y, keep_largest(y.float().double(), 3), identity)))


def test_streamed_m_learning_equals_the_in_memory_learner() -> None:
    y = _walks(300, 8, 6)
    expected = learn_m_transform(y.float().double(), 3, 2, rounds=2)
    learner = MTransformLearner(8, 3, 2, rounds=2)
    passes = _stream(learner, y, 50)
    assert learner.transform().pairs.tolist() == expected.transform.pairs.tolist()
    assert learner.transform().core_index.tolist() == expected.transform.core_index.tolist()
    torch.testing.assert_close(torch.tensor(learner.errors), torch.tensor(expected.errors), rtol=1e-9, atol=0)
    assert len(passes) == 2 + 2


@pytest.mark.parametrize("bits", [None, 2])
def test_streamed_shear_learning_equals_the_in_memory_learner(bits: int | None) -> None:
    y = _walks(300, 8, 8)
    expected = learn_shear_transform(y.float().double(), 10, 3, bits=bits, iterations=4)
    learner = ShearTransformLearner(8, 10, 3, bits=bits, iterations=4)
    passes = _stream(learner, y, 70)
    assert learner.transform().pairs.tolist() == expected.transform.pairs.tolist()
    torch.testing.assert_close(learner.transform().blocks, expected.transform.blocks, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(torch.tensor(learner.errors), torch.tensor(expected.errors), rtol=1e-7, atol=0)
    assert len(passes) == 3 + 4
    assert learner.initial_error == pytest.approx(expected.initial_error, rel=1e-7)


def test_learner_state_dict_resumes_mid_learning() -> None:
    y = _walks(200, 8, 7)
    reference = BTransformLearner(8, 6, 2, iterations=5, tol=0.0)
    fit_in_memory(reference, y)
    first = BTransformLearner(8, 6, 2, iterations=5, tol=0.0)
    for _ in range(4):  # stop after the first sweep, as a checkpoint would
        statistics = TransformStatistics.zeros(8)
        statistics.add(y, first.encode(y), with_gram=first.needs_gram)
        first.update(statistics)
    resumed = BTransformLearner(8, 6, 2, iterations=5, tol=0.0)
    resumed.load_state_dict(first.state_dict())
    fit_in_memory(resumed, y)
    assert resumed.pairs == reference.pairs and resumed.index == reference.index
    assert resumed.errors == reference.errors
    with pytest.raises(RuntimeError, match="has finished"):
        resumed.update(TransformStatistics.zeros(8))


@pytest.mark.parametrize(
    ("learn", "kwargs"),
    [
        (learn_b_transform, {"m": 6, "s": 2}),
        (learn_m_transform, {"q": 2, "s": 2}),
        (learn_shear_transform, {"m": 6, "s": 2}),
        (learn_shear_transform, {"m": 6, "s": 2, "bits": 1}),
    ],
)
def test_learners_give_the_same_transform_for_data_of_any_magnitude(learn, kwargs) -> None:  # noqa: ANN001
    # Found by probing: shears of data scaled by 1e100 overflowed their squared scores (and 1e-100 underflowed
    # them, and OMP returned all-zero codes), silently learning a different transform.
    y = _walks(200, 8, 9)
    reference = learn(y, **kwargs)
    for scale in (1e-300, 1e-100, 1e100, 1e300):
        result = learn(y * scale, **kwargs)
        assert result.transform.pairs.tolist() == reference.transform.pairs.tolist(), scale
        torch.testing.assert_close(result.transform.blocks, reference.transform.blocks, rtol=1e-12, atol=0)
        torch.testing.assert_close(result.codes / scale, reference.codes, rtol=1e-9, atol=1e-12)
        assert result.errors[-1] == pytest.approx(reference.errors[-1], rel=1e-9)


def test_streamed_features_outside_the_float64_range_of_their_squares_fail_clearly() -> None:
    statistics = TransformStatistics.zeros(4)
    for scale in (1e130, 1e-130):
        with pytest.raises(ValueError, match="overflow or underflow the float64 sums of squares"):
            statistics.add(torch.full((2, 4), scale, dtype=DT), None)
    statistics.add(torch.full((2, 4), 1e100, dtype=DT), None)  # 1e100 is fine: its squares stay normal
