"""TanhRNNCell's forward in one C call (outside autograd, small sizes, plain CPU tensors) computes the PyTorch
expression ``tanh(W_h h + W_x x + b)``, and every case the kernel must not take goes to the PyTorch ops."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils import parametrize

import lightning_ortho._native.tanh_cell as binding
from lightning_ortho._native import native_kernels
from lightning_ortho._native.fastcall import fastcall
from lightning_ortho.online import TanhRNNCell


@pytest.fixture(autouse=True)
def kernels_on():
    """The kernels on whatever LIGHTNING_ORTHO_NATIVE says (CI runs these files again with it set to 0)."""
    with native_kernels(True):
        yield


class Calls(list):
    """Whether each call of the cell's one-call forward ran the C kernel (true) or declined (false); ``fast``: how
    many of them the common case's C call (``TanhCellForward.fast``) answered, ``whole``: how many of those were the
    cell's whole call (``TanhCellForward.call``: no Python frame of nn.Module's)."""

    fast = 0
    whole = 0


@pytest.fixture
def calls(monkeypatch):
    seen = Calls()
    original, original_arm = binding.TanhCellForward.__call__, binding.TanhCellForward._arm_fast

    def spy(self, parameters, x, h):
        h_new = original(self, parameters, x, h)
        seen.append(h_new is not None)
        return h_new

    def arm_spy(self, *args):
        original_arm(self, *args)
        if self.fast is not None:
            answer = self._fast.forward

            def fast(parameters, x, h):
                h_new = answer(parameters, x, h)
                if h_new is not None:  # else the Python path runs and the spy above records it
                    seen.append(True)
                    seen.fast += 1
                return h_new

            self.fast = fast
        if self.call is not None:  # the cell's whole call in C (the same common case)
            answer_call = self._fast.call

            def call(cell, args):
                h_new = answer_call(cell, args)
                if h_new is not None:
                    seen.append(True)
                    seen.fast += 1
                    seen.whole += 1
                return h_new

            self.call = call

    monkeypatch.setattr(binding.TanhCellForward, "__call__", spy)
    monkeypatch.setattr(binding.TanhCellForward, "_arm_fast", arm_spy)
    return seen


def reference(cell: TanhRNNCell, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h @ cell.weight_hh.T + x @ cell.weight_ih.T + cell.bias)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-14), (torch.float32, 1e-6)])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_kernel_computes_the_cell_step(calls, dtype, tolerance, batch):
    torch.manual_seed(0)
    cell = TanhRNNCell(5, 7).to(dtype)
    x, h = torch.randn(batch, 5, dtype=dtype), torch.randn(batch, 7, dtype=dtype)
    with torch.no_grad():
        out = cell(x, h)
        expected = reference(cell, x, h)
    assert calls == [True]
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)


def test_autograd_parametrised_and_subclassed_cells_take_the_pytorch_ops(calls):
    torch.manual_seed(1)
    cell = TanhRNNCell(4, 6).double()
    x, h = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64)
    out = cell(x, h)  # grad mode: the graph must be recorded
    assert out.requires_grad and calls == []

    class Shifted(TanhRNNCell):
        def activation(self, z):
            return torch.tanh(z + 1)

    shifted = Shifted(4, 6).double()
    shifted.load_state_dict(cell.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(shifted(x, h), torch.tanh(reference(cell, x, h).atanh() + 1))
    assert calls == []

    class Doubled(torch.nn.Module):
        def forward(self, weight):
            return 2 * weight

    parametrize.register_parametrization(cell, "weight_hh", Doubled())
    with torch.no_grad():
        torch.testing.assert_close(cell(x, h), reference(cell, x, h))
    assert calls == [False]  # asked, and declined: weight_hh is no longer a parameter of the cell


def test_the_switch_wrong_shapes_and_large_sizes_take_the_pytorch_ops(calls):
    cell = TanhRNNCell(4, 6).double()
    x, h = torch.randn(1, 4, dtype=torch.float64), torch.randn(1, 6, dtype=torch.float64)
    with torch.no_grad():
        with native_kernels(False):
            cell(x, h)
        assert calls == [False]
        with pytest.raises(RuntimeError):  # PyTorch's own error, never a read past the end
            cell(torch.randn(1, 5, dtype=torch.float64), h)
        wide = TanhRNNCell(8, 512).double()
        wide(torch.randn(1, 8, dtype=torch.float64), torch.randn(1, 512, dtype=torch.float64))
        cell(x.T.contiguous().T, h[:, ::1])  # contiguous views still fit
        with pytest.raises(RuntimeError):  # (4, 1) and (6, 1): the shapes do not fit, PyTorch's ops raise
            cell(x.T, h.T)
    assert calls == [False, False, False, True, False]


def test_nan_reaches_the_output_and_meta_tensors_take_the_pytorch_ops(calls):
    cell = TanhRNNCell(3, 4).double()
    x = torch.tensor([[float("nan"), 0.0, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        assert torch.isnan(cell(x, torch.zeros(1, 4, dtype=torch.float64))).all()
        meta = TanhRNNCell(3, 4).to("meta")
        assert meta(torch.zeros(2, 3, device="meta"), torch.zeros(2, 4, device="meta")).shape == (2, 4)
    assert calls == [True, False]


def test_compiled_forward_traces_the_pytorch_ops_without_a_graph_break(calls):
    torch.manual_seed(2)
    cell = TanhRNNCell(3, 5).double()
    x, h = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)

    def step(x, h):
        with torch.no_grad():
            return cell(x, h)

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, h), reference(cell, x, h).detach())
    assert calls == []  # the compiled region runs the traced PyTorch ops


def test_updated_moved_and_copied_parameters_are_read_afresh(calls):
    """The checks of the parameters are remembered: an update in place is seen (same memory), and new memory
    (``.data`` assigned, a dtype change, a deep copy) is checked again before the kernel reads it."""
    import copy
    import pickle

    torch.manual_seed(3)
    cell = TanhRNNCell(3, 4).double()
    x, h = torch.randn(1, 3, dtype=torch.float64), torch.randn(1, 4, dtype=torch.float64)
    with torch.no_grad():
        cell(x, h)
        cell.weight_hh.mul_(2)  # in place: the remembered addresses still hold it
        torch.testing.assert_close(cell(x, h), reference(cell, x, h), rtol=1e-14, atol=1e-14)
        cell.weight_ih.data = torch.randn(4, 3, dtype=torch.float64)  # new memory
        torch.testing.assert_close(cell(x, h), reference(cell, x, h), rtol=1e-14, atol=1e-14)
        cell.weight_ih.data = torch.randn(3, 4, dtype=torch.float64).T  # not contiguous: declined
        torch.testing.assert_close(cell(x, h), reference(cell, x, h), rtol=1e-14, atol=1e-14)
        cell.weight_ih.data = cell.weight_ih.data.contiguous()
        cell.float()  # new memory in another dtype
        torch.testing.assert_close(cell(x.float(), h.float()), reference(cell, x.float(), h.float()))
        with pytest.raises(RuntimeError):  # h of another dtype: declined, and PyTorch's ops refuse it
            cell(x.float(), h)
        for other in (copy.deepcopy(cell), pickle.loads(pickle.dumps(cell))):
            other.bias.add_(1)
            torch.testing.assert_close(other(x.float(), h.float()), reference(other, x.float(), h.float()))
    assert calls == [True, True, True, False, True, False, True, True]


def test_an_output_fed_back_after_the_parameters_changed_size_is_checked_again(calls):
    torch.manual_seed(4)
    cell = TanhRNNCell(3, 4).double()
    x = torch.randn(1, 3, dtype=torch.float64)
    with torch.no_grad():
        h = cell(x, torch.zeros(1, 4, dtype=torch.float64))
        h = cell(x, h)  # the last output, fed back
        cell.weight_hh = torch.nn.Parameter(torch.randn(6, 6, dtype=torch.float64))
        cell.weight_ih = torch.nn.Parameter(torch.randn(6, 3, dtype=torch.float64))
        cell.bias = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
        with pytest.raises(RuntimeError):  # h (1, 4) no longer fits: never a read past its end
            cell(x, h)
        wide = torch.randn(1, 6, dtype=torch.float64)
        torch.testing.assert_close(cell(x, wide), reference(cell, x, wide), rtol=1e-14, atol=1e-14)
    assert calls == [True, True, False, True]


def test_an_output_fed_back_takes_the_c_call_of_the_common_case_and_equals_the_python_path(calls):
    if fastcall() is None:
        pytest.skip("the extension is not available here (no Python.h or no C compiler): the Python path runs")
    torch.manual_seed(5)
    cell = TanhRNNCell(3, 4).double()
    xs = torch.randn(6, 1, 3, dtype=torch.float64)
    with torch.no_grad():
        h, expected = torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 4, dtype=torch.float64)
        for x in xs:
            h, expected = cell(x, h), reference(cell, x, expected)
            torch.testing.assert_close(h, expected, rtol=1e-14, atol=1e-14)
        assert calls == [True] * 6 and calls.fast == 5  # the first call sets up and arms
        h = cell(xs[0], h.clone())  # not the last output: the Python path checks it (and tells the C call)
        with native_kernels(False):  # the switch: the C call declines on the last output too
            torch.testing.assert_close(cell(xs[1], h), reference(cell, xs[1], h), rtol=1e-14, atol=1e-14)
    assert calls == [True] * 7 + [False] and calls.fast == 5


def test_the_cells_whole_call_is_the_c_call_only_where_nn_modules_call_would_run_forward_alone(calls):
    if fastcall() is None:
        pytest.skip("the extension is not available here (no Python.h or no C compiler): the Python path runs")
    torch.manual_seed(6)
    cell = TanhRNNCell(3, 4).double()
    x = torch.randn(1, 3, dtype=torch.float64)
    module_hooks = torch.nn.modules.module
    seen = []
    with torch.no_grad():
        h = cell(x, torch.zeros(1, 4, dtype=torch.float64))  # sets up: the Python path
        h = cell(x, h)
        assert calls.whole == 1
        hooks = {
            "forward": lambda: cell.register_forward_hook(lambda m, a, o: seen.append("forward")),
            "pre": lambda: cell.register_forward_pre_hook(lambda m, a: seen.append("pre")),
            "backward": lambda: cell.register_full_backward_hook(lambda m, gi, go: None),
            "global": lambda: module_hooks.register_module_forward_hook(lambda m, a, o: seen.append("global")),
            "global pre": lambda: module_hooks.register_module_forward_pre_hook(lambda m, a: seen.append("global pre")),
            "global backward": lambda: module_hooks.register_module_full_backward_hook(lambda m, gi, go: None),
        }
        for name, register in hooks.items():
            handle = register()
            expected = reference(cell, x, h)
            h = cell(x, h)  # nn.Module's call runs the hook; forward is still the C call of the common case
            handle.remove()
            torch.testing.assert_close(h, expected, rtol=1e-14, atol=1e-14, msg=name)
        assert seen == ["forward", "pre", "global", "global pre"]
        assert calls.whole == 1 and calls.fast == 1 + len(hooks)
        h = cell(x, h=h)  # a keyword: nn.Module's call
        assert calls.whole == 1
        cell._compiled_call_impl = lambda *args, **kwargs: "compiled"  # what cell.compile() sets
        assert cell(x, h) == "compiled"
        del cell._compiled_call_impl
        cell.forward = lambda x, h: "the instance's forward"
        assert cell(x, h) == "the instance's forward"
        del cell.forward
        h = cell(x, h)
        assert calls.whole == 2  # back to the whole call in C
    before = len(calls)
    with torch.enable_grad():
        out = cell(x, h)
    assert out.requires_grad and len(calls) == before  # autograd: the PyTorch ops, no C call


def test_a_subclass_with_its_own_forward_runs_it(calls):
    class Doubled(TanhRNNCell):
        def forward(self, x, h):
            return 2 * super().forward(x, h)

    torch.manual_seed(7)
    cell = Doubled(3, 4).double()
    x = torch.randn(1, 3, dtype=torch.float64)
    with torch.no_grad():
        h = cell(x, torch.zeros(1, 4, dtype=torch.float64))
        for _ in range(3):
            expected = 2 * reference(cell, x, h)
            h = cell(x, h)
            torch.testing.assert_close(h, expected, rtol=1e-14, atol=1e-14)
    assert calls.whole == 0


def test_the_float32_kernels_tanh_is_within_an_ulp_of_tanh_rounded_to_float(calls):
    """The float32 kernels compute tanh in double precision with a vectorised exponential (libm's tanhf is one
    scalar call per element): every result within one float ulp of the exact tanh (float64's), NaN stays NaN and
    +-inf give +-1, over a dense range, both tails and the branch point at |z| = 0.01."""
    hidden = 64
    cell = TanhRNNCell(1, hidden).float()
    values = torch.cat(
        [
            torch.linspace(-25, 25, 100_001),
            torch.logspace(-45, 1.5, 10_000),
            -torch.logspace(-45, 1.5, 10_000),
            torch.tensor(
                [0.0, 0.00999, 0.01, 0.0100001, -0.01, 9.01, 20.0, 1e30, -1e30, math.inf, -math.inf, math.nan]
            ),
        ]
    ).float()
    values = torch.cat([values, torch.zeros(-len(values) % hidden)])
    with torch.no_grad():
        cell.weight_hh.zero_()
        cell.weight_ih.zero_()
        results = []
        for chunk in values.view(-1, hidden):  # the preactivation is the bias: tanh of the values
            cell.bias.copy_(chunk)
            results.append(cell(torch.zeros(1, 1), torch.zeros(1, hidden))[0])
    assert all(calls)  # every call the C kernel
    ours, exact = torch.cat(results), torch.tanh(values.double())
    nan = values.isnan()
    assert ours[nan].isnan().all()
    ulp = torch.finfo(torch.float32).eps * exact[~nan].abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert ((ours[~nan].double() - exact[~nan]).abs() <= ulp).all()
    assert ours[values == math.inf].item() == 1.0 and ours[values == -math.inf].item() == -1.0
