"""One step + gradient of every estimator on every cell it takes compiles as one graph (``fullgraph=True``) and
computes what the eager call computes.

The default suite compiles with the ``aot_eager`` backend: Dynamo's capture and AOT autograd's functionalisation,
the parts where a graph breaks, without inductor's code generation (minutes on two cores); the inductor variant
is marked ``slow``. Steady-state steps do not recompile. NaN/inf checks are recorded (``check_every=None``) and read after the compiled calls.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch._dynamo.utils import counters

from tests.online.estimator_cases import build, cases, covering_cases


def _step_and_gradient(estimator, x, state, grad_h):
    h, state = estimator.step(x, state)
    return h, state, estimator.gradient(state, grad_h)


def _run(case: str, backend: str | None, device: str = "cpu"):
    estimator, state, xs, grad_hs = build(case, device=device)
    estimator.check_every = None
    call = _step_and_gradient
    if backend is not None:
        torch._dynamo.reset()
        counters.clear()
        call = torch.compile(_step_and_gradient, fullgraph=True, backend=backend)
    out = []
    # the randomised estimators' noise: compiled calls draw from the default generator, which the scope makes the
    # state's own (so compiled and eager draw the same numbers); eager calls draw from the state's generator
    scope = estimator.noise_scope(state) if backend is not None and hasattr(estimator, "noise_scope") else nullcontext()
    # inductor draws random numbers with a generator of its own unless told to call the eager ops
    rng = torch._inductor.config.patch(fallback_random=True) if backend == "inductor" else nullcontext()
    with scope, rng:
        graphs = []
        for t in range(6):
            h, state, grads = call(estimator, xs[t], state, grad_hs[t])
            out.append((h.to("cpu", copy=True), {k: v.to("cpu", copy=True) for k, v in grads.items()}))
            graphs.append(counters["stats"]["unique_graphs"])
    estimator.check(state)
    # In the steady state nothing recompiles: the step count turns symbolic at the second call, and TruncatedBPTT's
    # window (k = 2) fills and first slides in the next two (a graph each).
    if backend is not None:
        assert graphs[-1] == graphs[3], f"{case}: graphs compiled after each call: {graphs}"
    return out


def _assert_same(case, eager, compiled):
    for t, ((h_e, g_e), (h_c, g_c)) in enumerate(zip(eager, compiled, strict=True)):
        torch.testing.assert_close(h_c, h_e, rtol=1e-12, atol=1e-12, msg=f"{case}: h at step {t + 1}")
        assert g_c.keys() == g_e.keys()
        for name in g_e:
            torch.testing.assert_close(
                g_c[name], g_e[name], rtol=1e-10, atol=1e-12, msg=f"{case}: gradient of {name} at step {t + 1}"
            )


#: Cases whose graph still breaks (being fixed): strict, so a fixed case must leave this set.
def _marked(case):
    """Every case: the covering ones in the default suite, the others with ``-m slow`` (minutes on two cores)."""
    return case if case in COVERING else pytest.param(case, marks=pytest.mark.slow)


COVERING = set(covering_cases())


@pytest.mark.parametrize("case", [_marked(c) for c in cases()])
def test_one_step_and_gradient_compile_as_one_graph(case):
    _assert_same(case, _run(case, None), _run(case, "aot_eager"))


@pytest.mark.slow
@pytest.mark.parametrize("case", cases())
def test_one_step_and_gradient_compile_with_inductor(case):
    _assert_same(case, _run(case, None), _run(case, "inductor"))


#: Cases compiled with inductor on a GPU (the covering ones with ``aot_eager``): its code generation for CUDA
INDUCTOR_ON_CUDA = ("uoro/tanh", "rtrl/tanh", "diagonal_rtrl/lru")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize(
    "case, backend", [(c, "aot_eager") for c in sorted(COVERING)] + [(c, "inductor") for c in INDUCTOR_ON_CUDA]
)
def test_one_step_and_gradient_compile_as_one_graph_on_the_gpu(case, backend):
    _assert_same(case, _run(case, None, "cuda"), _run(case, backend, "cuda"))


@pytest.mark.parametrize(
    "case", ["rflo/tanh", "snap-1/tanh", "uoro/tanh", "kf_rtrl/tanh", "rtrl/tanh", "tbptt/tanh", "diagonal_rtrl/lru"]
)
def test_steps_compiled_after_eager_ones_are_one_graph_and_continue_the_eager_run(case):
    """Eager steps first arm what the one-stream paths remember (their C calls among it); a compiled step after them
    must not reach any of it (a tracer cannot call into C) and continues the eager run exactly, and so does an eager
    step after the compiled ones."""
    eager = _run(case, None)
    estimator, state, xs, grad_hs = build(case)
    estimator.check_every = None
    torch._dynamo.reset()
    compiled = torch.compile(_step_and_gradient, fullgraph=True, backend="aot_eager")
    for t in range(6):  # eager, eager, eager, compiled, compiled, eager
        call = compiled if t in (3, 4) else _step_and_gradient
        # compiled calls draw the state's noise inside its scope (the numbers the eager calls draw from its generator)
        scope = estimator.noise_scope(state) if call is compiled and hasattr(estimator, "noise_scope") else None
        with scope or nullcontext():
            h, state, grads = call(estimator, xs[t], state, grad_hs[t])
        torch.testing.assert_close(h, eager[t][0], rtol=1e-12, atol=1e-12, msg=f"{case}: h at step {t + 1}")
        assert grads.keys() == eager[t][1].keys()
        for name in grads:
            torch.testing.assert_close(
                grads[name], eager[t][1][name], rtol=1e-10, atol=1e-12, msg=f"{case}: {name} at step {t + 1}"
            )
    estimator.check(state)
