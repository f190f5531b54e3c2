"""The trainable parameters a gradient monitor reads, in groups (one per watched submodule), and whether the model
still has those parameters: layers replaced during a fit (TransformCompression) bring new ones."""

from __future__ import annotations

import torch
from torch import nn


class WatchedParameters:
    """The model's trainable parameters by name, grouped by watched submodule, as they were at :meth:`build`.

    The parameters are held (until :meth:`release`), so no new tensor can take the id of a replaced one: a trainable
    parameter whose id is unknown is certainly new. :meth:`read` costs one dict lookup per parameter an optimizer
    steps (what reading the gradients costs anyway) and says when it holds an unknown trainable parameter;
    :meth:`changed` then decides with one pass over the model's parameters.

    Attributes:
        groups: ``{group: [parameter names]}``, a watched submodule's trainable parameters.
        params: ``{name: parameter}``, every trainable parameter of the model.
    """

    def __init__(self) -> None:
        self.groups: dict[str, list[str]] = {}
        self.params: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}  # id(parameter) -> name
        self._foreign: set[int] = set()  # ids of optimizer parameters that are not the model's trainable ones

    def build(self, model: nn.Module, watched: dict[str, nn.Module]) -> tuple[list[str], list[str]]:
        """The groups of the ``watched`` submodules, from ``model``'s trainable parameters as they are now; the
        names of the parameters that are new and gone since the last build (other tensors under a name count as
        both)."""
        before = self.params
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._names = {id(p): n for n, p in self.params.items()}
        self._foreign = set()
        self.groups = {
            group: [self._names[id(p)] for p in module.parameters() if id(p) in self._names]
            for group, module in watched.items()
        }
        new = [n for n, p in self.params.items() if before.get(n) is not p]
        return new, [n for n, p in before.items() if self.params.get(n) is not p]

    def release(self) -> None:
        """Stop holding the parameters (after a fit; :meth:`build` again before reading)."""
        self.params, self._names = {}, {}

    def changed(self, model: nn.Module) -> bool:
        """Whether ``model``'s trainable parameters are other tensors (or have other names) than those built."""
        current = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return len(current) != len(self.params) or any(self.params.get(n) is not p for n, p in current)

    def read(self, optimizer: torch.optim.Optimizer) -> tuple[list[str], list[torch.Tensor], bool]:
        """``(names, gradients, suspect)`` of the known parameters ``optimizer`` steps (a missing gradient as
        zeros, a sparse one dense). ``suspect``: it holds a trainable parameter not known (nor known to be its
        own): the model's may have changed, ask :meth:`changed`."""
        names, grads, unknown = [], [], False
        for group in optimizer.param_groups:
            for p in group["params"]:
                name = self._names.get(id(p))
                if name is not None:
                    names.append(name)
                    grads.append(_dense_gradient(p))
                elif p.requires_grad and id(p) not in self._foreign:
                    unknown = True
        return names, grads, unknown

    def accept(self, optimizer: torch.optim.Optimizer) -> None:
        """After :meth:`changed` said no: ``optimizer``'s unknown parameters are its own (not the model's trainable
        ones), and :meth:`read` is not suspect of them again."""
        self._foreign.update(id(p) for g in optimizer.param_groups for p in g["params"] if id(p) not in self._names)


def _dense_gradient(p: torch.Tensor) -> torch.Tensor:
    """``p.grad`` (zeros where there is none; sparse gradients made dense)."""
    if p.grad is None:
        return torch.zeros_like(p)
    return p.grad.detach().to_dense() if p.grad.is_sparse else p.grad.detach()


def some(names: list[str]) -> str:
    """At most three names, and how many more (``"none"`` for none)."""
    return (", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")) or "none"
