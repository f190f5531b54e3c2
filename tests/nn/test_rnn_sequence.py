"""The fused sequence of ``OrthogonalRNN(transition="aux")``: the same outputs and gradients as the cell run step by
step through autograd (float64), taken exactly when it can be, and every other sequence handed to the cell loop."""

import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import lightning_ortho.nn.rnn_sequence as sequence_module
from lightning_ortho.nn import finite_checks
from lightning_ortho.nn.rnn import OrthogonalRNN

DTYPE = torch.float64


@pytest.fixture
def fused_calls(monkeypatch):
    """How many sequences the fused Function ran, and how many of its results were kept."""
    calls = {"ran": 0, "kept": 0}
    apply, checked = sequence_module._AuxiliaryRNNSequence.apply, sequence_module.auxiliary_rnn_sequence

    def counting_apply(*args):
        calls["ran"] += 1
        return apply(*args)

    def counting_check(*args, **kwargs):
        result = checked(*args, **kwargs)
        calls["kept"] += result is not None
        return result

    monkeypatch.setattr(sequence_module._AuxiliaryRNNSequence, "apply", counting_apply)
    monkeypatch.setattr("lightning_ortho.nn.rnn.auxiliary_rnn_sequence", counting_check)
    return calls


def make_rnn(input_size=2, hidden=6, seed=0, **kwargs) -> OrthogonalRNN:
    torch.manual_seed(seed)
    return OrthogonalRNN(input_size, hidden, **kwargs).to(DTYPE)


def outputs_and_gradients(rnn, x, h0=None, *, fused, use=("outputs", "last")):
    """Outputs, last state and the gradients of a loss on them w.r.t. x, h0 (when given) and every parameter."""
    rnn.fused_sequence = fused
    outputs, last = rnn(x, h0)
    generator = torch.Generator().manual_seed(1)
    loss = 0.0
    if "outputs" in use:
        loss = loss + (outputs * torch.randn(outputs.shape, dtype=DTYPE, generator=generator)).sum()
    if "last" in use:
        loss = loss + last.pow(3).sum()
    inputs = [t for t in (x, h0, *rnn.parameters()) if t is not None and t.requires_grad]
    return (outputs, last, *torch.autograd.grad(loss, inputs, allow_unused=True))


def assert_same(fused, stepwise):
    for a, b in zip(fused, stepwise, strict=True):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("nonlinearity", ["modrelu", "tanh"])
@pytest.mark.parametrize("input_size,steps", [(1, 1), (3, 7)])
@pytest.mark.parametrize("use", [("outputs", "last"), ("last",), ("outputs",)])
def test_fused_sequence_equals_the_cell_step_by_step(nonlinearity, input_size, steps, use, fused_calls):
    rnn = make_rnn(input_size, nonlinearity=nonlinearity)
    x = torch.randn(4, steps, input_size, dtype=DTYPE, requires_grad=True)
    fused = outputs_and_gradients(rnn, x, fused=True, use=use)
    assert fused_calls == {"ran": 1, "kept": 1}
    stepwise = outputs_and_gradients(rnn, x, fused=False, use=use)
    assert fused_calls["ran"] == 1
    assert fused[0].shape == (4, steps, 6) and fused[0].is_contiguous()
    assert_same(fused, stepwise)


@pytest.mark.parametrize("start", ["random", "zero", "some_zero_rows"])
def test_a_given_initial_state_including_zeros_is_exact(start, fused_calls):
    rnn = make_rnn(seed=1)
    x = torch.randn(3, 5, 2, dtype=DTYPE)
    h0 = torch.randn(3, 6, dtype=DTYPE)
    if start == "zero":
        h0 = torch.zeros_like(h0)
    elif start == "some_zero_rows":
        h0[1] = 0.0
    h0.requires_grad_(True)
    fused = outputs_and_gradients(rnn, x, h0, fused=True)
    assert fused_calls["kept"] == 1  # a zero state is H(0) := I, exactly, inside the fused path
    assert_same(fused, outputs_and_gradients(rnn, x, h0, fused=False))


def test_a_badly_scaled_state_goes_step_by_step(fused_calls):
    rnn = make_rnn(seed=2)
    x = torch.randn(3, 4, 2, dtype=DTYPE)
    h0 = torch.randn(3, 6, dtype=DTYPE)
    h0[2] *= 1e-170  # non-zero, but its ||W h||^2 underflows: the cell rescales it
    fused = outputs_and_gradients(rnn, x, h0, fused=True)
    assert fused_calls == {"ran": 1, "kept": 0}
    assert_same(fused, outputs_and_gradients(rnn, x, h0, fused=False))


def test_invertible_transition_gradients_reach_its_factor(fused_calls):
    rnn = make_rnn(seed=3, invertible=True)
    x = torch.randn(2, 4, 2, dtype=DTYPE)
    fused = outputs_and_gradients(rnn, x, fused=True)
    assert fused_calls["kept"] == 1
    assert_same(fused, outputs_and_gradients(rnn, x, fused=False))


def test_second_derivatives(fused_calls):
    rnn = make_rnn(1, 4, seed=4)
    x = torch.randn(2, 3, 1, dtype=DTYPE, requires_grad=True)
    names = [name for name, _ in rnn.named_parameters()]

    def run(x, *params):
        outputs, last = torch.func.functional_call(rnn, dict(zip(names, params, strict=True)), (x,))
        return outputs.sum(1), last

    params = [p.detach().clone().requires_grad_(True) for p in rnn.parameters()]
    assert torch.autograd.gradgradcheck(run, (x, *params))
    assert fused_calls["kept"] > 0


def test_torch_func_and_forward_mode_go_step_by_step_and_agree(fused_calls):
    rnn = make_rnn(seed=5)
    x = torch.randn(2, 3, 2, dtype=DTYPE)
    params = {name: p.detach() for name, p in rnn.named_parameters()}

    def loss(p):
        return torch.func.functional_call(rnn, p, (x,))[1].pow(3).sum()

    grads = torch.func.grad(loss)(params)
    rnn(x)[1].pow(3).sum().backward()
    assert fused_calls == {"ran": 1, "kept": 1}
    for name, p in rnn.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-12)
    tangent = torch.randn_like(x)
    with fwAD.dual_level():
        last_t = fwAD.unpack_dual(rnn(fwAD.make_dual(x, tangent))[1]).tangent
    assert fused_calls["ran"] == 1
    _, expected = torch.func.jvp(lambda x: torch.func.functional_call(rnn, params, (x,))[1], (x,), (tangent,))
    torch.testing.assert_close(last_t, expected)


def test_nan_in_the_input_or_a_parameter_is_named():
    rnn = OrthogonalRNN(1, 5)
    with pytest.raises(ValueError, match="OrthogonalRNN: x contains NaN"):
        rnn(torch.full((2, 3, 1), math.nan))
    with torch.no_grad():
        rnn.cell.input_kernel.weight[2, 0] = math.nan
    # One step: the NaN reaches only h_1, which no later reflection would see; the parameter is named.
    with pytest.raises(ValueError, match=r"OrthogonalRNN: cell\.input_kernel\.weight contains NaN"):
        rnn(torch.rand(2, 1, 1))
    with finite_checks(False):  # unchecked: the NaN flows through, as in every layer
        assert torch.isnan(rnn(torch.rand(2, 3, 1))[1]).any()


def test_unchecked_sequences_stay_fused(fused_calls):
    rnn = make_rnn(seed=6)
    x = torch.randn(2, 4, 2, dtype=DTYPE)
    with finite_checks(False):
        fused = outputs_and_gradients(rnn, x, fused=True)
    assert fused_calls["ran"] == 1
    assert_same(fused, outputs_and_gradients(rnn, x, fused=False))


def test_half_precision_and_autocast_go_step_by_step(fused_calls):
    rnn = OrthogonalRNN(1, 5)
    x = torch.rand(2, 3, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rnn(x)
    rnn.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert fused_calls["ran"] == 0


def test_inference_keeps_nothing_per_step_and_agrees(fused_calls):
    rnn = make_rnn(seed=7)
    x = torch.randn(2, 5, 2, dtype=DTYPE)
    with torch.no_grad():
        outputs, last = rnn(x)
    assert fused_calls["kept"] == 1 and not outputs.requires_grad
    rnn.fused_sequence = False
    expected = rnn(x)
    torch.testing.assert_close(outputs, expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, expected[1], rtol=1e-12, atol=1e-12)
