"""The deprecation policy: a public name or argument that changed keeps working for a minor release and warns
``LightningOrthoDeprecationWarning``, a ``DeprecationWarning`` (and a ``FutureWarning``) that Python shows by default
even from a module that is not ``__main__``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lightning_ortho._deprecation import LightningOrthoDeprecationWarning, warn_deprecated
from lightning_ortho.callbacks import GradientNoiseMonitor


def test_the_category_is_a_deprecation_warning_and_a_future_warning():
    assert issubclass(LightningOrthoDeprecationWarning, DeprecationWarning)
    assert issubclass(LightningOrthoDeprecationWarning, FutureWarning)
    with pytest.deprecated_call(match="gone soon"):
        warn_deprecated("gone soon")


def test_users_see_it_by_default_from_their_own_modules(tmp_path):
    # Python's default filters hide DeprecationWarning outside __main__: a user's module must still show this one
    (tmp_path / "users_module.py").write_text(
        textwrap.dedent(
            """
            from lightning_ortho.callbacks import GradientNoiseMonitor
            GradientNoiseMonitor(every_n_steps=20, interval=100)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", "import users_module"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "users_module.py:3: LightningOrthoDeprecationWarning: GradientNoiseMonitor" in result.stderr


def test_gradient_noise_monitor_interval_maps_to_the_new_arguments():
    # before: every_n_steps was the window and interval the steps between windows
    with pytest.deprecated_call(match=r"this is GradientNoiseMonitor\(every_n_steps=100, window_steps=20\)"):
        monitor = GradientNoiseMonitor(every_n_steps=20, interval=100)
    assert (monitor.every_n_steps, monitor.window_steps) == (100, 20)
    same = GradientNoiseMonitor(every_n_steps=100, window_steps=20)
    assert (same.every_n_steps, same.window_steps) == (monitor.every_n_steps, monitor.window_steps)
    with pytest.raises(ValueError, match="cannot go with window_steps"):
        GradientNoiseMonitor(every_n_steps=20, window_steps=10, interval=100)
    with pytest.deprecated_call(), pytest.raises(ValueError, match="window_steps=20 is longer than every_n_steps=10"):
        GradientNoiseMonitor(every_n_steps=20, interval=10)  # the old check (interval >= window) in the new words


def test_the_old_module_path_of_transform_compression_still_loads_a_saved_config():
    import importlib

    from lightning_ortho.callbacks import TransformCompression

    old = importlib.import_module("lightning_ortho.callbacks.transform_compression")
    with pytest.deprecated_call(match="moved to lightning_ortho.callbacks.compression.transform_compression"):
        assert old.TransformCompression is TransformCompression
    with pytest.raises(AttributeError):
        old.NoSuchName  # noqa: B018
