"""A counter of host synchronisations, for tests: every read of a tensor's value on the host."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Dispatched operators that return a tensor's value to Python (``bool``, ``item``, ``int``, ``float``, ``==``).
SYNCING_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
}


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as c: ...`` lists in ``c.reads`` every host read made inside: the dispatched ones
    (:data:`SYNCING_OPS`) and ``Tensor.tolist``/``Tensor.numpy``, which read memory without dispatching on a CPU
    (on a GPU they copy to the host first: a synchronisation all the same)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self._saved: dict[str, object] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCING_OPS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                self.reads.append(f"Tensor.{_name}")
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return super().__exit__(*exc)
