""".ci/check_api.py: the public breaks since v0.1.0 (griffe, against the release's commit) are exactly those
.ci/api_changes.txt lists; a break it does not list, or a line that is no longer a break, fails the check."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("check_api", ROOT / ".ci" / "check_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_api = _load()
needs_baseline = pytest.mark.skipif(
    not check_api.has_baseline(), reason="the v0.1.0 commit is not in this checkout's history (a shallow clone)"
)


def test_a_clone_without_the_release_says_the_check_did_not_run(monkeypatch, capsys):
    monkeypatch.setattr(check_api, "BASELINE", "0" * 40)
    assert check_api.main() == 0
    assert "API check NOT RUN" in capsys.readouterr().out


def test_the_public_surface_keeps_dunders_out_but_init_and_call():
    surface = {"lightning_ortho.flows.conv1x1.base.Invertible1x1Conv"}
    assert check_api.public("lightning_ortho.flows.conv1x1.base.Invertible1x1Conv.__init__", surface)
    assert check_api.public("lightning_ortho.flows.conv1x1.base.Invertible1x1Conv.forward", surface)
    assert not check_api.public("lightning_ortho.flows.conv1x1.base.Invertible1x1Conv.__new__", surface)
    assert not check_api.public("lightning_ortho.flows.conv1x1.base.Invertible1x1ConvX", surface)
    assert not check_api.public("lightning_ortho.models.online_carry", surface)


@needs_baseline
def test_every_public_break_is_listed_and_every_line_is_a_break(tmp_path, monkeypatch, capsys):
    found = check_api.breaks()
    assert found, "the release's breaks (TransformFamilySpec) should be seen"
    assert set(found) == check_api.acknowledged()
    assert check_api.main() == 0
    # a break the list does not name fails, and so does a line that is no longer a break
    listed = tmp_path / "api_changes.txt"
    listed.write_text("\n".join([*found[1:], "lightning_ortho.nn.AuxiliaryReflection | Public object was removed"]))
    monkeypatch.setattr(check_api, "ACKNOWLEDGED", listed)
    assert check_api.main() == 1
    out = capsys.readouterr().out
    assert f"break not in api_changes.txt (deprecate it, or list it with its changelog entry): {found[0]}" in out
    assert "lists what is no longer a break: lightning_ortho.nn.AuxiliaryReflection" in out
