"""Algorithm 1 (greedy SOPOT) of Rusu: against a scalar float64 reference written from the paper."""

import math
import random
import warnings
from fractions import Fraction

import pytest
import torch

from lightning_ortho.transforms import SOPOTResult, sopot, sopot_with_cost
from lightning_ortho.transforms.sopot import sopot_terms_needed


def reference_sopot(x: float, p: int, tol: float = 1e-6) -> tuple[float, int]:
    """The paper's Algorithm 1 on one Python float: (x_hat, terms used)."""
    estimate, residual, used = 0.0, x, 0
    for _ in range(p):
        if abs(residual) <= tol:
            break
        a = math.ceil(math.log2(abs(residual)))
        low, high = 2.0 ** (a - 1), 2.0**a
        power = high if high - abs(residual) < abs(residual) - low else low
        estimate += math.copysign(power, residual)
        residual = x - estimate
        used += 1
    return estimate, used


def test_spec_example_inverse_sqrt2():
    x = torch.tensor(1 / math.sqrt(2), dtype=torch.float64)
    assert [float(sopot(x, p)) for p in (1, 2, 3)] == [0.5, 0.75, 0.71875]


def test_terms_none_and_inf_return_input_unchanged():
    x = torch.randn(5)
    assert sopot(x, None) is x
    assert sopot(x, math.inf) is x


def test_ties_go_to_the_smaller_power():
    x = torch.tensor([0.375, 3.0, -3.0, 1.5, -0.75], dtype=torch.float64)
    assert sopot(x, 1).tolist() == [0.25, 2.0, -2.0, 1.0, -0.5]


def test_matches_scalar_reference_on_random_values():
    rng = random.Random(0)
    values = [rng.uniform(-10, 10) * 10 ** rng.randint(-3, 3) for _ in range(300)] + [0.0, 1.0, -2.0, 1e-7]
    x = torch.tensor(values, dtype=torch.float64)
    for p in (1, 2, 3, 5):
        result = sopot_with_cost(x, p)
        expected = [reference_sopot(v, p) for v in values]
        assert result.values.tolist() == [e for e, _ in expected]
        assert result.shifts.tolist() == [k for _, k in expected]


def test_error_shrinks_by_at_least_three_per_term_and_decreases_with_terms():
    x = torch.randn(2000, dtype=torch.float64) * 5
    previous = x.abs()
    for p in range(1, 8):
        error = sopot_with_cost(x, p).error.abs()
        # nearest power of two: |r_t| <= |r_{t-1}| / 3 (until the early stop at 1e-6)
        assert bool((error <= torch.maximum(previous / 3, torch.full_like(previous, 1e-6)) * (1 + 1e-12)).all())
        assert bool((error <= previous).all())
        assert float(error.mean()) < float(previous.mean())
        previous = error


def test_exact_sums_of_powers_of_two_have_zero_error():
    rng = random.Random(1)
    for _ in range(200):
        k = rng.randint(1, 4)
        exponents = rng.sample(range(-12, 12), k)
        value = sum(rng.choice((-1, 1)) * 2.0**e for e in exponents)
        result = sopot_with_cost(torch.tensor([value], dtype=torch.float64), k, tol=0.0)
        assert float(result.error[0]) == 0.0, (value, exponents)
        assert int(result.shifts[0]) <= k


def test_expansion_reconstructs_values_and_costs_count_terms():
    x = torch.randn(4, 7, dtype=torch.float64)
    result = sopot_with_cost(x, 4)
    assert isinstance(result, SOPOTResult)
    assert result.signs.shape == result.exponents.shape == (4, 7, 4)
    rebuilt = (result.signs.double() * torch.pow(2.0, result.exponents.double())).sum(-1)
    assert torch.equal(rebuilt, result.values)
    assert torch.equal(result.error, x - result.values)
    used = (result.signs != 0).sum(-1)
    assert torch.equal(result.shifts, used)
    assert torch.equal(result.additions, (used - 1).clamp_min(0))
    zero = sopot_with_cost(torch.zeros(3), 3)
    assert zero.shifts.tolist() == [0, 0, 0] and zero.additions.tolist() == [0, 0, 0]


def test_float32_values_are_exact_powers_and_keep_dtype():
    x = torch.randn(100)
    y = sopot(x, 2)
    assert y.dtype == torch.float32
    assert torch.equal(y.double(), sopot(x.double(), 2))


def test_terms_needed():
    assert sopot_terms_needed(0.75, 3) == 2
    assert sopot_terms_needed(0.5, 1) == 1
    assert sopot_terms_needed(1 / 3, 4) is None


@pytest.mark.parametrize("terms", [0, -1, 1.5, True])
def test_bad_terms_raise(terms):
    with pytest.raises(ValueError, match="terms"):
        sopot(torch.ones(2), terms)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="NaN"):
        sopot(torch.tensor([1.0, float("nan")]), 2)
    with pytest.raises(ValueError, match="NaN"):
        sopot(torch.tensor([float("inf")]), None)
    with pytest.raises(TypeError, match="floating"):
        sopot(torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="sopot\\(x, None\\)"):
        sopot_with_cost(torch.ones(2), None)


# ------------------------------------------------------------------------------------------- top of the range
#: The largest exponent ``emax`` of each dtype (its largest power of two is ``2^emax``), typed in, not computed.
EMAX = {torch.float16: 15, torch.bfloat16: 127, torch.float32: 127, torch.float64: 1023}


def exact_reference_sopot(x: Fraction, p: int, emax: int, tol: Fraction = Fraction(1e-6)) -> Fraction:
    """Algorithm 1 in exact rational arithmetic (no overflow, no rounding), then the documented clamp: a one-term
    value ``2^(emax+1)``, not representable, becomes ``2^emax``."""
    estimate, residual, used = Fraction(0), x, 0
    for _ in range(p):
        if abs(residual) <= tol:
            break
        magnitude = abs(residual)
        a = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()  # then adjust to ceil(log2 m)
        while Fraction(2) ** a < magnitude:
            a += 1
        while Fraction(2) ** (a - 1) >= magnitude:
            a -= 1
        low, high = Fraction(2) ** (a - 1), Fraction(2) ** a
        power = high if high - magnitude < magnitude - low else low
        estimate += power if residual > 0 else -power
        residual = x - estimate
        used += 1
    if used == 1 and abs(estimate) == Fraction(2) ** (emax + 1):
        estimate = Fraction(2) ** emax * (1 if estimate > 0 else -1)
    return estimate


@pytest.mark.parametrize(
    ("dtype", "value", "terms", "expected"),
    [
        (torch.float16, 65504.0, 2, 65504.0),  # 2^16 - 2^5: finite although 2^16 overflows float16
        (torch.float32, torch.finfo(torch.float32).max, 2, torch.finfo(torch.float32).max),  # 2^128 - 2^104
        (torch.float64, torch.finfo(torch.float64).max, 3, torch.finfo(torch.float64).max),  # 2^1024 - 2^971
        (torch.float16, 60000.0, 2, 61440.0),  # 2^16 - 2^12, 2.4 % off
    ],
)
def test_values_at_the_top_of_the_range_stay_finite(dtype, value, terms, expected):
    x = torch.tensor([value, -value], dtype=dtype)
    result = sopot_with_cost(x, terms)
    assert result.values.tolist() == [expected, -expected]
    assert result.exponents[0, 0] == EMAX[dtype] + 1  # the nearest power, one beyond the dtype's largest
    rebuilt = sum(int(s) * Fraction(2) ** int(e) for s, e in zip(result.signs[0], result.exponents[0], strict=True))
    assert rebuilt == Fraction(expected)


def test_one_term_beyond_the_largest_power_is_clamped_with_a_warning():
    # 60000 in float16: the nearest power 2^16 overflows; the best finite one is 2^15 (45 % off), said aloud.
    with pytest.warns(RuntimeWarning, match=r"clamped to 2\^15"):
        result = sopot_with_cost(torch.tensor([60000.0, -60000.0, 40000.0, 3.0], dtype=torch.float16), 1)
    assert result.values.tolist() == [32768.0, -32768.0, 32768.0, 2.0]
    assert result.exponents[:, 0].tolist() == [15, 15, 15, 1]
    assert result.signs[:, 0].tolist() == [1, -1, 1, 1]
    with pytest.warns(RuntimeWarning, match="clamped"):
        assert float(sopot(torch.tensor(torch.finfo(torch.float64).max, dtype=torch.float64), 1)) == 2.0**1023


@pytest.mark.parametrize("dtype", list(EMAX))
def test_top_of_range_matches_an_exact_reference(dtype):
    # The 24 largest finite values and 24 random ones in the top two binades, both signs, p = 1..4: finite,
    # equal to exact rational Algorithm 1 (clamped as documented), within |x| / 3^p (1/2 when clamped).
    emax, largest = EMAX[dtype], torch.finfo(dtype).max
    values = [torch.tensor(largest, dtype=dtype)]
    for _ in range(23):
        values.append(torch.nextafter(values[-1], torch.tensor(0.0, dtype=dtype)))
    mantissas = torch.rand(24, generator=torch.Generator().manual_seed(emax), dtype=torch.float64) * 0.75 + 0.25
    random = torch.ldexp(mantissas, torch.tensor(emax + 1)).clamp(max=largest).to(dtype)
    x = torch.cat([torch.stack(values), random])
    x = torch.cat([x, -x])
    for p in (1, 2, 3, 4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the clamped one-term values, tested above
            values_out = sopot(x, p)
        assert values_out.dtype == dtype and bool(torch.isfinite(values_out).all())
        for value, out in zip(x.tolist(), values_out.tolist(), strict=True):
            expected = exact_reference_sopot(Fraction(value), p, emax)
            assert Fraction(out) == expected, (dtype, p, value, out, float(expected))
            clamped = p == 1 and abs(value) > 1.5 * 2.0**emax
            bound = Fraction(1, 2) if clamped else Fraction(1, 3**p)
            assert abs(Fraction(value) - expected) <= bound * abs(Fraction(value))
