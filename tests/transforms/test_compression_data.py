"""compress_linear(data=...): the least-squares refit on inputs that do not determine it (one row, identical rows,
inputs on a low-dimensional affine subspace) keeps what the data cannot see at the no-data fit."""

import warnings

import numpy
import pytest
import torch
from torch import nn

from lightning_ortho.transforms.compression import compress_linear

F64 = torch.float64


def layer_16_to_24(seed=0):
    """A low-rank-plus-noise weight and a bias (the structure of a trained layer)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(24, 4, generator=g, dtype=F64) @ torch.randn(4, 16, generator=g, dtype=F64)
    weight += 0.1 * torch.randn(24, 16, generator=g, dtype=F64)
    layer = nn.Linear(16, 24).double()
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(torch.randn(24, generator=g, dtype=F64))
    return layer


def relative_error(layer, module, x):
    """``100 ||f(X) - g(X)||^2 / ||f(X)||^2``, from the two modules' outputs."""
    with torch.no_grad():
        target = layer(x)
        return float(100 * (target - module(x)).square().sum() / target.square().sum())


def closest_exact_fit(layer, plain, x):
    """Reference, row by row with an SVD of the design ``A = [T[:, S], 1]`` (``T`` rows ``D^T x``): among the
    least-squares minimisers ``u = (c, b)`` of ``||A u - f(X)[:, k]||``, the one nearest the no-data ``(c0, b0)`` in
    ``(u - u0)^T M (u - u0)``, ``M = diag((D^T D)[S, S], 1)`` (the output change for isotropic unit inputs)."""
    with torch.no_grad():
        transform = plain.transform(torch.eye(16, dtype=F64)).T  # (n, n): t = transform @ x = D^T x
        t, y = x @ transform.T, layer(x)
    gram = transform @ transform.T  # D^T D
    codes = torch.zeros_like(plain.codes, dtype=F64)
    bias = torch.zeros(24, dtype=F64)
    for k in range(24):
        support = plain.mask[k].nonzero()[:, 0]
        design = torch.cat([t[:, support], torch.ones(len(x), 1, dtype=F64)], 1)
        u0 = torch.cat([plain.codes.detach()[k, support], layer.bias.detach()[k : k + 1]])
        metric = torch.block_diag(gram[support][:, support], torch.ones(1, 1, dtype=F64))
        padded = torch.cat([design, torch.zeros(len(u0), len(u0), dtype=F64)])  # all s + 1 right singular vectors
        _, sigma, vh = (torch.from_numpy(a) for a in numpy.linalg.svd(padded.numpy(), full_matrices=False))
        rank = int((sigma > 1e-9 * sigma[0]).sum())
        particular = vh[:rank].T @ ((vh[:rank] @ (design.T @ y[:, k])) / sigma[:rank].square())  # pinv(A) y
        null = vh[rank:].T  # (s + 1, s + 1 - rank)
        if null.shape[1]:
            z = torch.linalg.solve(null.T @ metric @ null, -null.T @ metric @ (particular - u0))
            particular = particular + null @ z
        codes[k, support], bias[k] = particular[:-1], particular[-1]
    return codes, bias


def refit(layer, data, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = compress_linear(layer, s=4, m=16, data=data, **kwargs)
    return module, [str(w.message) for w in caught]


def sixteen_dimensional(count, seed):
    return torch.randn(count, 16, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize(
    "make",
    [
        lambda: sixteen_dimensional(1, 1),  # one row
        lambda: sixteen_dimensional(1, 1).expand(50, 16).clone(),  # fifty identical rows
    ],
    ids=["one-row", "identical-rows"],
)
def test_a_single_distinct_input_keeps_the_no_data_codes_and_fits_only_that_point(make):
    layer, data, held_out = layer_16_to_24(), make(), sixteen_dimensional(400, 7)
    plain = compress_linear(layer, s=4, m=16)
    module, messages = refit(layer, data)
    assert module.report.output_error == pytest.approx(relative_error(layer, module, data), abs=1e-9)
    # Not a constant layer: on other inputs it does about as well as the fit that saw no data.
    assert relative_error(layer, module, held_out) < 1.5 * relative_error(layer, plain, held_out)
    codes, bias = closest_exact_fit(layer, plain, data[:1])
    torch.testing.assert_close(module.codes.detach(), codes, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(module.bias.detach(), bias, rtol=1e-7, atol=1e-9)
    assert any("centred rank 0" in m and "at least 5 distinct rows" in m for m in messages), messages
    assert module.report.data_rank == 0 and torch.equal(module.mask, plain.mask)


def test_inputs_on_a_plane_refit_only_the_directions_they_determine():
    layer, plain = layer_16_to_24(), compress_linear(layer_16_to_24(), s=4, m=16)
    g = torch.Generator().manual_seed(3)
    basis, offset = torch.randn(2, 16, generator=g, dtype=F64), torch.randn(16, generator=g, dtype=F64)

    def plane(count, spread=0.0):  # 2-d affine subspace (centred rank 2 < s = 4), optionally blurred off it
        points = torch.randn(count, 2, generator=g, dtype=F64) @ basis + offset
        return points + spread * torch.randn(count, 16, generator=g, dtype=F64)

    data = plane(60)
    module, messages = refit(layer, data)
    reported = module.report.output_error
    assert reported == pytest.approx(relative_error(layer, module, data), rel=1e-6, abs=1e-9)
    codes, bias = closest_exact_fit(layer, plain, data)
    torch.testing.assert_close(module.codes.detach(), codes, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(module.bias.detach(), bias, rtol=1e-6, atol=1e-8)
    assert relative_error(layer, module, plane(300)) <= relative_error(layer, plain, plane(300)) + 1e-9
    blurred = plane(300, spread=0.05)  # near the plane: the kept no-data codes still serve
    assert relative_error(layer, module, blurred) < 1.5 * relative_error(layer, plain, blurred)
    assert any("centred rank 2" in m for m in messages), messages
    # 60 rows on a plane: more rows like them would not help, and the message says so instead of asking for them
    assert any("vary in only 2 directions" in m and "hundreds" not in m for m in messages), messages
    assert module.report.data_rank == 2


def test_data_of_full_rank_refit_silently_and_report_their_error():
    layer = layer_16_to_24()
    data = sixteen_dimensional(300, 5) * torch.linspace(0.2, 2, 16, dtype=F64) + 0.5
    module, messages = refit(layer, data)
    assert not messages and module.report.data_rank == 16
    plain = compress_linear(layer, s=4, m=16)
    codes, bias = closest_exact_fit(layer, plain, data)  # determined: the plain least-squares optimum
    torch.testing.assert_close(module.codes.detach(), codes, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(module.bias.detach(), bias, rtol=1e-8, atol=1e-10)
    assert module.report.output_error == pytest.approx(relative_error(layer, module, data), rel=1e-9)
