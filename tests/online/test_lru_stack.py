"""OnlineLRUStack (Zucchet et al. 2023, "Online learning of long-range dependencies") against autograd in float64.

The online estimate of ``d/dtheta sum_t L_t`` keeps, for block ``l``'s recurrent parameters, the paths through block
``l``'s own recurrence and then up through the blocks above at one step; for every other parameter, the paths inside
one step. The independent reference (:func:`approximation_reference`) unrolls the model with autograd and cuts the
other paths by detaching states: in :func:`unrolled_loss`, block ``k``'s state ``h^k_{t-1}`` enters step ``t``
detached unless ``k`` is in ``through_time`` (same values, fewer gradient paths). Detaching every block's state
leaves exactly the within-step paths (the immediate gradients, with the errors backpropagated through the blocks
above at that step); keeping only block ``l``'s attached adds the paths through block ``l``'s recurrence, and no
other, for block ``l``'s recurrent parameters (nothing below block ``l`` depends on them, and every recurrence above
is cut). Keeping every state attached is backprop through time (BPTT).
"""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F

from lightning_ortho.online.lru_stack import STATE_PARAMETERS, LRUStack, OnlineLRUStack

DTYPE = torch.float64
INPUT, HIDDEN, MODEL, OUTPUT, T, B = 3, 4, 5, 2, 7, 3
TOL = dict(rtol=1e-10, atol=1e-12)


def make_model(layers: int, seed: int = 0) -> LRUStack:
    torch.manual_seed(seed)
    return LRUStack(INPUT, HIDDEN, OUTPUT, layers, model_size=MODEL, r_min=0.6, r_max=0.95, max_phase=math.pi).to(DTYPE)


def data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, INPUT, generator=g, dtype=DTYPE), torch.randn(T, B, OUTPUT, generator=g, dtype=DTYPE)


def unrolled_loss(model, xs, targets, through_time, resets=None) -> torch.Tensor:
    """``sum_t 0.5 |y_t - target_t|^2``; ``h^k_{t-1}`` enters step ``t`` detached unless ``k in through_time``;
    ``resets`` ``{t: mask}`` zeroes the masked streams' states before step ``t``."""
    states, total = model.initial_states(B), 0.0
    for t, x in enumerate(xs):
        if resets and t in resets:
            states = [torch.where(resets[t][:, None], torch.zeros_like(h), h) for h in states]
        states = [h if k in through_time else h.detach() for k, h in enumerate(states)]
        y, states = model.step(x, states)
        total = total + 0.5 * ((y - targets[t]) ** 2).sum()
    return total


def grads_of(loss, model) -> dict[str, torch.Tensor]:
    names, params = zip(*model.named_parameters(), strict=True)
    return dict(zip(names, torch.autograd.grad(loss, params, allow_unused=True), strict=True))


def bptt(model, xs, targets, resets=None) -> dict[str, torch.Tensor]:
    return grads_of(unrolled_loss(model, xs, targets, range(len(model.layers)), resets), model)


def approximation_reference(model, xs, targets, resets=None) -> dict[str, torch.Tensor]:
    """Zucchet et al.'s gradient by autograd (module docstring): every state detached for the immediate gradients,
    only block ``l``'s state attached for block ``l``'s recurrent parameters."""
    expected = grads_of(unrolled_loss(model, xs, targets, (), resets), model)
    for layer in range(len(model.layers)):
        own = grads_of(unrolled_loss(model, xs, targets, (layer,), resets), model)
        for name in STATE_PARAMETERS:
            key = f"layers.{layer}.lru.{name}"
            expected[key] = own[key]
    return expected


def online(model, xs, targets, resets=None, use_backward=False, closed_form=True):
    """``sum_t`` of the online gradients of ``L_t = 0.5 |y_t - target_t|^2``, the outputs and the final state."""
    est = OnlineLRUStack(model, closed_form=closed_form)
    state, total, ys = est.initial_state(B), None, []
    model.zero_grad(set_to_none=True)
    for t, x in enumerate(xs):
        if resets and t in resets:
            state = est.reset(state, resets[t])
        y, state = est.step(x, state)
        ys.append(y.detach())
        if use_backward:
            est.backward(state, 0.5 * ((y - targets[t]) ** 2).sum())
        else:
            step = est.gradient(state, y.detach() - targets[t])
            total = step if total is None else {k: total[k] + step[k] for k in step}
    if use_backward:
        total = {name: p.grad for name, p in model.named_parameters()}
    return total, torch.stack(ys), state


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# -- the gradient --------------------------------------------------------------------------------------------------
def test_one_block_equals_bptt_from_the_state_up():
    model = make_model(1)
    xs, targets = data()
    got, _, _ = online(model, xs, targets)
    full, reference = bptt(model, xs, targets), approximation_reference(model, xs, targets)
    before_the_state = {"encoder.weight", "encoder.bias", "layers.0.norm.weight", "layers.0.norm.bias"}
    for name, value in got.items():
        torch.testing.assert_close(value, reference[name], **TOL)
        if name in before_the_state:  # they feed the recurrence: their gradient is the immediate one only
            assert relative_difference(value, full[name]) > 1e-2, name
        else:  # the LRU's recurrent parameters (exact RTRL), C, D, the MLP and the decoder: exactly BPTT
            assert full[name].abs().max() > 0, name
            torch.testing.assert_close(value, full[name], **TOL)


@pytest.mark.parametrize("layers", [2, 3])
def test_stacks_equal_the_approximation_and_differ_from_bptt(layers):
    model = make_model(layers)
    xs, targets = data()
    got, _, _ = online(model, xs, targets)
    full, reference = bptt(model, xs, targets), approximation_reference(model, xs, targets)
    assert list(got) == [name for name, _ in model.named_parameters()]
    for name, value in got.items():
        torch.testing.assert_close(value, reference[name], **TOL)
    top = f"layers.{layers - 1}."
    for name, value in got.items():
        if name.startswith(top) and not name.startswith(top + "norm") or name.startswith("decoder"):
            torch.testing.assert_close(value, full[name], **TOL)  # nothing above them runs through time
    for layer in range(layers - 1):  # the lower blocks' recurrent parameters miss the paths through later blocks
        keys = [f"layers.{layer}.lru.{name}" for name in STATE_PARAMETERS]
        mine, exact = (torch.cat([grads[k].flatten() for k in keys]) for grads in (got, full))
        assert relative_difference(mine, exact) > 1e-3, layer  # 1e8 times the tolerance of the equalities


def test_backward_accumulates_the_gradients_and_torch_func_traces_agree():
    model = make_model(2)
    xs, targets = data()
    summed, _, _ = online(model, xs, targets)
    accumulated, _, _ = online(model, xs, targets, use_backward=True)
    torch_func, _, _ = online(model, xs, targets, closed_form=False)
    for name, value in summed.items():
        torch.testing.assert_close(accumulated[name], value, **TOL)
        torch.testing.assert_close(torch_func[name], value, **TOL)


def test_outputs_are_the_full_sequence_forward_and_no_grad_only_advances():
    model = make_model(2)
    xs, targets = data()
    _, ys, state = online(model, xs, targets)
    with torch.no_grad():
        expected, final = model(xs)
    torch.testing.assert_close(ys, expected, rtol=0, atol=1e-14)
    for h, h_ref in zip(state.h, final, strict=True):
        torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-14)
    est = OnlineLRUStack(model)
    state = est.initial_state(B)
    with torch.no_grad():
        y, state = est.step(xs[0], state)
    assert not y.requires_grad and state.step == 1
    torch.testing.assert_close(y, expected[0], rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="no step to differentiate.*no_grad"):
        est.gradient(state, targets[0])


def test_block_is_the_documented_layer():
    model = make_model(1)
    block, (x, _) = model.layers[0], data()
    u = model.encoder(x[0])
    h = torch.complex(*torch.randn(2, B, HIDDEN, dtype=DTYPE))
    with torch.no_grad():
        z = (u - u.mean(-1, keepdim=True)) / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + 1e-5)
        z = z * block.norm.weight + block.norm.bias
        lru = block.lru
        lam = torch.exp(-torch.exp(lru.nu_log) + 1j * torch.exp(lru.theta_log))
        h_new = lam * h + torch.exp(lru.gamma_log) * (z.to(h.dtype) @ torch.complex(lru.B_re, lru.B_im).T)
        v = (h_new @ torch.complex(lru.C_re, lru.C_im).T).real + lru.D * z
        first, second = block.mlp[0], block.mlp[2]
        out = u + F.linear(F.gelu(F.linear(v, first.weight, first.bias)), second.weight, second.bias)
        got_u, got_h = block(u, h)
    torch.testing.assert_close(got_h, h_new, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_u, out, rtol=1e-12, atol=1e-12)


# -- resets and checkpoints ----------------------------------------------------------------------------------------
def test_resets_of_some_streams_equal_the_reference():
    model = make_model(2)
    xs, targets = data()
    resets = {3: torch.tensor([True, False, True]), 5: torch.tensor([False, True, False])}
    got, _, _ = online(model, xs, targets, resets=resets)
    reference = approximation_reference(model, xs, targets, resets=resets)
    for name, value in got.items():
        torch.testing.assert_close(value, reference[name], **TOL)
    est = OnlineLRUStack(model)
    y, state = est.step(xs[0], est.initial_state(B))
    state = est.reset(state, torch.tensor([False, False, False]))
    with pytest.raises(ValueError, match="reset or loaded since"):
        est.gradient(state, y.detach())


def test_state_dict_round_trip_resumes_exactly():
    model = make_model(2)
    xs, targets = data()
    est = OnlineLRUStack(model)
    state = est.initial_state(B)
    for t in range(3):
        _, state = est.step(xs[t], state)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    resumed = est.initial_state(B)
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.step == 3
    with pytest.raises(ValueError, match="no step to differentiate"):
        est.gradient(resumed, targets[0])
    for t in range(3, T):
        y, state = est.step(xs[t], state)
        y2, resumed = est.step(xs[t], resumed)
        assert torch.equal(y, y2)
        a, b = est.gradient(state, y.detach() - targets[t]), est.gradient(resumed, y2.detach() - targets[t])
        assert all(torch.equal(a[k], b[k]) for k in a)
    for mine, theirs in zip(state.layers, resumed.layers, strict=True):
        assert torch.equal(mine.h, theirs.h) and all(torch.equal(v, theirs.tensors[k]) for k, v in mine.tensors.items())


def test_load_refuses_what_does_not_fit_and_leaves_the_state_as_it_was():
    est = OnlineLRUStack(make_model(2))
    xs, _ = data()
    _, state = est.step(xs[0], est.initial_state(B))
    saved = state.state_dict()
    target = est.initial_state(B)
    with pytest.raises(ValueError, match="saved state has 1 blocks, this one 2"):
        target.load_state_dict({**saved, "layers": saved["layers"][:1]})
    with pytest.raises(ValueError, match="expected LRUStackState.state_dict"):
        target.load_state_dict(saved["layers"][0])
    with pytest.raises(ValueError, match="saved hidden states h"):
        OnlineLRUStack(make_model(2)).initial_state(B + 1).load_state_dict(saved)
    saved["layers"][1]["tensors"]["e_B"][0, 0, 0] = complex(float("nan"), 0.0)  # the first block would load
    with pytest.raises(ValueError, match="NaN"):
        target.load_state_dict(saved)
    assert target.step == 0 and all(not h.any() for h in target.h)


# -- refusals ------------------------------------------------------------------------------------------------------
def test_bad_inputs_are_refused():
    model = make_model(2)
    est = OnlineLRUStack(model)
    state = est.initial_state(B)
    x = torch.randn(B, INPUT, dtype=DTYPE)
    with pytest.raises(ValueError, match=r"x must have shape \(3, 3\)"):
        est.step(x[:, :2], state)
    with pytest.raises(ValueError, match="x is torch.float32.*model.double"):
        est.step(x.float(), state)
    with pytest.raises(ValueError, match="x holds NaN"):
        est.step(torch.full_like(x, math.nan), state)
    with pytest.raises(ValueError, match="LRUStackState of 2 blocks"):
        est.step(x, OnlineLRUStack(make_model(1)).initial_state(B))
    y, state = est.step(x, state)
    with pytest.raises(ValueError, match=r"grad_y must have shape \(3, 2\)"):
        est.gradient(state, torch.zeros(B, OUTPUT + 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="grad_y holds NaN"):
        est.gradient(state, torch.full((B, OUTPUT), math.inf, dtype=DTYPE))
    with pytest.raises(ValueError, match="does not depend on the y_t"):
        est.backward(state, (x**2).sum().requires_grad_())
    with pytest.raises(ValueError, match="scalar tensor"):
        est.backward(state, y)
    with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \(3,\)"):
        est.reset(state, torch.ones(B))
    with pytest.raises(ValueError, match="num_threads must be 'auto'"):
        est.num_threads = 0
    est.num_threads, threads = 1, torch.get_num_threads()
    est.step(x, est.initial_state(B))
    assert torch.get_num_threads() == threads  # given back after the call
    with pytest.raises(TypeError, match="must be an LRUStack"):
        OnlineLRUStack(model.layers[0])
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        LRUStack(INPUT, HIDDEN, OUTPUT, 0)
    with pytest.raises(ValueError, match=r"xs must have shape \(T, B >= 1, 3\)"):
        model(x)


# -- learning ------------------------------------------------------------------------------------------------------
def test_online_training_learns_a_delay_task():
    """Recall the input of ``delay`` steps ago: ``target_t = x_{t - delay}``, ``x ~ N(0, 1)`` i.i.d., so any model
    without memory has an expected squared error of at least ``E[x^2] = 1``. After 300 online Adam steps on 16
    streams the error over the last 50 steps is below 0.3 of that (seeds 0-9 all reach 0.02-0.11)."""
    torch.manual_seed(0)
    delay, steps, streams = 3, 300, 16
    model = LRUStack(1, 16, 1, 2, model_size=8, r_min=0.5, r_max=0.9, max_phase=math.pi).to(DTYPE)
    est = OnlineLRUStack(model)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    xs = torch.randn(steps + delay, streams, 1, generator=torch.Generator().manual_seed(100), dtype=DTYPE)
    state, errors, chance = est.initial_state(streams), [], []
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the whole run, as OnlineRNNModule does: tiny operations (1.4 s here, 12-40 s on two
    try:  # threads of a busy 2-core machine)
        for t in range(steps):
            y, state = est.step(xs[t + delay], state)
            loss = ((y - xs[t]) ** 2).mean()
            optimiser.zero_grad()
            est.backward(state, loss)
            optimiser.step()
            errors.append(loss.item())
            chance.append(float((xs[t] ** 2).mean()))
    finally:
        torch.set_num_threads(previous)
    assert sum(errors[-50:]) < 0.3 * sum(chance[-50:])
