"""Which submodules a monitor watches: those it names (by name or class) or, by default, those it can measure."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn


def outermost_modules(pl_module: nn.Module, predicate: Callable[[nn.Module], bool]) -> Iterable[tuple[str, nn.Module]]:
    """``(name, module)`` for the submodules (not ``pl_module`` itself) that satisfy ``predicate`` and lie inside no
    other such submodule: a flow is watched as one map, not also layer by layer (name the layers to watch them)."""
    taken: list[str] = []
    for name, module in pl_module.named_modules():
        if name and not any(name.startswith(outer + ".") for outer in taken) and predicate(module):
            taken.append(name)
            yield name, module


def select_modules(monitor: Any, pl_module: nn.Module) -> dict[str, nn.Module]:
    """The modules ``monitor`` watches by name: every one of its ``candidates`` when its ``modules`` is ``None``,
    else the named ones and every module of a named class, each checked by its ``can_measure``.

    Raises:
        ValueError: no module matches, or a named module does not exist or cannot be measured.
    """
    owner = type(monitor).__name__
    available = dict(monitor.candidates(pl_module))
    if monitor.modules is None:
        chosen = available
    else:
        chosen = {}
        names = dict(pl_module.named_modules())
        for entry in monitor.modules:
            if isinstance(entry, str):
                if entry not in names:
                    hint = ""
                    if "." in entry and entry.rpartition(".")[2][:1].isupper():
                        hint = (
                            f" To watch a class, pass the class itself (modules=[{entry.rpartition('.')[2]}]), "
                            "not its import path; a YAML config's `modules: [torch.nn.Linear]` is resolved to "
                            "the class (check the path if it was not)."
                        )
                    raise ValueError(
                        f"{owner}: {type(pl_module).__name__} has no submodule {entry!r}. Modules it can measure: "
                        f"{sorted(available) or 'none'}.{hint}"
                    )
                reason = monitor.can_measure(names[entry])
                if reason is not None:
                    raise ValueError(f"{owner}: cannot monitor {entry!r}: {reason}")
                chosen[entry] = names[entry]
            else:
                matches = {n: m for n, m in names.items() if isinstance(m, entry) and n}
                if not matches:
                    raise ValueError(f"{owner}: {type(pl_module).__name__} has no {entry.__name__} submodule.")
                for name, module in matches.items():
                    reason = monitor.can_measure(module)
                    if reason is not None:
                        raise ValueError(f"{owner}: cannot monitor {name!r}: {reason}")
                    chosen[name] = module
    if not chosen:
        raise ValueError(
            f"{owner}: {type(pl_module).__name__} has no module this monitor can measure; pass modules=[...] "
            f"naming them, or remove the callback."
        )
    return chosen
