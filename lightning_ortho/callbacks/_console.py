"""Printing the end-of-fit tables whole: a rich table as wide as it needs, not cut at the terminal's width or at the
80 columns rich assumes when output goes to a pipe or a log file."""

from __future__ import annotations

from typing import Any


def wide_console(table: Any) -> Any:
    """A ``rich.console.Console`` at least as wide as ``table`` (a ``rich.table.Table``) needs to print unwrapped."""
    from rich.console import Console

    width = max(Console().width, Console(width=10_000).measure(table).maximum)
    return Console(width=width)
