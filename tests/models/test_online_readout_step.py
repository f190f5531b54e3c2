"""readout_step: the online step's readout loss and gradients in closed form equal autograd through
``masked_loss_sum(readout(h), y, mask, loss) / streams``, and the module trains the same with either."""

import pytest
import torch
from torch import nn

import lightning_ortho.models.online.readout_step as online_readout_step
import lightning_ortho.models.online_rnn_module as online_rnn_module
from lightning_ortho._native import native_kernels
from lightning_ortho._native.readout import LARGEST_PRODUCT, linear_readout_kernel
from lightning_ortho.models.online.readout import IGNORE_INDEX, Readout
from lightning_ortho.models.online.readout_step import readout_step
from lightning_ortho.online.losses import masked_loss_sum
from tests.models.test_online_rnn_module import TinyStreams, model, trainer

B, H, OUT = 6, 7, 4


def autograd_step(readout, h, y, mask, loss, streams):
    """The reference: what OnlineRNNModule._accumulate took by autograd before the closed form (``mask`` None:
    every stream)."""
    if mask is None:
        mask = torch.ones(h.shape[0], dtype=torch.bool)
    h_in = h.detach().requires_grad_(True)
    params = [p for p in readout.parameters() if p.requires_grad]
    with torch.enable_grad():
        loss_sum = masked_loss_sum(readout(h_in), y, mask, loss)
        grad_h, *grads = torch.autograd.grad(loss_sum / streams, [h_in, *params])
    return loss_sum.detach().double(), grad_h, grads


def targets(kind, dtype, mask, g):
    """Targets whose masked-out entries hold padding the loss must never see (NaN, inf, -100, out of range)."""
    if kind == "index":
        y = torch.randint(0, OUT, (B,), generator=g)
        return torch.where(mask, y, torch.tensor([IGNORE_INDEX, 99, -7, OUT, 0, 1]))
    y = torch.randn(B, OUT, generator=g, dtype=torch.float64)
    if kind == "probabilities":
        y = torch.softmax(y, -1)
    y = y.to(dtype)
    padding = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, 0.0, 2.0], dtype=dtype)
    return torch.where(mask[:, None], y, padding[:, None])


NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])


def step_with(native, *args):
    """``readout_step(*args)`` with the C kernels left to the environment (``native``) or turned off."""
    with native_kernels(None if native else False):
        return readout_step(*args)


@pytest.fixture
def kernel_runs(monkeypatch):
    """How many times the C pass ran (so a "native" case that silently took the PyTorch ops fails)."""
    runs = []
    original = online_readout_step.linear_readout

    def counting(*args, **kwargs):
        found = original(*args, **kwargs)
        runs.append(found[0] is not None)  # None: the pass declined (NaN, out-of-range class)
        return found

    monkeypatch.setattr(online_readout_step, "linear_readout", counting)
    return runs


def native_ran(runs, native, readout_kind, dtype=torch.float64):
    """Whether the C pass must have run for this case: a linear readout of float32/float64 with native on."""
    expected = native and readout_kind == "linear" and dtype in (torch.float32, torch.float64)
    expected = expected and linear_readout_kernel(torch.zeros(1, dtype=dtype)) is not None
    return runs == ([True] if expected else [])


CASES = [("mse", "real"), ("cross_entropy", "index"), ("cross_entropy", "probabilities")]
MASKS = {
    "some": [True, False, True, False, True, True],
    "all": [True] * B,
    "none": [False] * B,
    "None": None,  # every stream scores, said by mask=None: the path without masking kernels
}


@NATIVE
@pytest.mark.parametrize("mask", MASKS, ids=list(MASKS))
@pytest.mark.parametrize("loss, kind", CASES, ids=[k for _, k in CASES])
@pytest.mark.parametrize("readout_kind", ["linear", "units"])
def test_equals_autograd_in_float64(readout_kind, loss, kind, mask, native, kernel_runs):
    g = torch.Generator().manual_seed(0)
    readout = Readout(readout_kind, H, OUT).double()
    mask = None if MASKS[mask] is None else torch.tensor(MASKS[mask])
    h = torch.randn(B, H, generator=g, dtype=torch.float64)
    y = targets(kind, torch.float64, torch.ones(B, dtype=torch.bool) if mask is None else mask, g)
    y = torch.stack((y, y), 1)[:, 1]  # a step of a chunk, as the module passes it: not contiguous
    streams = B + 2  # not the batch size: the division is by the given number of streams
    expected = autograd_step(readout, h, y, mask, loss, streams)
    h_before = h.clone()
    got = step_with(native, readout, h, y, mask, loss, streams)
    assert native_ran(kernel_runs, native, readout_kind)
    assert torch.equal(h, h_before)  # the "units" readout's outputs are a view of h: never written in place
    if mask is None:  # the same as saying every stream scores with a mask
        with_mask = step_with(native, readout, h, y, torch.ones(B, dtype=torch.bool), loss, streams)
        for a, b in zip([got[0], got[1], *got[2]], [with_mask[0], with_mask[1], *with_mask[2]], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-15, atol=0)
        mask = torch.ones(B, dtype=torch.bool)
    assert got[0].dtype == torch.float64 and got[1].dtype == torch.float64 and not got[1].requires_grad
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-14)
    assert len(got[2]) == len(expected[2]) == (2 if readout_kind == "linear" else 0)
    for a, b in zip(got[2], expected[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    if not mask.any():
        assert got[0] == 0 and not got[1].any()
    else:
        assert got[1].abs().max() > 0  # the comparison is not of zeros


@NATIVE
@pytest.mark.parametrize("frozen", ["weight", "bias", "both"])
def test_frozen_readout_parameters_are_skipped(frozen, native, kernel_runs):
    g = torch.Generator().manual_seed(1)
    readout = Readout("linear", H, OUT).double()
    for name in ("weight", "bias") if frozen == "both" else (frozen,):
        getattr(readout.linear, name).requires_grad_(False)
    mask = torch.tensor(MASKS["some"])
    h, y = torch.randn(B, H, generator=g, dtype=torch.float64), targets("index", torch.float64, mask, g)
    expected = autograd_step(readout, h, y, mask, "cross_entropy", B)
    got = step_with(native, readout, h, y, mask, "cross_entropy", B)
    assert native_ran(kernel_runs, native, "linear")
    assert len(got[2]) == len(expected[2]) == (0 if frozen == "both" else 1)
    for a, b in zip([got[1], *got[2]], [expected[1], *expected[2]], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@NATIVE
def test_no_bias_and_ignore_index_at_a_scored_entry_as_cross_entropy_ignores_it(native, kernel_runs):
    g = torch.Generator().manual_seed(2)
    readout = Readout("linear", H, OUT).double()
    readout.linear.bias = None
    mask = torch.ones(B, dtype=torch.bool)  # -100 is scored by the mask but ignored by the loss
    h, y = torch.randn(B, H, generator=g, dtype=torch.float64), torch.tensor([0, IGNORE_INDEX, 3, 1, 2, 0])
    expected = autograd_step(readout, h, y, mask, "cross_entropy", B)
    got = step_with(native, readout, h, y, mask, "cross_entropy", B)
    assert native_ran(kernel_runs, native, "linear")
    for a, b in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@NATIVE
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("loss, kind", CASES, ids=[k for _, k in CASES])
@pytest.mark.parametrize("readout_kind", ["linear", "units"])
def test_float32_and_bfloat16_within_their_precision(readout_kind, loss, kind, dtype, native, kernel_runs):
    g = torch.Generator().manual_seed(3)
    readout = Readout(readout_kind, H, OUT).to(dtype)
    mask = torch.tensor(MASKS["some"])
    h, y = torch.randn(B, H, generator=g).to(dtype), targets(kind, dtype, mask, g)
    expected = autograd_step(readout, h, y, mask, loss, B)
    got = step_with(native, readout, h, y, mask, loss, B)
    assert native_ran(kernel_runs, native, readout_kind, dtype)
    assert got[0].dtype == torch.float64 and got[1].dtype == dtype
    assert [t.dtype for t in got[2]] == [dtype] * len(got[2]) and len(got[2]) == len(expected[2])
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6}
    for a, b in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]], strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), **tol)


def test_autocast_does_not_lower_the_precision():
    g = torch.Generator().manual_seed(4)
    readout = Readout("linear", H, OUT)
    mask = torch.tensor(MASKS["some"])
    h, y = torch.randn(B, H, generator=g), targets("real", torch.float32, mask, g)
    expected = readout_step(readout, h, y, mask, "mse", B)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = readout_step(readout, h, y, mask, "mse", B)
    for a, b in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]], strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bad_loss_is_a_clear_error():
    readout, h, mask = Readout("units", H, OUT), torch.zeros(B, H), torch.ones(B, dtype=torch.bool)
    with pytest.raises(ValueError, match="loss must be 'mse' or 'cross_entropy'"):
        readout_step(readout, h, torch.zeros(B, OUT), mask, "hinge", B)
    with pytest.raises(ValueError, match="float"):
        readout_step(readout, h, torch.zeros(B, dtype=torch.long), mask, "mse", B)


@pytest.mark.parametrize("loss, soft", [("mse", False), ("cross_entropy", False), ("cross_entropy", True)])
def test_module_trains_as_with_the_autograd_readout(loss, soft, tmp_path, monkeypatch):
    """A short fit with the closed form against the same fit with the autograd readout, in float64: in float32 the
    two differ by rounding that UORO's four updates amplify to ~1e-6, past any tolerance that is not the CPU's."""
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        initial = {n: p.detach().clone() for n, p in model("uoro", loss=loss).named_parameters()}
        fitted = []
        for step in (readout_step, autograd_step):
            monkeypatch.setattr(online_rnn_module, "readout_step", step)
            torch.manual_seed(0)
            module = model("uoro", loss=loss, update_every=2, optimizer="sgd", lr=0.5)  # sgd: not scale-free
            data = TinyStreams(streams=3, steps=4, chunks_per_epoch=2, loss=loss, soft=soft)
            trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, data)
            assert module.global_step == 4
            fitted.append({n: p.detach().clone() for n, p in module.named_parameters()})
    finally:
        torch.set_default_dtype(torch.float32)
    for name, p in fitted[0].items():
        assert p.dtype == torch.float64, name
        torch.testing.assert_close(p, fitted[1][name], rtol=1e-12, atol=1e-12, msg=name)
        assert (p - initial[name]).abs().max() > 1e-3, name  # every parameter moved: the fits did train


@pytest.mark.parametrize("what", ["nan_h", "out_of_range_class", "too_large", "strided_h", "float32_targets"])
def test_the_c_pass_declines_and_the_pytorch_ops_answer(what, kernel_runs):
    """Where the C pass does not apply (too large, strided, mixed dtypes) or its loss is not finite (NaN in h, a
    scored class out of range), readout_step gives exactly what the PyTorch ops give: their NaN, their error."""
    g = torch.Generator().manual_seed(5)
    readout = Readout("linear", H, OUT).double()
    mask = torch.ones(B, dtype=torch.bool)
    h = torch.randn(B, H, generator=g, dtype=torch.float64)
    y, loss = torch.randint(0, OUT, (B,), generator=g), "cross_entropy"
    if what == "nan_h":
        h[2, 3] = float("nan")
    elif what == "out_of_range_class":
        y[1] = OUT
    elif what == "too_large":
        wide = LARGEST_PRODUCT // (B * OUT) + 1
        readout, h = Readout("linear", wide, OUT).double(), torch.randn(B, wide, generator=g, dtype=torch.float64)
    elif what == "strided_h":
        h = torch.randn(B, 2 * H, generator=g, dtype=torch.float64)[:, ::2]
    else:
        y, loss = torch.randn(B, OUT, generator=g), "mse"  # float32 targets of a float64 readout
    c_pass = linear_readout_kernel(h) is not None  # the kernels on (LIGHTNING_ORTHO_NATIVE) and built
    if what == "out_of_range_class":
        with pytest.raises((IndexError, RuntimeError)):
            step_with(False, readout, h, y, mask, loss, B)
        with pytest.raises((IndexError, RuntimeError)):
            readout_step(readout, h, y, mask, loss, B)
        assert kernel_runs == ([False] if c_pass else [])
        return
    expected = step_with(False, readout, h, y, mask, loss, B)
    got = readout_step(readout, h, y, mask, loss, B)
    assert kernel_runs == ([False] if what == "nan_h" and c_pass else [])
    for a, b in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    if what == "nan_h":
        assert got[0].isnan() and got[1][2].isnan().all()


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_shapes_propagate_on_meta(loss):
    """Shape inference (deferred initialisation): the same shapes and dtypes as on the CPU, all on meta."""

    def run(device):
        torch.manual_seed(0)
        with torch.device(device):
            readout = nn.Linear(6, 4)
            h = torch.randn(3, 6)
            y = torch.randn(3, 4) if loss == "mse" else torch.zeros(3, dtype=torch.long)
            mask = torch.ones(3, dtype=torch.bool)
        loss_sum, grad_h, grads = readout_step(readout, h, y, mask, loss, 3)
        tensors = [loss_sum, grad_h, *grads]
        return [(tuple(t.shape), t.dtype) for t in tensors], {t.device.type for t in tensors}

    meta, devices = run("meta")
    assert devices == {"meta"} and meta == run("cpu")[0]
