"""Griffe extension: the Sphinx roles of the docstrings as autorefs cross-references in the API reference.

The docstrings are Google style but name other objects with Sphinx roles (``:class:`~lightning_ortho.nn.SVDLinear```,
``:meth:`step```, ``:mod:`lightning_ortho.online```, ``:func:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:``),
which mkdocstrings leaves as literal text. mkdocstrings-python loads this extension (``extensions:`` in
``mkdocs.yml``); once griffe has loaded the package (``on_package``) it rewrites every docstring's roles, before
mkdocstrings parses or renders any of them:

* the text shown is inline code of the name, as Sphinx shows it: the last dotted component with a leading ``~``,
  the full text without (an explicit title, ``:class:`title <target>```, is shown as given);
* a target that griffe finds in the loaded package becomes an optional autorefs cross-reference to the canonical
  path of the object (where it is defined: ``lightning_ortho.online.uoro.UORO`` for ``lightning_ortho.online.UORO``),
  which mkdocstrings registers for every object it renders, under its rendered path and its aliases. autorefs
  links it when the object is on the site and, being optional, leaves plain code without a warning when it is not
  (a private module, a member that the reference does not show); the site decides, not a copy of its rules here;
* a target griffe does not find (``torch.Tensor``, a name not in scope), or one written ``!name`` (Sphinx's "do not
  link"), becomes plain inline code.

A target is looked up as Sphinx's Python domain would: a dotted path from the package root, else its first
component in the scope of the documented object (its members, inherited ones for a class, then each enclosing
class and module, imports included) and the rest as members of that, else, for an absolute
``lightning_ortho.`` path that static analysis cannot follow (the names ``lightning_ortho.callbacks`` exports
lazily), the object Python imports at that path. A name written with a leading ``.`` (Sphinx's suffix search),
and a bare name not in scope, is taken when exactly one object of the package has that dotted suffix.

:func:`convert` is the text conversion (tests call it with their own resolver).
"""

from __future__ import annotations

import html
import importlib
import logging
import re
from collections.abc import Callable, Iterator

import griffe

_log = logging.getLogger("mkdocs.plugins.griffe_roles")

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


#: A ``Raises:`` section whose only entry names no exception but refers to another object (``as :meth:`setup```).
#: With the role's colon gone griffe no longer splits the entry (at the role, which showed ``as `` as the
#: exception) and warns, which fails the strict build; such a section is shown as the sentence ``Raises as
#: `setup` does.`` instead. The docstring should name the exceptions (``ValueError: as :meth:`setup`.``).
_RAISES_AS = re.compile(
    r"^(?P<indent>[ \t]*)Raises:\n[ \t]+as (?P<ref>" + ROLE.pattern + r")\.?[ \t]*$(?!\n(?P=indent)[ \t]+\S)",
    re.M,
)


def raises_as(text: str) -> str:
    """``text`` with each ``Raises:`` section of one exception-less ``as <role>`` entry as a sentence."""
    return _RAISES_AS.sub(lambda match: f"{match['indent']}Raises as {match['ref']} does.", text)


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


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of the docstrings of each loaded package (see the module docstring)."""

    def __init__(self, packages: list[str] | None = None) -> None:
        """``packages``: the top-level packages whose docstrings are rewritten (default: every package loaded)."""
        super().__init__()
        self.packages = packages
        self.referenced = 0
        self.plain = 0
        self.unresolved: list[tuple[str, str]] = []
        #: ``(object path, role as written, identifier or None)`` of every role rewritten
        self.roles: list[tuple[str, str, str | None]] = []

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if self.packages is not None and pkg.name not in self.packages:
            return
        objects = list(_objects(pkg))
        suffixes: dict[str, list[str]] = {}
        for obj in objects:
            parts = obj.path.split(".")
            for start in range(1, len(parts)):
                suffixes.setdefault(".".join(parts[start:]), []).append(obj.path)
        collection = loader.modules_collection
        for obj in objects:
            if obj.docstring is None or ":`" not in obj.docstring.value:
                continue
            text = raises_as(obj.docstring.value)
            obj.docstring.value = convert(text, self._resolver(obj, collection, suffixes))
        _log.debug(
            "griffe_roles: %s: %d roles as cross-references, %d as plain code; not found: %s",
            pkg.name,
            self.referenced,
            self.plain,
            ", ".join(sorted({f"{where}: {target}" for where, target in self.unresolved})) or "none",
        )

    def _resolver(
        self, obj: griffe.Object, collection: griffe.ModulesCollection, suffixes: dict[str, list[str]]
    ) -> Resolver:
        def resolve(target: str, role: str) -> str | None:
            found = find(obj, target, collection, suffixes, role)
            self.roles.append((obj.path, f":{role}:`{target}`", found))
            if found is None:
                self.plain += 1
                if target.lstrip(".").split(".")[0] not in ("torch", "lightning", "numpy", "typing", "collections"):
                    self.unresolved.append((obj.path, f":{role}:`{target}`"))
            else:
                self.referenced += 1
            return found

        return resolve


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


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined in it (aliases left out: their docstrings are their targets')."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)
