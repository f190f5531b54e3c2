"""Griffe extensions for the API reference: the docstrings' Sphinx conventions, read the way mkdocstrings renders.

The docstrings are Google style but keep two Sphinx habits that mkdocstrings does not interpret: roles naming other
objects (``:class:`~lightning_ortho.nn.SVDLinear```, ``:meth:`step```, ``:mod:`lightning_ortho.online```,
``:func:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:``), shown as literal text, and ``#:`` comments documenting
an attribute, which griffe does not read. mkdocstrings-python loads both extensions (``extensions:`` in
``mkdocs.yml``, in this order); once griffe has loaded the package (``on_package``) they rewrite the docstrings,
before mkdocstrings parses or renders any of them.

:class:`SphinxComments` gives an attribute without a docstring the text of the ``#:`` comment lines right above
its assignment (same indentation) or of a ``#:`` comment ending the assignment's line, as Sphinx's autodoc does.

:class:`SphinxRoles` replaces each role by Markdown:

* the text shown is inline code of the name, as Sphinx shows it: the last dotted component with a leading ``~``,
  the full text without (an explicit title, ``:class:`title <target>```, is shown as given);
* a target that griffe finds in the loaded package becomes an optional autorefs cross-reference to the canonical
  path of the object (where it is defined: ``lightning_ortho.online.uoro.UORO`` for ``lightning_ortho.online.UORO``),
  which mkdocstrings registers for every object it renders, under its rendered path and its aliases. autorefs
  links it when the object is on the site and, being optional, leaves plain code without a warning when it is not
  (a private module, a member that the reference does not show): the site decides, not a copy of its rules here;
* a target griffe does not find (``torch.Tensor``, a name not in scope), or one written ``!name`` (Sphinx's "do not
  link"), becomes plain inline code.

A target is looked up as Sphinx's Python domain would: a dotted path from the package root, else its first
component in the scope of the documented object (its members, inherited ones for a class, then each enclosing
class and module, imports included) and the rest as members of that, else the object Python imports at that path
(the names ``lightning_ortho.callbacks`` exports lazily, constants that griffe does not see), public paths only.
A name written with a leading ``.`` (Sphinx's suffix search), and a bare name found none of these ways, is taken
when exactly one object of the package has that dotted suffix.

:func:`convert` is the text conversion (the tests call it with their own resolver); :func:`find` the look-up.
"""

from __future__ import annotations

import html
import importlib
import logging
import re
from collections.abc import Callable, Iterator

import griffe

_log = logging.getLogger("mkdocs.plugins.griffe_sphinx")

ROLES = ("class", "func", "meth", "mod", "attr", "data", "exc", "obj", "const")
ROLE = re.compile(r":(?:py:)?(?P<role>" + "|".join(ROLES) + r"):`(?P<content>[^`]+)`")
_TITLED = re.compile(r"(?P<title>.*?)\s*<(?P<target>[^<>]+)>", re.S)

Resolver = Callable[[str, str], "str | None"]
"""``resolve(target, role)``: the identifier to cross-reference for a role's target, or ``None`` for plain code."""


def parse_role(content: str) -> tuple[str, str, bool]:
    """The ``(display, target, link)`` of a role's text: ``~a.b.c`` shows ``c``, ``title <a.b>`` shows ``title``,
    ``!a.b`` is not linked, ``.a.b`` shows ``a.b`` (the dot asks for a suffix search); a target broken over lines
    is joined."""
    titled = _TITLED.fullmatch(content.strip())
    title = None
    if titled:
        title, content = " ".join(titled["title"].split()), titled["target"]
    target = re.sub(r"\s+", "", content)
    link = not target.startswith("!")
    target = target.lstrip("!")
    short = target.startswith("~")
    target = target.lstrip("~")
    display = title or (target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip("."))
    return display, target, link


def code(text: str) -> str:
    """Markdown inline code of ``text`` (which holds no backtick: a role's text cannot)."""
    return f"`{text}`"


def convert(text: str, resolve: Resolver) -> str:
    """``text`` with each Sphinx role replaced by Markdown: an optional autorefs cross-reference (the
    ``<autoref identifier=... optional>`` element that mkdocstrings' own templates emit) whose title is inline code,
    when ``resolve(target, role)`` gives an identifier, else inline code."""

    def replace(match: re.Match) -> str:
        display, target, link = parse_role(match["content"])
        identifier = resolve(target, match["role"]) if link else None
        if identifier is None:
            return code(display)
        # the title stays Markdown (inline code), so that ``__init__`` inside is not read as emphasis
        return f'<autoref identifier="{html.escape(identifier)}" optional>{code(display)}</autoref>'

    return ROLE.sub(replace, text)


def _canonical(obj: griffe.Object | griffe.Alias) -> str | None:
    try:
        return obj.canonical_path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None  # an alias to an object griffe has not loaded (torch)


def _member(obj: griffe.Object | griffe.Alias, path: str) -> griffe.Object | griffe.Alias | None:
    if not path:
        return obj
    try:
        return obj[path]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _in_scope(obj: griffe.Object, name: str) -> griffe.Object | griffe.Alias | None:
    """What ``name`` denotes in the scope of ``obj``: a member (inherited ones for a class), the object itself, or
    the same in its enclosing objects."""
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            members = scope.all_members if scope.is_class else scope.members
        except (griffe.AliasResolutionError, griffe.CyclicAliasError, ValueError):
            members = scope.members
        if name in members:
            return members[name]
        if name == scope.name:
            return scope
        scope = scope.parent
    return None


def _imported(path: str, top: griffe.Module) -> str | None:
    """The identifier of the object Python imports at ``path``: the canonical path of a class or function (by its
    ``__module__`` and ``__qualname__``, the rest of the path appended) when griffe knows it, else the path under
    which a public subpackage of ``top`` exports the same value (``lightning_ortho.transforms.CORE_INVERSE``, the
    heading the API reference gives a constant that static analysis cannot follow). For the names a package exports
    lazily (``__getattr__``) and the constants griffe does not see (tuple assignments)."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except Exception:  # noqa: BLE001, S112 (not a module: try a shorter prefix)
            continue
        base = None
        for index in range(split, len(parts)):
            try:
                value = getattr(value, parts[index])
            except Exception:  # noqa: BLE001
                return None
            home, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
            if isinstance(home, str) and isinstance(qualname, str) and "<" not in qualname:
                base = (f"{home}.{qualname}", index + 1)
        if base is not None:
            if base[0].split(".")[0] != top.name:
                return None  # defined outside the package (torch)
            found = _member(top, ".".join([base[0], *parts[base[1] :]]).partition(".")[2])
            return None if found is None else _canonical(found)
        for name, module in top.members.items():
            if module.is_alias or not module.is_package or name.startswith("_"):
                continue
            try:
                package = importlib.import_module(module.path)
            except Exception:  # noqa: BLE001, S112
                continue
            for exported in getattr(package, "__all__", ()):
                if getattr(package, exported, None) is value:
                    return f"{module.path}.{exported}"
        return None
    return None


COMMENT = re.compile(r"^(?P<indent>[ \t]*)#:(?: (?P<text>.*)|$)")
TRAILING = re.compile(r"[^#]*#:\s(?P<text>.*)$")


def comment_docstring(lines: list[str], lineno: int) -> str | None:
    """The text of the ``#:`` comment that documents the assignment on line ``lineno`` (1-based) of ``lines``: the
    ``#:`` lines right above it with its indentation, else a ``#:`` comment ending the line; ``None`` if neither."""
    line = lines[lineno - 1]
    indent = line[: len(line) - len(line.lstrip())]
    above: list[str] = []
    index = lineno - 2
    while index >= 0 and (match := COMMENT.match(lines[index])) and match["indent"] == indent:
        above.append(match["text"] or "")
        index -= 1
    if above:
        return "\n".join(reversed(above)).strip() or None
    trailing = TRAILING.match(line)
    return trailing["text"].strip() if trailing else None


class SphinxComments(griffe.Extension):
    """Gives each attribute without a docstring its ``#:`` comment (see the module docstring)."""

    def __init__(self, packages: list[str] | None = None) -> None:
        """``packages``: the top-level packages to read (default: every package loaded)."""
        super().__init__()
        self.packages = packages
        self.documented: list[str] = []

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if self.packages is not None and pkg.name not in self.packages:
            return
        for obj in _objects(pkg):
            if not obj.is_attribute or obj.docstring is not None or obj.lineno is None:
                continue
            try:
                lines = loader.lines_collection[obj.filepath]
            except (KeyError, TypeError):
                continue
            text = comment_docstring(lines, obj.lineno)
            if text:
                obj.docstring = griffe.Docstring(
                    text,
                    lineno=obj.lineno,
                    endlineno=obj.lineno,
                    parent=obj,
                    parser=loader.docstring_parser,
                    parser_options=loader.docstring_options,
                )
                self.documented.append(obj.path)
        _log.debug("griffe_sphinx: %s: %d attributes documented by #: comments", pkg.name, len(self.documented))


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of the docstrings of each loaded package (see the module docstring)."""

    def __init__(self, packages: list[str] | None = None) -> None:
        """``packages``: the top-level packages whose docstrings are rewritten (default: every package loaded)."""
        super().__init__()
        self.packages = packages
        #: ``(object path, role as written, identifier or None)`` of every role rewritten
        self.roles: list[tuple[str, str, str | None]] = []

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if self.packages is not None and pkg.name not in self.packages:
            return
        objects = list(_objects(pkg))
        suffixes = suffix_index(objects)
        collection = loader.modules_collection
        for obj in objects:
            if obj.docstring is None or ":`" not in obj.docstring.value:
                continue

            def resolve(target: str, role: str, obj: griffe.Object = obj) -> str | None:
                found = find(obj, target, collection, suffixes, role)
                self.roles.append((obj.path, f":{role}:`{target}`", found))
                return found

            obj.docstring.value = convert(obj.docstring.value, resolve)
        plain = [f"{where}: {role}" for where, role, found in self.roles if found is None]
        _log.debug(
            "griffe_sphinx: %s: %d roles as cross-references, %d as plain code (%s)",
            pkg.name,
            len(self.roles) - len(plain),
            len(plain),
            ", ".join(plain),
        )


def _is_module(obj: griffe.Object | griffe.Alias) -> bool:
    try:
        return obj.is_module
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False


def _fitting(found: griffe.Object | griffe.Alias, role: str, top: griffe.Module) -> str | None:
    """The identifier of ``found`` for a role of kind ``role``. A package's submodule and the function imported
    into the package under the module's name share one path (``lightning_ortho.transforms.sopot``); griffe keeps one
    of the two, so a ``:func:`` (any role but ``:mod:``) that found a module takes what Python imports at that
    path, and a ``:mod:`` that found such a function takes its module (any other non-module: no link)."""
    if role != "mod" and _is_module(found):
        return _imported(found.path, top) or _canonical(found)
    if role == "mod" and not _is_module(found):
        canonical = _canonical(found)
        if canonical is None:
            return None
        home, _, name = canonical.rpartition(".")
        return home if name == found.name else None  # the module of the function named like it, or no module
    return _canonical(found)


def find(
    obj: griffe.Object,
    target: str,
    collection: griffe.ModulesCollection,
    suffixes: dict[str, list[str]],
    role: str = "obj",
) -> str | None:
    """The identifier of what ``target`` names in the docstring of ``obj``, or ``None`` (see the module docstring
    for the order of the look-ups)."""
    if target.startswith("."):
        matches = suffixes.get(target[1:], [])
        return matches[0] if len(matches) == 1 else None
    head, _, rest = target.partition(".")
    absolute = head in collection.members
    found = _member(collection.members[head], rest) if absolute else None
    if found is None and (scoped := _in_scope(obj, head)) is not None:
        found = _member(scoped, rest)
    top = collection.members[target.split(".")[0] if absolute else obj.module.path.split(".")[0]]
    if found is not None:
        return _fitting(found, role, top)
    path = target if absolute else f"{obj.module.path}.{target}"
    if not any(part.startswith("_") for part in path.split(".")):  # no private module imported on the way
        identifier = _imported(path, top)
        if identifier is not None:
            return identifier
    matches = suffixes.get(target, [])
    return matches[0] if len(matches) == 1 else None


def suffix_index(objects: list[griffe.Object]) -> dict[str, list[str]]:
    """Each proper dotted suffix of the objects' paths (``UORO.step``, ``step``) -> the paths that end with it."""
    suffixes: dict[str, list[str]] = {}
    for obj in objects:
        parts = obj.path.split(".")
        for start in range(1, len(parts)):
            suffixes.setdefault(".".join(parts[start:]), []).append(obj.path)
    return suffixes


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined in it (aliases left out: their docstrings are their targets')."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)
