"""The C kernels of ``lightning_ortho._native``: built on first use into the cache, validated before they are loaded
(a truncated or corrupted cache is rebuilt, never mapped), loaded from a private copy, the same results as the
PyTorch ops, and a clean fallback (one warning) where they cannot be built."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import lightning_ortho._native as native
from lightning_ortho._native.reflection_rows import reflect_rows, reflect_rows_backward, row_kernels
from lightning_ortho.nn import AuxiliaryReflection

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """These tests are about the kernels: on, whatever ``LIGHTNING_ORTHO_NATIVE`` the suite runs with; ``load``
    forgets what it loaded before and after."""
    monkeypatch.setenv("LIGHTNING_ORTHO_NATIVE", "1")
    native.load.cache_clear()
    yield
    native.load.cache_clear()


@pytest.fixture
def fresh_load(monkeypatch, tmp_path):
    """``load`` forgets what it built, with a cache folder of the test's own; restored afterwards."""
    monkeypatch.setenv("LIGHTNING_ORTHO_CACHE_DIR", str(tmp_path / "cache"))
    native.load.cache_clear()
    yield tmp_path / "cache"
    native.load.cache_clear()


def run_python(code: str, args: list[str] = ()) -> subprocess.CompletedProcess:
    """``code`` with ``args`` in a fresh interpreter with the kernels on (a crash there is a return code here),
    this checkout first on the path."""
    env = {**os.environ, "LIGHTNING_ORTHO_NATIVE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


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
    record = built[0].with_name(built[0].name + ".json")
    # no partial files or private copies left behind: the library and the record of its size and SHA-256
    assert sorted(p.name for p in fresh_load.iterdir()) == [built[0].name, record.name]
    data = built[0].read_bytes()
    assert json.loads(record.read_text()) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@needs_compiler
def test_the_extension_is_built_once_into_the_cache_and_off_with_the_switch(fresh_load, monkeypatch):
    import sysconfig

    if not Path(sysconfig.get_paths()["include"], "Python.h").is_file():
        pytest.skip("Python's headers are not installed here")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = native.load_extension("fastcall")
    assert module is not None and module.TanhForward and module.FactoredTrace
    built = list(fresh_load.glob("fastcall-*.so"))
    assert len(built) == 1 and built[0].with_name(built[0].name + ".json").is_file()
    assert native.load_extension("fastcall") is module  # cached per process
    with native.native_kernels(False):
        assert native.load_extension("fastcall") is None
    # without Python's headers: not built, without a warning (what it speeds up runs its Python code)
    native.load.cache_clear()
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(fresh_load / "no-headers")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load_extension("fastcall") is None


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


def _flip_middle(library: Path, record: Path) -> None:
    data = bytearray(library.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 4096] = bytes(b ^ 0x5A for b in data[middle : middle + 4096])
    library.write_bytes(bytes(data))


#: What can happen to a cached library and its record between two runs: a copy cut short (full disk, killed
#: process), bytes changed, a record garbled, lost, or left from another build.
DAMAGE = {
    "truncated": lambda library, record: os.truncate(library, library.stat().st_size // 2),
    "corrupted": _flip_middle,
    "garbled_record": lambda library, record: record.write_text("{not json"),
    "no_record": lambda library, record: record.unlink(missing_ok=True),
    "stale_record": lambda library, record: record.write_text(json.dumps({"size": 1, "sha256": "0" * 64})),
}

#: In a fresh interpreter, for each cache folder given: load the row kernels (no warning) and check one pass
#: against the PyTorch ops; then empty the last folder's library, as another process clearing the cache would, and
#: run the loaded kernels again. Prints "ok <folder>" per folder, then "ok".
LOAD_AND_RUN = """
import os, sys, warnings
import torch
warnings.simplefilter("error")  # a NativeKernelsUnavailableWarning fails the run
import lightning_ortho._native as native
from lightning_ortho._native.reflection_rows import reflect_rows, row_kernels

def check(kernels, dtype):
    x = torch.randn(9, 5, dtype=torch.float64)
    v = x @ torch.randn(5, 5, dtype=torch.float64).T
    c = (v * x).sum(1, keepdim=True) / (v * v).sum(1, keepdim=True)
    torch.testing.assert_close(reflect_rows(kernels, x.to(dtype), v.to(dtype))[0], (x - 2 * c * v).to(dtype))

for folder in sys.argv[1:]:
    os.environ["LIGHTNING_ORTHO_CACHE_DIR"] = folder
    native.load.cache_clear()  # a first load from this folder, as in a new process
    kernels = {dtype: row_kernels(torch.zeros(1, 1, dtype=dtype)) for dtype in (torch.float32, torch.float64)}
    for dtype, pair in kernels.items():
        check(pair, dtype)
    print("ok", os.path.basename(folder), flush=True)
(library,) = native.cache_dir().glob("reflection_rows-*.so")
os.truncate(library, 0)  # with this file mapped, the next call would die of SIGBUS
for dtype, pair in kernels.items():
    check(pair, dtype)
print("ok")
"""


def _matches_its_record(library: Path) -> bool:
    data = library.read_bytes()
    record = json.loads(library.with_name(library.name + ".json").read_text())
    return record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@needs_compiler
def test_a_damaged_cache_is_rebuilt_never_mapped_and_a_truncated_cache_file_kills_nothing(fresh_load, tmp_path):
    """Each kind of damage in a cache of its own: the next process loads a rebuilt library (the old code mapped a
    truncated file and died of SIGBUS, or ran corrupted code), and a library emptied after it was loaded does not
    pull pages from under the process that loaded it (that process mapped a private copy)."""
    assert native.load("reflection_rows") is not None  # built once here, copied into each folder
    folders, damaged = [], {}
    for damage in DAMAGE:
        folder = tmp_path / damage
        shutil.copytree(fresh_load, folder)
        (library,) = folder.glob("reflection_rows-*.so")
        DAMAGE[damage](library, library.with_name(library.name + ".json"))
        folders.append(str(folder))
        damaged[damage] = library.read_bytes()
    shutil.copytree(fresh_load, tmp_path / "intact")  # the one emptied once loaded
    result = run_python(LOAD_AND_RUN, args=[*folders, str(tmp_path / "intact")])  # a crash: a negative code
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-3000:])
    assert result.stdout.split() == [word for name in [*DAMAGE, "intact"] for word in ("ok", name)] + ["ok"]
    for damage in DAMAGE:
        (library,) = (tmp_path / damage).glob("reflection_rows-*.so")
        assert _matches_its_record(library), damage  # rebuilt: a library and a record that vouches for it
        if damage in ("truncated", "corrupted"):
            assert library.read_bytes() != damaged[damage]


@needs_compiler
def test_loading_leaves_no_private_copy_and_survives_a_read_only_cache(fresh_load):
    assert native.load("reflection_rows") is not None
    native.load.cache_clear()
    fresh_load.chmod(0o555)  # a shared, prebuilt cache: the private copy goes to the temporary folder instead
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native.load("reflection_rows") is not None
    finally:
        fresh_load.chmod(0o755)
    assert sorted(p.suffix for p in fresh_load.iterdir()) == [".json", ".so"]


def test_the_cache_dir_is_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTNING_ORTHO_CACHE_DIR", "kernels")
    assert native.cache_dir() == tmp_path / "kernels"
    monkeypatch.setenv("LIGHTNING_ORTHO_CACHE_DIR", "~/kernels")
    assert native.cache_dir() == Path.home() / "kernels"
    monkeypatch.delenv("LIGHTNING_ORTHO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")
    assert native.cache_dir() == tmp_path / "cache" / "lightning_ortho"


@needs_compiler
def test_a_relative_cache_dir_builds_and_loads_in_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTNING_ORTHO_CACHE_DIR", ".")
    native.load.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old code built here, then looked the library up by its bare name
        kernels = row_kernels(torch.zeros(1, 1, dtype=torch.float64))
    assert kernels is not None
    x, v = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    c = (v * x).sum(1, keepdim=True) / (v * v).sum(1, keepdim=True)
    torch.testing.assert_close(reflect_rows(kernels, x, v)[0], x - 2 * c * v)
    assert len(list(tmp_path.glob("reflection_rows-*.so"))) == 1


#: Readouts with no outputs, no hidden units or no streams: the C path declines, so the answer (or the error) is
#: the PyTorch ops'. Then the C kernel itself, called with no outputs and null buffers, reads nothing.
EMPTY_READOUTS = """
import ctypes
import torch
from torch import nn
from lightning_ortho._native import native_kernels
from lightning_ortho._native.readout import linear_readout_kernel
from lightning_ortho.models.online.readout_step import readout_step
assert linear_readout_kernel(torch.zeros(1, 1)) is not None
for dtype in (torch.float32, torch.float64):
    for streams, hidden, outputs in ((3, 6, 0), (3, 0, 4), (0, 6, 4), (0, 0, 0)):
        torch.manual_seed(0)
        linear = nn.Linear(hidden, outputs).to(dtype)
        h = torch.randn(streams, hidden, dtype=dtype)
        cases = [
            ("mse", torch.randn(streams, outputs, dtype=dtype)),
            ("cross_entropy", torch.rand(streams, outputs, dtype=dtype)),
            ("cross_entropy", torch.full((streams,), -100)),
            ("cross_entropy", torch.zeros(streams, dtype=torch.long)),  # class 0: out of range with no outputs
        ]
        for loss, y in cases:
            for mask in (None, torch.ones(streams, dtype=torch.bool)):
                answers = []
                for native in (True, False):
                    try:
                        with native_kernels(None if native else False):
                            answers.append(readout_step(linear, h, y, mask, loss, 3.0))
                    except (RuntimeError, IndexError, ValueError) as error:
                        answers.append(f"{type(error).__name__}: {error}")
                if isinstance(answers[1], str):
                    assert answers[0] == answers[1], answers
                else:
                    torch.testing.assert_close(answers[0], answers[1], rtol=0, atol=0)
kernel = linear_readout_kernel(torch.zeros(1, 1, dtype=torch.float64))
h = torch.randn(3, 6, dtype=torch.float64)
grad_h = torch.full((3, 6), float("nan"), dtype=torch.float64)
loss = torch.full((), float("nan"), dtype=torch.float64)
total = kernel(
    h.data_ptr(), 3, 6, None, 0, None, None, None, 0, 0, None, 0, 1, -100, 3.0,
    None, grad_h.data_ptr(), None, None, loss.data_ptr(),
)
assert total == 0.0 and loss.item() == 0.0 and bool((grad_h == 0).all()), (total, loss, grad_h)
print("ok")
"""


@needs_compiler
def test_empty_readouts_do_not_crash_and_equal_the_pytorch_path():
    result = run_python(EMPTY_READOUTS)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (result.returncode, result.stderr[-3000:])
