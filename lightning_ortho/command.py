"""The ``lightning-ortho`` console script. It imports the command (and with it the Lightning package that
``LIGHTNING_ORTHO_LIGHTNING`` or the installed packages choose) only when it runs, so that a bad choice ends in one
line and exit status 2, like the command's other user errors, instead of a traceback from an import.

``lightning-ortho recipes`` lists the shipped recipes (without importing Lightning); in every other command a
``--config`` that names a shipped recipe runs it (:mod:`lightning_ortho.shipped_recipes`)."""

from __future__ import annotations

import sys

from lightning_ortho._lightning_choice import LightningChoiceError
from lightning_ortho.shipped_recipes import (
    RecipeNotFoundError,
    recipe_folder,
    recipe_names,
    recipe_summary,
    resolve_config_arguments,
)


def main(args: list[str] | None = None) -> None:
    """Run :func:`lightning_ortho.cli.main` (``args`` replaces ``sys.argv[1:]``), or list the recipes
    (``lightning-ortho recipes``)."""
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["recipes"]:
        print_recipes()
        return
    # The Lightning package first: without one, no recipe could run.
    try:
        from lightning_ortho.cli import main as run
    except LightningChoiceError as error:
        print(f"Lightning package not available. {error}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        args = resolve_config_arguments(args)
    except RecipeNotFoundError as error:
        print(f"Recipe not found. {error}", file=sys.stderr)
        raise SystemExit(2) from None
    run(args)


def print_recipes() -> None:
    """One line per shipped recipe: its name and what it runs."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lightning-ortho recipes ({recipe_folder()})", title_justify="left")
    table.add_column("recipe", no_wrap=True)
    table.add_column("what it runs")
    for name in recipe_names():
        table.add_row(name, recipe_summary(name))
    console = Console()
    console.print(table)
    console.print("Run one with: lightning-ortho fit --config NAME   (a path to a YAML file works too)")


if __name__ == "__main__":
    main()
