"""The recipes that ship inside the package (``lightning_ortho/recipes/*.yaml``, the repository's ``recipes/``), by
name: ``lightning-ortho fit --config fcnn_digits`` runs the installed copy from any directory.

A ``--config`` value is resolved by :func:`resolve_config_arguments`: a file that exists is used as given (a path
always wins); otherwise a bare name (``fcnn_digits``, ``fcnn_digits.yaml``) or a path into a ``recipes`` folder
that is not there (``recipes/fcnn_digits.yaml``, the README's commands run outside the clone) names the shipped
recipe of that name. Paths inside a recipe (``--data.root``'s default ``data``) are relative to the directory the
command runs in, not to the recipe.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: The options whose value is a configuration file.
CONFIG_OPTIONS = ("--config", "-c")


class RecipeNotFoundError(ValueError):
    """A ``--config`` value that is neither a file nor the name of a shipped recipe."""


def recipe_folder() -> Path:
    """The folder of the shipped recipes (inside the installed package)."""
    return Path(str(resources.files("lightning_ortho") / "recipes"))


def recipe_names() -> list[str]:
    """The shipped recipes' names (file names without ``.yaml``), sorted."""
    return sorted(path.stem for path in recipe_folder().glob("*.yaml"))


def recipe_path(name: str) -> Path:
    """The shipped recipe ``name`` (``"fcnn_digits"`` or ``"fcnn_digits.yaml"``).

    Raises:
        RecipeNotFoundError: no shipped recipe has that name (the message lists them).
    """
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    path = recipe_folder() / f"{stem}.yaml"
    if stem not in recipe_names():
        raise RecipeNotFoundError(
            f"{name!r} is neither a file nor a shipped recipe. The shipped recipes are: {', '.join(recipe_names())} "
            "(`lightning-ortho recipes` lists them with what each runs)."
        )
    return path


def recipe_summary(name: str) -> str:
    """The recipe's title: the first line of its header comment (what it trains, on what).

    Raises:
        RecipeNotFoundError: as :func:`recipe_path`.
    """
    first = recipe_path(name).read_text().splitlines()[0]
    return first.lstrip("#").strip()


def resolve_config(value: str) -> str:
    """One ``--config`` value as the command will read it (the module docstring's rule).

    Raises:
        RecipeNotFoundError: a bare name, or a path into a ``recipes`` folder that does not exist, that names no
            shipped recipe.
    """
    path = Path(value)
    if path.exists():
        return value
    bare = len(path.parts) == 1
    in_recipes = len(path.parts) > 1 and path.parent.name == "recipes" and path.suffix in (".yaml", ".yml")
    if bare and path.suffix not in ("", ".yaml"):
        return value  # a file name of another kind: the parser's own "does not exist" applies
    if bare or in_recipes:
        return str(recipe_path(path.name))
    return value


def resolve_config_arguments(args: list[str]) -> list[str]:
    """``args`` with each ``--config``/``-c`` value resolved by :func:`resolve_config` (``--config X`` and
    ``--config=X``).

    Raises:
        RecipeNotFoundError: as :func:`resolve_config`.
    """
    resolved, index = [], 0
    while index < len(args):
        argument = args[index]
        option, equals, value = argument.partition("=")
        if option in CONFIG_OPTIONS and equals:
            resolved.append(f"{option}={resolve_config(value)}")
        elif argument in CONFIG_OPTIONS and index + 1 < len(args):
            resolved += [argument, resolve_config(args[index + 1])]
            index += 1
        else:
            resolved.append(argument)
        index += 1
    return resolved
