"""The griffe extensions of the API reference (``docs/griffe_sphinx.py``): the docstrings' Sphinx roles become
Markdown (an optional autorefs cross-reference to the object's canonical path where griffe finds the object, plain
inline code where it does not), and ``#:`` comments document attributes. The built site itself is checked in
``tests/test_docs.py`` (no literal role on an API page), with the one build of the suite."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="griffe comes with the test and docs extras")

ROOT = Path(__file__).resolve().parents[1]


def _extension_module():
    spec = importlib.util.spec_from_file_location("griffe_sphinx", ROOT / "docs" / "griffe_sphinx.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gs = _extension_module()


def _ref(identifier: str, shown: str) -> str:
    return f'<autoref identifier="{identifier}" optional>`{shown}`</autoref>'


# -- the text conversion, with a resolver standing for the package ----------------------------------------------

KNOWN = {
    "lightning_ortho.online.UORO": "lightning_ortho.online.uoro.UORO",
    "lightning_ortho.online.uoro.UORO": "lightning_ortho.online.uoro.UORO",
    "step": "lightning_ortho.online.estimator.OnlineGradientEstimator.step",
    "UORO.step": "lightning_ortho.online.estimator.OnlineGradientEstimator.step",
}


def _resolve(target: str, role: str) -> str | None:
    return KNOWN.get(target)


@pytest.mark.parametrize(
    ("text", "markdown"),
    [
        # a known target, written with its public path: the canonical identifier, the full text shown
        (
            "Wraps :class:`lightning_ortho.online.UORO`.",
            f"Wraps {_ref('lightning_ortho.online.uoro.UORO', 'lightning_ortho.online.UORO')}.",
        ),
        # ``~``: the last component shown
        ("See :class:`~lightning_ortho.online.UORO`.", f"See {_ref('lightning_ortho.online.uoro.UORO', 'UORO')}."),
        # a method, bare and through its class
        (
            "Call :meth:`step`, or :meth:`~UORO.step`.",
            "Call {}, or {}.".format(
                _ref("lightning_ortho.online.estimator.OnlineGradientEstimator.step", "step"),
                _ref("lightning_ortho.online.estimator.OnlineGradientEstimator.step", "step"),
            ),
        ),
        # unknown targets: plain code, nothing to resolve (no warning possible)
        ("A :class:`torch.Tensor` or :class:`~torch.nn.Module`.", "A `torch.Tensor` or `Module`."),
        ("Built by :mod:`lightning_ortho._native.uoro_tanh`.", "Built by `lightning_ortho._native.uoro_tanh`."),
        # ``!`` (no link), an explicit title, ``:py:`` domain, a target broken over two lines
        ("Not :class:`!lightning_ortho.online.UORO`.", "Not `lightning_ortho.online.UORO`."),
        (
            "The :class:`estimator <lightning_ortho.online.UORO>`.",
            f"The {_ref('lightning_ortho.online.uoro.UORO', 'estimator')}.",
        ),
        (":py:class:`~lightning_ortho.online.UORO`", _ref("lightning_ortho.online.uoro.UORO", "UORO")),
        ("(:class:`~lightning_ortho.online.uoro.\n    UORO`)", f"({_ref('lightning_ortho.online.uoro.UORO', 'UORO')})"),
        # not roles: left alone
        ("``:class:`` is a role; key: value", "``:class:`` is a role; key: value"),
    ],
)
def test_convert(text, markdown):
    assert gs.convert(text, _resolve) == markdown


def test_parse_role():
    assert gs.parse_role("~a.b.c") == ("c", "a.b.c", True)
    assert gs.parse_role("a.b.c") == ("a.b.c", "a.b.c", True)
    assert gs.parse_role("!a.b") == ("a.b", "a.b", False)
    assert gs.parse_role(".b.c") == ("b.c", ".b.c", True)
    assert gs.parse_role("the title <a.b>") == ("the title", "a.b", True)


def test_comment_docstring():
    lines = textwrap.dedent(
        """\
        #: The first line,
        #: and the second.
        A = 1
        B = 2  #: B's trailing comment.
        # an ordinary comment
        C = 3
        class K:
            #: Class-level.
            x = 1
        """
    ).splitlines()
    assert gs.comment_docstring(lines, 3) == "The first line,\nand the second."
    assert gs.comment_docstring(lines, 4) == "B's trailing comment."
    assert gs.comment_docstring(lines, 6) is None
    assert gs.comment_docstring(lines, 9) == "Class-level."


# -- through griffe: a small package, loaded with the extensions as mkdocstrings loads the real one --------------


def _load(tmp_path: Path, modules: dict[str, str]):
    for name, source in modules.items():
        path = tmp_path / "rolespkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    roles = gs.SphinxRoles()
    extensions = griffe.load_extensions(gs.SphinxComments(), roles)
    loader = griffe.GriffeLoader(extensions=extensions, search_paths=[str(tmp_path)], docstring_parser="google")
    return loader.load("rolespkg"), roles


def test_extension_on_a_package(tmp_path):
    package, roles = _load(
        tmp_path,
        {
            "__init__.py": '''\
                """The package: :class:`~rolespkg.Thing` (its public path), :func:`~rolespkg.tools.helper`."""
                from rolespkg.thing import Thing
                __all__ = ["Thing"]
                ''',
            "thing.py": '''\
                import torch

                #: How many; see :class:`Thing`.
                COUNT = 3


                class Thing:
                    """A thing: :meth:`run` it (or :meth:`Thing.run`), not :class:`torch.Tensor`, not :class:`Nope`."""

                    def run(self):
                        """Run; then :meth:`stop`, :attr:`size` and :data:`COUNT`."""

                    def stop(self):
                        """Stop."""

                    size = 1
                ''',
            "tools.py": '''\
                def helper():
                    """Help."""
                ''',
        },
    )
    assert package.docstring.value == (
        f"The package: {_ref('rolespkg.thing.Thing', 'Thing')} (its public path), "
        f"{_ref('rolespkg.tools.helper', 'helper')}."
    )
    assert package["thing.Thing"].docstring.value == (
        f"A thing: {_ref('rolespkg.thing.Thing.run', 'run')} it (or {_ref('rolespkg.thing.Thing.run', 'Thing.run')}),"
        " not `torch.Tensor`, not `Nope`."
    )
    assert package["thing.Thing.run"].docstring.value == (
        f"Run; then {_ref('rolespkg.thing.Thing.stop', 'stop')}, {_ref('rolespkg.thing.Thing.size', 'size')} and "
        f"{_ref('rolespkg.thing.COUNT', 'COUNT')}."
    )
    # the #: comment became the attribute's docstring, its role converted too
    assert package["thing.COUNT"].docstring.value == f"How many; see {_ref('rolespkg.thing.Thing', 'Thing')}."
    unresolved = sorted(role for _, role, found in roles.roles if found is None)
    assert unresolved == [":class:`Nope`", ":class:`torch.Tensor`"]


# -- the real package: the look-ups the site relies on -------------------------------------------------------


@pytest.fixture(scope="module")
def lightning_ortho():
    roles = gs.SphinxRoles(packages=["lightning_ortho"])
    extensions = griffe.load_extensions(gs.SphinxComments(packages=["lightning_ortho"]), roles)
    loader = griffe.GriffeLoader(extensions=extensions, search_paths=[str(ROOT)], docstring_parser="google")
    return loader.load("lightning_ortho"), loader, roles


@pytest.mark.parametrize(
    ("where", "target", "role", "identifier"),
    [
        # a public path and the defining one: the canonical path mkdocstrings renders
        ("online", "lightning_ortho.online.UORO", "class", "lightning_ortho.online.uoro.UORO"),
        ("online", "lightning_ortho.online.uoro.UORO", "class", "lightning_ortho.online.uoro.UORO"),
        # a method of a documented class, through a subclass (inherited: the defining class's method)
        (
            "online",
            "lightning_ortho.online.UORO.gradient",
            "meth",
            "lightning_ortho.online.estimator.OnlineGradientEstimator.gradient",
        ),
        # a bare method name in the scope of its class
        (
            "datamodules.image_patches.ImagePatchesDataModule.all_patches",
            "setup",
            "meth",
            "lightning_ortho.datamodules.image_patches.ImagePatchesDataModule.setup",
        ),
        # a name lightning_ortho.callbacks exports lazily (``__getattr__``)
        ("callbacks", "lightning_ortho.callbacks.Monitor", "class", "lightning_ortho.callbacks.monitors.base.Monitor"),
        # the function a package imports under its module's name, and that module
        ("transforms", "lightning_ortho.transforms.sopot", "func", "lightning_ortho.transforms.sopot.sopot"),
        ("transforms.b_dla", "binary_cores", "mod", "lightning_ortho.transforms.binary_cores"),
        # a package (its reference page registers it)
        ("online", "lightning_ortho.nn", "mod", "lightning_ortho.nn"),
        # not lightning_ortho's, or not there: plain code
        ("online", "torch.Tensor", "class", None),
        ("online.uoro_fused", "lightning_ortho._native.uoro_tanh", "mod", None),
        ("online", "lightning_ortho.online.NoSuchThing", "class", None),
    ],
)
def test_find(lightning_ortho, where, target, role, identifier):
    package, loader, _ = lightning_ortho
    suffixes = gs.suffix_index(list(gs._objects(package)))
    assert gs.find(package[where], target, loader.modules_collection, suffixes, role) == identifier


def test_every_role_of_the_package_was_rewritten(lightning_ortho):
    package, _, roles = lightning_ortho
    left = [
        obj.path for obj in gs._objects(package) if obj.docstring is not None and gs.ROLE.search(obj.docstring.value)
    ]
    assert not left, f"docstrings that still hold a Sphinx role: {left}"
    assert len(roles.roles) > 700
    plain = [role for _, role, found in roles.roles if found is None]
    # a handful only: stdlib/C modules and names griffe cannot see (tuple assignments, the C kernels)
    assert len(plain) < 20, plain
