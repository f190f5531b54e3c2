"""The public surface: every package's ``__all__`` resolves and names only public things; one name per concept, the
old names kept for one release as deprecated aliases that warn ``FutureWarning`` and still work."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest
import torch

PACKAGES = [
    "lightning_ortho",
    "lightning_ortho.nn",
    "lightning_ortho.flows",
    "lightning_ortho.flows.conv1x1",
    "lightning_ortho.online",
    "lightning_ortho.transforms",
    "lightning_ortho.callbacks",
    "lightning_ortho.models",
    "lightning_ortho.datamodules",
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_resolves_without_a_warning_and_none_is_private(package):
    module = importlib.import_module(package)
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"
    assert not [name for name in module.__all__ if name.startswith("_")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        for name in module.__all__:
            assert getattr(module, name) is not None, name


def test_transforms_exports_what_users_need_and_not_the_internals():
    import lightning_ortho.transforms as transforms

    public = set(transforms.__all__)
    for internal in ("shear_sweep", "learn_m_stage", "m_pair_costs", "CORE_PRODUCT_TABLE", "embed_block"):
        assert internal not in public
    for needed in ("learn_fast_transform", "BTransformResult", "BlockProduct", "compress_linear", "OpCount"):
        assert needed in public
    assert {"FAMILY_TABLE", "FAMILIES", "TransformFamilySpec"} <= public


# ------------------------------------------------------------------------------------- deprecated names
def _warns(match: str):
    return pytest.warns(FutureWarning, match=match)


@pytest.mark.parametrize(
    ("package", "name", "module"),
    [
        ("lightning_ortho.transforms", "shear_sweep", "lightning_ortho.transforms.s_dla"),
        ("lightning_ortho.transforms", "CORE_PRODUCT_TABLE", "lightning_ortho.transforms.binary_cores"),
        ("lightning_ortho.transforms", "learn_m_stage", "lightning_ortho.transforms.m_dla"),
        ("lightning_ortho.datamodules", "StreamLoader", "lightning_ortho.datamodules.streams"),
        ("lightning_ortho.nn", "householder_vectors", "lightning_ortho.nn.householder"),
    ],
)
def test_a_name_that_left_all_still_resolves_with_a_future_warning(package, name, module):
    with _warns(f"import it from {module}"):
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(importlib.import_module(module), name)


def test_unknown_names_still_raise_attribute_error():
    import lightning_ortho.flows as flows
    import lightning_ortho.transforms as transforms

    with pytest.raises(AttributeError):
        transforms.no_such_name  # noqa: B018
    with pytest.raises(AttributeError):
        flows.no_such_name  # noqa: B018


@pytest.mark.parametrize("package", ["lightning_ortho.flows", "lightning_ortho.flows.conv1x1"])
def test_auxiliary_conv1x1_is_a_deprecated_name_of_auxiliary_reflection_conv1x1(package):
    from lightning_ortho.flows import AuxConv1x1, AuxiliaryReflectionConv1x1

    with _warns("AuxiliaryConv1x1 is deprecated.*AuxiliaryReflectionConv1x1"):
        old = importlib.import_module(package).AuxiliaryConv1x1
    assert old is AuxiliaryReflectionConv1x1 and isinstance(AuxConv1x1(3), old)


def test_gradient_variance_monitor_is_a_deprecated_name_of_gradient_noise_monitor():
    from lightning_ortho.callbacks import GradientNoiseMonitor, GradientVarianceMonitor

    with _warns("GradientVarianceMonitor is deprecated.*GradientNoiseMonitor"):
        old = GradientVarianceMonitor(every_n_steps=2, window_steps=2)
    new = GradientNoiseMonitor(every_n_steps=2, window_steps=2)
    assert isinstance(old, GradientNoiseMonitor) and old.state_key == new.state_key
    assert "GradientVarianceMonitor" not in importlib.import_module("lightning_ortho.callbacks").__all__


def test_the_environment_switch_name_gradient_variance_is_deprecated_for_gradient_noise():
    from lightning_ortho.callbacks.factory import MONITORS, requested_monitors

    assert "gradient_noise" in MONITORS and "gradient_variance" not in MONITORS
    with _warns("'gradient_variance' is deprecated.*'gradient_noise'"):
        names = requested_monitors({"LIGHTNING_ORTHO_MONITORS": "gradient_variance,gradient-noise"})
    assert names == ["gradient_noise"]


def test_old_model_names_warn_and_resolve():
    import lightning_ortho.models as models

    with _warns("renamed OrthogonalClassifier"):
        assert models.OrthoClassifier is models.OrthogonalClassifier


# ------------------------------------------------------------------------------------- one vocabulary
def test_fast_transform_module_takes_the_family_vocabulary_and_the_old_names_with_a_warning():
    from lightning_ortho.models import FastTransformModule

    new = FastTransformModule(family="b", m=12, q=3, s=2)
    assert (new.hparams.m, new.hparams.q, new.hparams.s) == (12, 3, 2)
    assert not {"blocks", "stages", "sparsity"} & set(new.hparams)
    with _warns("'blocks' is deprecated.*use 'm'"), _warns("'stages'.*'q'"), _warns("'sparsity'.*'s'"):
        old = FastTransformModule(family="b", blocks=12, stages=3, sparsity=2)
    assert dict(old.hparams) == dict(new.hparams)
    with _warns("'blocks' is deprecated"), pytest.raises(ValueError, match="blocks=12 and m=10 disagree"):
        FastTransformModule(m=10, blocks=12)


def test_the_same_vocabulary_in_the_three_users_of_the_family_table():
    import inspect

    from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
    from lightning_ortho.models import FastTransformModule
    from lightning_ortho.transforms import compress_linear

    for user in (FastTransformModule, compress_linear, TransformCompression):
        assert {"family", "m", "q", "s", "bits", "iterations"} <= set(inspect.signature(user).parameters), user


def test_the_cli_parses_the_new_and_the_old_names_of_fast_transform_module(tmp_path):
    from lightning_ortho.cli import run_cli

    recipe = str(ROOT / "recipes" / "transform_patches.yaml")
    common = ["fit", "--config", recipe, f"--trainer.default_root_dir={tmp_path}", "--trainer.fast_dev_run=true"]
    cli = run_cli([*common, "--model.init_args.m=12", "--model.init_args.s=3"])
    assert (cli.model.hparams.m, cli.model.hparams.s) == (12, 3)
    with _warns("'blocks' is deprecated"):
        cli = run_cli([*common, "--model.init_args.blocks=12", "--model.init_args.sparsity=3"])
    assert (cli.model.hparams.m, cli.model.hparams.s) == (12, 3)


def test_modrelu_is_defined_once():
    from lightning_ortho.nn import modrelu
    from lightning_ortho.nn.activations import modrelu as defined
    from lightning_ortho.online import ModReLURNNCell

    assert modrelu is defined
    written = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "lightning_ortho").rglob("*.py")
        if "torch.relu(torch.abs(" in path.read_text()
    ]
    assert written == ["lightning_ortho/nn/activations.py"]
    cell = ModReLURNNCell(3, 4)
    z = torch.randn(5, 4)
    torch.testing.assert_close(cell.activation(z), modrelu(z, cell.bias))


def test_learn_fast_transform_takes_iterations_and_sweeps_with_a_warning():
    from lightning_ortho.transforms import learn_fast_transform

    y = torch.randn(40, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    new = learn_fast_transform(y, 2, init="identity", iterations=1)
    with _warns("'sweeps' is deprecated.*'iterations'"):
        old = learn_fast_transform(y, 2, init="identity", sweeps=1)
    torch.testing.assert_close(old.transform.matrix(), new.transform.matrix())
