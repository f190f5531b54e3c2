"""The C kernels of ``lightning_ortho._native``: built on first use into the cache, the same results as the PyTorch
ops, and a clean fallback (one warning) where they cannot be built."""

import shutil
import warnings

import pytest
import torch

import lightning_ortho._native as native
from lightning_ortho._native.reflection_rows import reflect_rows, reflect_rows_backward, row_kernels
from lightning_ortho.nn import AuxiliaryReflection


@pytest.fixture
def fresh_load(monkeypatch, tmp_path):
    """``load`` forgets what it built, with a cache folder of the test's own; restored afterwards."""
    monkeypatch.setenv("LIGHTNING_ORTHO_CACHE_DIR", str(tmp_path / "cache"))
    native.load.cache_clear()
    yield tmp_path / "cache"
    native.load.cache_clear()


needs_compiler = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine")


@needs_compiler
def test_a_machine_with_a_compiler_builds_the_kernels_once_into_the_cache(fresh_load):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where the build works
        library = native.load("reflection_rows")
    assert library is not None
    built = list(fresh_load.glob("reflection_rows-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    native.load.cache_clear()
    assert native.load("reflection_rows") is not None
    assert built[0].stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt
    assert [p.name for p in fresh_load.iterdir()] == [built[0].name]  # no partial files left behind


def test_without_a_compiler_one_warning_and_the_pytorch_path_gives_the_same_layer(fresh_load, monkeypatch):
    torch.manual_seed(0)
    layer = AuxiliaryReflection(8).double()
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        expected = layer(x)
    monkeypatch.setattr(native, "compiler", lambda: None)
    native.load.cache_clear()
    with pytest.warns(native.NativeKernelsUnavailableWarning, match="no C compiler") as record:
        y = layer(x)
        y.sum().backward()
        layer(x)
    assert len(record) == 1
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_a_failing_build_warns_with_the_compiler_message(fresh_load, monkeypatch):
    monkeypatch.setattr(native, "compiler", lambda: ["false"])
    with pytest.warns(native.NativeKernelsUnavailableWarning, match="exited with 1"):
        assert native.load("reflection_rows") is None
    assert list(fresh_load.glob(".*")) == []  # the partial output was removed


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_the_environment_switch_turns_the_kernels_off_silently(fresh_load, monkeypatch, value):
    monkeypatch.setenv("LIGHTNING_ORTHO_NATIVE", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load("reflection_rows") is None
        assert row_kernels(torch.zeros(2, 2)) is None


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc on PATH")
def test_the_compiler_comes_from_cc_first_and_a_missing_one_is_passed_over(monkeypatch):
    monkeypatch.setenv("CC", "gcc -O0")
    assert native.compiler() == ["gcc", "-O0"]
    monkeypatch.setenv("CC", "/no/such/compiler")
    assert native.compiler() is not None and native.compiler()[0] != "/no/such/compiler"


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_row_kernels_equal_the_pytorch_ops(dtype):
    """Forward: ``c = v.x / v.v``, ``y = x - 2 c v``, the span of ``v.v``; backward: ``u = c g + t y`` and
    ``r = g - 2 t v`` with ``t = g.v / v.v``: against float64 PyTorch ops."""
    torch.manual_seed(1)
    kernels = row_kernels(torch.zeros(1, 1, dtype=dtype))
    x, weight, g = torch.randn(13, 7, dtype=dtype), torch.randn(7, 7, dtype=dtype), torch.randn(13, 7, dtype=dtype)
    v = x @ weight.T
    y, c, vv, lowest, highest = reflect_rows(kernels, x, v)
    x64, v64 = x.double(), v.double()
    vv_ref = (v64 * v64).sum(1)
    c_ref = (v64 * x64).sum(1) / vv_ref
    y_ref = x64 - 2 * c_ref[:, None] * v64
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype is torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(y.double(), y_ref, **tolerance)
    torch.testing.assert_close(c.double(), c_ref, **tolerance)
    torch.testing.assert_close(vv.double(), vv_ref, **tolerance)
    assert lowest == pytest.approx(vv.min().item()) and highest == pytest.approx(vv.max().item())
    for grad in (g, g.t().contiguous().t(), torch.ones(1, 1, dtype=dtype).expand(13, 7)):
        u, r = reflect_rows_backward(kernels, grad, v, y, c, vv)
        t = (grad.double() * v64).sum(1, keepdim=True) / vv_ref[:, None]
        torch.testing.assert_close(u.double(), c_ref[:, None] * grad.double() + t * y_ref, **tolerance)
        torch.testing.assert_close(r.double(), grad.double() - 2 * t * v64, **tolerance)


@needs_compiler
@pytest.mark.parametrize("bad", ["zero_row", "nan", "inf"])
def test_the_span_is_nan_where_a_row_is_undefined(bad):
    kernels = row_kernels(torch.zeros(1, 1))
    x = torch.randn(4, 3)
    x[2] = {"zero_row": 0.0, "nan": float("nan"), "inf": float("inf")}[bad]
    _, _, _, lowest, highest = reflect_rows(kernels, x, x @ torch.eye(3))
    assert lowest != lowest and highest != highest  # NaN


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hidden, inputs", [(3, 2), (17, 5), (64, 32), (129, 7)])
def test_uoro_norms_taken_afresh_equal_the_commits_bit_for_bit(dtype, hidden, inputs):
    """The norms of a loaded ``w_tilde`` (a new tensor: the commit's cached norms do not apply) are summed as the
    commit sums them, so a resumed run steps on exactly; both equal float64 norms to rounding."""
    from lightning_ortho._native.uoro import commit, row_norms, uoro_tanh_kernels

    torch.manual_seed(2)
    kernels = uoro_tanh_kernels(torch.zeros(1, dtype=dtype))
    batch, size = 5, hidden * (hidden + inputs + 1)
    w_tilde = torch.randn(batch, size, dtype=dtype)
    inverse_gamma, g = torch.rand(batch, 1, dtype=dtype) + 0.5, torch.randn(batch, hidden, dtype=dtype)
    h, x = torch.randn(batch, hidden, dtype=dtype), torch.randn(batch, inputs, dtype=dtype)
    expected = w_tilde.double() * inverse_gamma.double()
    blocks = expected.split_with_sizes((hidden * hidden, hidden * inputs, hidden), 1)
    blocks[0].add_((g.double()[:, :, None] * h.double()[:, None, :]).flatten(1))
    blocks[1].add_((g.double()[:, :, None] * x.double()[:, None, :]).flatten(1))
    blocks[2].add_(g.double())
    taken = commit(kernels, w_tilde, inverse_gamma, g, h, x)
    loaded = w_tilde.clone()  # what a checkpoint gives back
    assert torch.equal(row_norms(kernels, loaded, hidden, inputs), taken)
    tolerance = {"rtol": 1e-5, "atol": 0} if dtype is torch.float32 else {"rtol": 1e-13, "atol": 0}
    torch.testing.assert_close(w_tilde.double(), expected, rtol=tolerance["rtol"], atol=10 * tolerance["rtol"])
    torch.testing.assert_close(taken.double(), expected.norm(dim=1, keepdim=True), **tolerance)
