"""The C kernels run only on real CPU tensors and never where a tracer, a transform or a mode would see (or feed)
them. Under ``torch.compile`` every step that can reach a kernel equals its eager run (which uses the kernels) and
the process survives; with fake, meta, functional, wrapped, subclassed or lazily negated tensors, inside ``vmap``,
``grad``, ``functionalize``, ``make_fx``, ``jit.trace``, ``fx.symbolic_trace`` or a mode, every kernel getter
declines, no kernel is called, and the PyTorch ops give the right answer."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import lightning_ortho._native as native
from lightning_ortho._native import lru, readout, reflection_rows, rtrl, tbptt, uoro
from lightning_ortho._native.factored_traces import factored_trace_kernels
from lightning_ortho._native.guard import real_cpu_tensor
from lightning_ortho._native.kf_rtrl import kf_rtrl_kernels
from lightning_ortho._native.lru import lru_kernels
from lightning_ortho._native.readout import linear_readout_kernel
from lightning_ortho._native.reflection_rows import row_kernels
from lightning_ortho._native.rtrl import rtrl_gradient_kernel, rtrl_tanh_kernels
from lightning_ortho._native.tanh_cell import TanhCellForward
from lightning_ortho._native.tbptt import tbptt_tanh_kernels
from lightning_ortho._native.uoro import uoro_gradient_kernel, uoro_tanh_kernels
from lightning_ortho.models.online.readout_step import readout_step
from lightning_ortho.nn import AuxiliaryReflection
from lightning_ortho.online import RTRL, UORO, DiagonalRTRL, GRUCell, LinearRecurrentUnit, TanhRNNCell, TruncatedBPTT
from tests.helpers import auxiliary_reference

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64

needs_compiler = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture
def kernels_on(monkeypatch):
    """The kernels on, whatever ``LIGHTNING_ORTHO_NATIVE`` the suite runs with (these tests are about them)."""
    monkeypatch.setenv("LIGHTNING_ORTHO_NATIVE", "1")
    native.load.cache_clear()
    if native.load("reflection_rows") is None:
        pytest.skip("the C kernels are not available on this machine")
    yield
    native.load.cache_clear()


# -- torch.compile, in a process of its own (a kernel fed fake tensors corrupts the heap) --------------------------

#: Compiles with each backend named in ``sys.argv``, kernels on: two UORO steps and their gradients on a TanhRNNCell
#: (the fused GIR step, both projections) and on a GRUCell (the summed-estimate kernel), an AuxiliaryReflection
#: forward and backward on well-scaled rows (the row passes), and the online readout step (cross-entropy with a mask
#: and an ignored class, mse). Each compiled result must equal the eager one, which ran the kernels, to rounding.
COMPILE = """
import sys
import torch
from torch import nn
from lightning_ortho._native.readout import linear_readout_kernel
from lightning_ortho._native.tanh_cell import TanhCellForward
from lightning_ortho._native.reflection_rows import row_kernels
from lightning_ortho._native.rtrl import rtrl_gradient_kernel, rtrl_tanh_kernels
from lightning_ortho._native.factored_traces import factored_trace_kernels
from lightning_ortho._native.guard import real_cpu_tensor
from lightning_ortho._native.kf_rtrl import kf_rtrl_kernels
from lightning_ortho._native.lru import lru_kernels
from lightning_ortho._native.tbptt import tbptt_tanh_kernels
from lightning_ortho._native.uoro import uoro_gradient_kernel, uoro_tanh_kernels
from lightning_ortho.models.online.readout_step import readout_step
from lightning_ortho.nn import AuxiliaryReflection
from lightning_ortho.online import RTRL, UORO, DiagonalRTRL, GRUCell, LinearRecurrentUnit, TanhRNNCell, TruncatedBPTT

F64 = torch.float64
like = torch.zeros(1, 1, dtype=F64)
assert None not in (row_kernels(like), uoro_tanh_kernels(like), uoro_gradient_kernel(like), linear_readout_kernel(like))
assert None not in (rtrl_tanh_kernels(like), rtrl_gradient_kernel(like))
TOLERANCE = {"rtol": 1e-12, "atol": 1e-12}  # the kernels and the PyTorch ops sum in other orders


def steps(estimator, state, xs, grads):
    out = []
    for x, grad_h in zip(xs, grads):
        h, state = estimator.step(x, state)
        tensors = {k: v.clone() for k, v in state.tensors.items()}  # with GIR w_tilde is updated in place: copies
        out.append((h, tensors, estimator.gradient(state, grad_h)))
    return out


def reflect(layer, x):
    x = x.clone().requires_grad_()
    y = layer(x)
    return y.detach(), torch.autograd.grad((y * y.detach().cos()).sum(), [x, *layer.parameters()])


for backend in sys.argv[1:]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    for name, cell, projection in [
        ("tanh_state", TanhRNNCell(3, 5), "state"),
        ("tanh_preactivation", TanhRNNCell(3, 5), "preactivation"),
        ("gru_state", GRUCell(3, 5), "state"),
    ]:
        estimator = UORO(cell.double(), projection=projection, generator=3)
        h0, xs, grads = torch.randn(4, 5, dtype=F64), torch.randn(2, 4, 3, dtype=F64), torch.randn(2, 4, 5, dtype=F64)
        state = estimator.initial_state(h0)
        with estimator.noise_scope(state):  # compiled draws come from the default generator: make it the state's
            compiled = torch.compile(steps, backend=backend)(estimator, state, xs, grads)
        torch.testing.assert_close(compiled, steps(estimator, estimator.initial_state(h0), xs, grads), **TOLERANCE)
        print(backend, name, flush=True)

    estimator = RTRL(TanhRNNCell(3, 5).double())  # the fused step and the summed estimate
    h0, xs, grads = torch.randn(4, 5, dtype=F64), torch.randn(2, 4, 3, dtype=F64), torch.randn(2, 4, 5, dtype=F64)
    compiled = torch.compile(steps, backend=backend)(estimator, estimator.initial_state(h0), xs, grads)
    torch.testing.assert_close(compiled, steps(estimator, estimator.initial_state(h0), xs, grads), **TOLERANCE)
    print(backend, "rtrl_tanh", flush=True)

    layer, x = AuxiliaryReflection(6).double(), torch.randn(5, 6, dtype=F64)
    torch.testing.assert_close(torch.compile(reflect, backend=backend)(layer, x), reflect(layer, x), **TOLERANCE)
    print(backend, "reflection", flush=True)

    linear, h = nn.Linear(6, 4).double(), torch.randn(5, 6, dtype=F64)
    mask = torch.tensor([True, True, False, True, True])
    for loss, y in [("cross_entropy", torch.tensor([0, 3, 1, -100, 2])), ("mse", torch.randn(5, 4, dtype=F64))]:
        step = lambda linear, h, y, mask: readout_step(linear, h, y, mask, loss, 7.0)
        compiled = torch.compile(step, backend=backend)(linear, h, y, mask)
        torch.testing.assert_close(compiled, step(linear, h, y, mask), **TOLERANCE)
        print(backend, "readout_" + loss, flush=True)
"""

COMPILED = [
    "tanh_state",
    "tanh_preactivation",
    "gru_state",
    "rtrl_tanh",
    "reflection",
    "readout_cross_entropy",
    "readout_mse",
]


@needs_compiler
@pytest.mark.parametrize(
    "backends",
    [("eager", "aot_eager"), pytest.param(("inductor",), marks=pytest.mark.slow)],  # inductor: minutes of C++ builds
    ids=["eager_and_aot_eager", "inductor"],
)
def test_compiled_steps_that_reach_a_kernel_equal_eager_and_the_process_survives(backends, tmp_path):
    env = {**os.environ, "LIGHTNING_ORTHO_NATIVE": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", COMPILE, *backends],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        check=False,
    )
    # the old code: "malloc(): unaligned tcache chunk detected" and SIGABRT at the first UORO step
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-3000:])
    assert result.stdout.split() == [word for backend in backends for case in COMPILED for word in (backend, case)]


# -- a spy in place of the libraries: which kernels would run ------------------------------------------------------


class KernelCalled(AssertionError):
    """A C kernel was called: the spy refuses every call, so nothing reaches the memory of a fake tensor."""


class _SpyFunction:
    """Stands for one C function: records its name and raises; ``argtypes``/``restype`` are the real function's."""

    def __init__(self, name: str, function, calls: list[str]) -> None:
        self.__dict__.update(_name=name, _function=function, _calls=calls)

    def __getattr__(self, attribute: str):
        return getattr(self._function, attribute)

    def __setattr__(self, attribute: str, value) -> None:
        setattr(self._function, attribute, value)

    def __call__(self, *args):
        self._calls.append(self._name)
        raise KernelCalled(self._name)


class _SpyLibrary:
    def __init__(self, library, calls: list[str]) -> None:
        self._library, self._calls = library, calls

    def __getattr__(self, name: str) -> _SpyFunction:
        return _SpyFunction(name, getattr(self._library, name), self._calls)


@pytest.fixture
def spy(kernels_on, monkeypatch) -> list[str]:
    """The bindings load spies of the real libraries: every kernel call is recorded (the list returned) and refused
    with :class:`KernelCalled`; whatever a getter decides is otherwise unchanged."""
    calls: list[str] = []
    modules = (reflection_rows, uoro, readout, rtrl, tbptt, lru)
    libraries = {
        m.__name__.rsplit(".", 1)[1]: _SpyLibrary(native.load(m.__name__.rsplit(".", 1)[1]), calls) for m in modules
    }
    for module in modules:
        monkeypatch.setattr(module, "load", libraries.__getitem__)
    return calls


def _linear_and_data(generator_seed: int = 0):
    g = torch.Generator().manual_seed(generator_seed)
    linear = nn.Linear(6, 4).double()
    h = torch.randn(5, 6, generator=g, dtype=F64)
    return linear, h, torch.tensor([0, 3, 1, 2, 2]), torch.randn(5, 4, generator=g, dtype=F64)


def _autograd_readout(linear, h, y, loss, streams):
    """``(loss sum, dL/dh)`` by autograd of the textbook losses, ``L = loss sum / streams``."""
    h = h.detach().clone().requires_grad_()
    o = linear(h)
    total = F.cross_entropy(o, y, reduction="sum") if loss == "cross_entropy" else 0.5 * ((o - y) ** 2).sum()
    (grad_h,) = torch.autograd.grad(total / streams, h)
    return total.detach(), grad_h


def test_the_spy_sees_every_kernel_family_on_real_tensors(spy):
    """The positive control: on plain CPU tensors each getter lets its kernel run, so the spy is reached."""
    linear, h, y, _ = _linear_and_data()
    with pytest.raises(KernelCalled):
        readout_step(linear, h, y, None, "cross_entropy", 5.0)
    with pytest.raises(KernelCalled), torch.no_grad():
        AuxiliaryReflection(6).double()(h)
    for cell in (TanhRNNCell(3, 5).double(), GRUCell(3, 5).double()):
        estimator = UORO(cell, generator=0)
        state = estimator.initial_state(torch.zeros(4, 5, dtype=F64))
        with pytest.raises(KernelCalled):
            state = estimator.step(torch.randn(4, 3, dtype=F64), state)[1]  # the fused step (tanh)
            estimator.gradient(state, torch.randn(4, 5, dtype=F64))  # the summed estimate (GRU)
    estimator = RTRL(TanhRNNCell(3, 5).double())
    state = estimator.initial_state(torch.zeros(4, 5, dtype=F64))
    with pytest.raises(KernelCalled):
        estimator.step(torch.randn(4, 3, dtype=F64), state)
    with pytest.raises(KernelCalled):
        estimator.gradient(state, torch.randn(4, 5, dtype=F64))
    estimator = TruncatedBPTT(TanhRNNCell(3, 5).double(), 2)
    state = estimator.initial_state(torch.zeros(4, 5, dtype=F64))
    with pytest.raises(KernelCalled):
        estimator.step(torch.randn(4, 3, dtype=F64), state)
    with pytest.raises(KernelCalled):
        estimator.gradient(state, torch.randn(4, 5, dtype=F64))
    estimator = DiagonalRTRL(LinearRecurrentUnit(3, 5).double())
    state = estimator.initial_state(torch.zeros(4, 5, dtype=torch.complex128))
    with pytest.raises(KernelCalled):
        estimator.step(torch.randn(4, 3, dtype=F64), state)
    with pytest.raises(KernelCalled):
        estimator.gradient(state, torch.randn(4, 5, dtype=torch.complex128))
    assert set(spy) == {
        "lru_step_float64",
        "lru_gradient_float64",
        "tbptt_tanh_step_float64",
        "tbptt_tanh_gradient_float64",
        "rtrl_tanh_step_float64",
        "rtrl_gradient_float64",
        "readout_linear_float64",
        "reflect_rows_float64",
        "uoro_tanh_gir_step_float64",  # the fused step: one call at this size
        "uoro_gradient_float64",
    }


# -- every getter declines ------------------------------------------------------------------------------------------


#: The parameters of a TanhRNNCell(3, 3), made outside every mode and transform, for the cell's one-call forward.
_CELL_PARAMETERS = dict(TanhRNNCell(3, 3).double().requires_grad_(False).named_parameters())


def _decisions(t: torch.Tensor) -> list:
    """What every getter answers for ``t`` alone and for ``t`` among plain tensors."""
    plain = torch.zeros(2, 3, dtype=F64)
    return [
        real_cpu_tensor(t) or None,
        TanhCellForward()(_CELL_PARAMETERS, t, plain),
        TanhCellForward()(_CELL_PARAMETERS, plain, t),
        row_kernels(t),
        row_kernels(plain, t),
        uoro_tanh_kernels(t),
        uoro_tanh_kernels(plain, plain, t),
        uoro_gradient_kernel(t),
        uoro_gradient_kernel(plain, t),
        linear_readout_kernel(t),
        linear_readout_kernel(plain, plain, None, t),
        rtrl_tanh_kernels(t),
        rtrl_tanh_kernels(plain, plain, t),
        rtrl_gradient_kernel(t),
        rtrl_gradient_kernel(plain, t),
        tbptt_tanh_kernels(t),
        tbptt_tanh_kernels(plain, plain, t),
        factored_trace_kernels(t),
        factored_trace_kernels(plain, t),
        lru_kernels(t),
        lru_kernels(plain, t),
        kf_rtrl_kernels(t),
        kf_rtrl_kernels(plain, t),
    ]


def _plain() -> torch.Tensor:
    return torch.ones(2, 3, dtype=F64)


class _Subclass(torch.Tensor):
    pass


class _Watching(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Replacing(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _inside(transform) -> list:
    """The decisions about a tensor as ``transform`` hands it to the function it transforms."""
    seen = []

    def function(t):
        seen.append(_decisions(t))
        return (t * t).sum()

    transform(function)(_plain())
    return seen[0]


def _in_fake_mode() -> list:
    with FakeTensorMode():
        return _decisions(_plain())


def _fake_outside_its_mode() -> list:
    with FakeTensorMode():
        fake = _plain()
    return _decisions(fake)


def _in_mode(mode) -> list:
    with mode:
        return _decisions(_plain())


def _in_fx_symbolic_trace() -> list:
    seen, real = [], _plain()

    def function(x):
        seen.append(_decisions(real))  # a real tensor, but the ops around the kernel are being recorded
        return x + 1

    torch.fx.symbolic_trace(function)
    return seen[0]


def _in_jit_trace() -> list:
    seen = []

    def function(x):
        seen.append(_decisions(x))
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(function, (_plain(),), check_trace=False)
    return seen[0]


DECLINED = {
    "fake_tensor_in_its_mode": _in_fake_mode,
    "fake_tensor_outside_its_mode": _fake_outside_its_mode,
    "meta": lambda: _decisions(torch.ones(2, 3, dtype=F64, device="meta")),
    "subclass": lambda: _decisions(_plain().as_subclass(_Subclass)),
    "functional": lambda: _decisions(torch._to_functional_tensor(_plain())),
    "lazily_negated": lambda: _decisions(torch._neg_view(_plain())),
    "sparse": lambda: _decisions(_plain().to_sparse()),
    "vmap": lambda: _inside(torch.vmap),
    "grad": lambda: _inside(torch.func.grad),
    "functionalize": lambda: _inside(torch.func.functionalize),
    "make_fx": lambda: _inside(make_fx),  # real tensors, recorded by a proxy mode
    "make_fx_fake": lambda: _inside(lambda f: make_fx(f, tracing_mode="fake")),
    "jit_trace": _in_jit_trace,
    "fx_symbolic_trace": _in_fx_symbolic_trace,
    "dispatch_mode": lambda: _in_mode(_Watching()),
    "function_mode": lambda: _in_mode(_Replacing()),
}


@pytest.mark.parametrize("case", list(DECLINED))
def test_every_getter_declines_where_a_kernel_must_not_run(kernels_on, case):
    decisions = DECLINED[case]()
    assert decisions == [None] * len(decisions) == [None] * len(_decisions(_plain()))


ALLOWED = {
    "plain": lambda: _decisions(_plain()),
    "parameter": lambda: _decisions(nn.Parameter(_plain())),
    "inference_mode": lambda: _decisions(torch.inference_mode()(_plain)()),
    "default_device_block": lambda: _in_mode(torch.device("cpu")),  # only where factories allocate: harmless
}


@pytest.mark.parametrize("case", list(ALLOWED))
def test_every_getter_allows_real_cpu_tensors(kernels_on, case):
    assert None not in ALLOWED[case]()


def test_under_cpu_autocast_only_the_kernels_fed_by_pytorch_products_decline(kernels_on):
    """The reflection's rows and UORO's fused step read products (``x W^T``, ``W_h h``) that autocast would return
    in bfloat16; the summed estimate and the readout read only their inputs."""
    plain = _plain()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert row_kernels(plain) is None and uoro_tanh_kernels(plain) is None and rtrl_tanh_kernels(plain) is None
        assert uoro_gradient_kernel(plain) is not None and linear_readout_kernel(plain) is not None
        assert rtrl_gradient_kernel(plain) is not None
        assert factored_trace_kernels(plain) is not None  # it reads only its inputs
        assert lru_kernels(plain) is not None  # no PyTorch product feeds it
        assert kf_rtrl_kernels(plain) is not None  # KFRTRL declines itself where BLAS would compute the product
        assert tbptt_tanh_kernels(plain) is None  # its step runs the cell, whose products autocast would take


# -- the layers and steps: no kernel call, the right answer ---------------------------------------------------------


def test_under_fake_tensor_mode_the_readout_runs_the_pytorch_ops(spy):
    linear, h, y, _ = _linear_and_data()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        loss, grad_h, grads = readout_step(linear, mode.from_tensor(h), mode.from_tensor(y), None, "cross_entropy", 5.0)
    assert spy == []
    assert isinstance(grad_h, FakeTensor) and grad_h.shape == (5, 6) and grad_h.dtype == F64
    assert loss.shape == () and [tuple(g.shape) for g in grads] == [(4, 6), (4,)]


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_make_fx_records_the_readout_and_its_graph_follows_new_inputs(spy, loss):
    """Traced with real tensors: a kernel would run at trace time and leave its outputs as constants in the graph."""
    linear, h, y_index, y_real = _linear_and_data(0)
    y = y_index if loss == "cross_entropy" else y_real
    graph = make_fx(lambda h, y: readout_step(linear, h, y, None, loss, 5.0)[:2])(h, y)
    assert spy == []
    _, h_new, y_index_new, y_real_new = _linear_and_data(1)
    y_new = y_index_new.flip(0) if loss == "cross_entropy" else y_real_new
    for got, expected in zip(graph(h_new, y_new), _autograd_readout(linear, h_new, y_new, loss, 5.0), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap of scatter_, in the PyTorch ops
def test_in_vmap_the_readout_equals_autograd_per_stream(spy):
    linear, h, y, _ = _linear_and_data()
    one_stream = lambda h_b, y_b: readout_step(linear, h_b[None], y_b[None], None, "cross_entropy", 5.0)[1][0]
    batched = torch.vmap(one_stream)(h, y)
    assert spy == []
    expected = _autograd_readout(linear, h, y, "cross_entropy", 5.0)[1]  # rows of the sum are the per-stream terms
    torch.testing.assert_close(batched, expected, rtol=1e-12, atol=1e-12)


def test_the_reflection_under_grad_and_vmap_equals_the_dense_reference(spy):
    torch.manual_seed(0)
    layer = AuxiliaryReflection(6).double()
    x = torch.randn(5, 6, dtype=F64)
    weights = x.detach().cos()
    got = torch.func.grad(lambda x: (layer(x) * weights).sum())(x)
    mapped = torch.vmap(lambda rows: layer(rows))(x.view(5, 1, 6)).view(5, 6)
    assert spy == []
    x_leaf = x.clone().requires_grad_()
    reference = torch.stack([auxiliary_reference(row, layer.weight.detach()) for row in x_leaf])
    (expected,) = torch.autograd.grad((reference * weights).sum(), x_leaf)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mapped, reference.detach(), rtol=1e-12, atol=1e-12)


# -- a lazily negated tensor is read as its value (its memory holds the opposite) -------------------------------------


def test_a_lazily_negated_incoming_gradient_gives_the_reflection_the_gradient_of_its_value(kernels_on):
    """The forward chose the row kernels; the backward must check the gradient it is handed, not trust that choice."""
    torch.manual_seed(0)
    layer = AuxiliaryReflection(6).double()
    x, g = torch.randn(5, 6, dtype=F64, requires_grad=True), torch.randn(5, 6, dtype=F64)
    got = torch.autograd.grad(layer(x), [x, layer.weight], torch._neg_view(g))
    expected = torch.autograd.grad(layer(x), [x, layer.weight], -g)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_lazily_negated_inputs_reach_the_uoro_step_and_the_readout_as_their_values(kernels_on):
    torch.manual_seed(0)
    x, h0 = torch.randn(4, 3, dtype=F64), torch.randn(4, 5, dtype=F64)
    results = []
    for step_input in (torch._neg_view(x), -x):
        estimator = UORO(TanhRNNCell(3, 5).double(), generator=0)
        torch.manual_seed(1)
        estimator.cell.load_state_dict(TanhRNNCell(3, 5).double().state_dict())
        h, state = estimator.step(step_input, estimator.initial_state(h0))
        results.append((h, state.tensors["h_tilde"], state.tensors["w_tilde"]))
    torch.testing.assert_close(results[0], results[1], rtol=1e-12, atol=1e-12)
    linear, h, y, _ = _linear_and_data()
    got = readout_step(linear, torch._neg_view(h), y, None, "cross_entropy", 5.0)
    torch.testing.assert_close(got, readout_step(linear, -h, y, None, "cross_entropy", 5.0), rtol=1e-12, atol=1e-12)
