"""Every estimator on every cell it takes computes on a GPU what it computes on the CPU (the GPU's host reads and
compiled graphs: test_host_syncs.py, test_compiled_steps.py).

The reference is the CPU run in float64 (the C kernels where they apply). The other runs: the CPU with the kernels
off (``native_kernels(False)``: the PyTorch path, the one a GPU runs, so the comparison itself is tested on every
machine) and, where CUDA is available, the GPU. The randomised estimators (UORO, KF-RTRL) draw their noise from a
generator of their device, and CUDA's generator draws other numbers than the CPU's from the same seed; here both
runs draw it from one CPU generator seeded alike (:func:`noise_from_the_cpu`, in place of the one draw of
:class:`~lightning_ortho.online.stream_noise.StreamNoise`), so the estimates must agree to rounding.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from lightning_ortho._native import native_kernels
from lightning_ortho.online.stream_noise import StreamNoise
from tests.online.estimator_cases import build, cases

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
#: ``name: (device, kernels on)`` of the runs compared with the CPU's
RUNS = {"cpu-pytorch": ("cpu", False), "cuda": ("cuda", True)}


@contextlib.contextmanager
def noise_from_the_cpu(seed: int = 0):
    """Within the block, the randomised estimators draw from one CPU generator seeded ``seed`` and move the numbers
    to the device of the step (the same ``randn`` then ``randint`` as their own draw, into the caller's buffers where
    it gives some)."""
    generator = torch.Generator().manual_seed(seed)
    own = StreamNoise._draw_bits

    def draw_bits(self, state, like, normal, signs, into=None, streams=None):
        total, rows = self._rows(state) if streams is None else streams
        nu = None
        if normal is not None:
            nu = torch.randn(total, normal, generator=generator, dtype=like.dtype).to(like.device)
        bits = torch.randint(0, 2, (total, *signs), generator=generator, dtype=like.dtype).to(like.device)
        if into is not None:
            if normal is not None:
                into[0].copy_(nu)
            into[1].copy_(bits)
            return into[0], into[1], rows
        return nu, bits, rows

    StreamNoise._draw_bits = draw_bits
    try:
        yield
    finally:
        StreamNoise._draw_bits = own


def _steps(case: str, device: str, kernels: bool) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """``(h, gradient)`` of 8 steps of ``case`` on ``device`` (copied to the CPU), the noise from the CPU."""
    with native_kernels(kernels), noise_from_the_cpu():
        estimator, state, xs, grad_hs = build(case, device=device)
        out = []
        for t in range(len(xs)):
            h, state = estimator.step(xs[t], state)
            gradient = estimator.gradient(state, grad_hs[t])
            out.append((h.to("cpu", copy=True), {name: g.to("cpu", copy=True) for name, g in gradient.items()}))
    return out


@pytest.mark.parametrize("run", [pytest.param("cpu-pytorch"), pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("case", cases())
def test_every_device_computes_what_the_cpu_computes(case, run):
    device, kernels = RUNS[run]
    reference, other = _steps(case, "cpu", True), _steps(case, device, kernels)
    for t, ((h_ref, g_ref), (h, g)) in enumerate(zip(reference, other, strict=True)):
        torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-12, msg=f"{case} on {run}: h at step {t + 1}")
        assert g.keys() == g_ref.keys()
        for name in g_ref:
            torch.testing.assert_close(
                g[name], g_ref[name], rtol=1e-9, atol=1e-12, msg=f"{case} on {run}: gradient of {name}, step {t + 1}"
            )
