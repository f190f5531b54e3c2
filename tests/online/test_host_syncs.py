"""No host synchronisation in a steady-state step: every estimator, every cell it takes, NaN/inf checks recorded.

A host synchronisation reads a tensor's value on the host (``bool(t)``, ``t.item()``, ``t.tolist()``): a GPU then
waits for its whole queue, and ``torch.compile`` cannot trace it. The counter sees the dispatched reads
(``aten._local_scalar_dense``, ``aten.is_nonzero``, ``aten.equal``) and the undispatched ones (``Tensor.tolist``,
``Tensor.numpy``). The C kernels decline under a dispatch mode, so this counts the PyTorch path, the one every
device runs (the kernels run on real CPU memory only, where there is no device to wait for).
"""

from __future__ import annotations

import pytest
import torch

from tests.online.estimator_cases import build, cases
from tests.sync_counter import HostSyncCounter

#: On a GPU a host read waits for the device's whole queue: there the counter sees what a GPU user would pay for.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]

#: Cases that still read on the host (being fixed): strict, so a fixed case must leave this set.
KNOWN_READS: set[str] = set()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="reads on the host")) if c in KNOWN_READS else c
        for c in cases()
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_a_steady_state_step_reads_nothing_on_the_host(case, device):
    estimator, state, xs, grad_hs = build(case, device=device)
    estimator.check_every = None  # record NaN/inf; read once per window (below)
    for t in range(3):  # warm-up: first-step work (caches, probes) is not the steady state
        _, state = estimator.step(xs[t], state)
        estimator.gradient(state, grad_hs[t])
    with HostSyncCounter() as counter:
        for t in range(3, 8):
            _, state = estimator.step(xs[t], state)
            estimator.gradient(state, grad_hs[t])
            estimator.gradient(state, grad_hs[t], per_stream=True)
    assert counter.reads == [], f"{case} on {device}: host reads in 5 steady-state steps: {counter.reads}"
    with HostSyncCounter() as counter:
        estimator.check(state)  # the window's one read
    assert len(counter.reads) == 1, counter.reads
