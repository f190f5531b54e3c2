"""GlowInvertibilityCheck, GlowImageGrids and the monitors the Glow recipes use: what they log and write equals
what the test computes by brute force."""

import importlib
import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.utils import make_grid, save_image

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks import GlowImageGrids, GlowInvertibilityCheck
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.datamodules import DigitsDataModule
from lightning_ortho.flows import AuxConv1x1, Invertible1x1Conv, InvertibleAuxConv1x1
from lightning_ortho.models import GlowModule
from lightning_ortho.nn import NewtonInverseError
from tests.conftest import free_port
from tests.flows.references import autograd_log_det, conv1x1_inputs, minority_fraction, pixel_jacobian_signs

BoringModel = importlib.import_module(f"{pl.__name__}.demos.boring_classes").BoringModel


def small_glow(conv1x1: str) -> GlowModule:
    return GlowModule(image_size=8, levels=3, steps=1, hidden_channels=8, conv1x1=conv1x1, warmup_steps=1)


def digits(batch_size: int = 32) -> DigitsDataModule:
    return DigitsDataModule(batch_size=batch_size, flatten=False, standardize=False)


class FirstGlowInput:
    """The test's own record of what the Glow saw first in validation (the callbacks' probe, independently)."""

    def __init__(self, glow: torch.nn.Module) -> None:
        self.inputs: list[torch.Tensor] = []
        glow.register_forward_hook(self)

    def __call__(self, module, args, output) -> None:
        self.inputs.append(args[0].detach().clone())


def brute_force_reconstruction_error(glow, y: torch.Tensor) -> float:
    glow.eval()
    try:
        with torch.no_grad():
            return float((glow.decode(glow.encode(y).zs) - y).abs().max())
    except NewtonInverseError:
        return math.inf


def test_invertibility_check_logs_the_brute_force_numbers_of_an_aux_invertible_glow(tiny_trainer):
    pl.seed_everything(0)
    model = small_glow("aux_invertible")
    with torch.no_grad():  # generic V, so the margins differ from their value at init
        for layer in model.glow.modules():
            if isinstance(layer, InvertibleAuxConv1x1):
                layer.reflection.factor.add_(0.5 * torch.randn_like(layer.reflection.factor))
    seen = FirstGlowInput(model.glow)
    trainer = tiny_trainer(precision="64-true", limit_val_batches=2, callbacks=[GlowInvertibilityCheck(num_images=4)])
    trainer.validate(model, digits(), verbose=False)
    metrics = trainer.callback_metrics
    y = seen.inputs[0][:4]
    assert y.dtype == torch.float64
    expected_error = brute_force_reconstruction_error(model.glow, y)
    assert expected_error < 1e-9
    assert float(metrics["val_reconstruction_error"]) == pytest.approx(expected_error, rel=1e-6)
    assert float(metrics["val_newton_failures"]) == 0
    margins = []
    for layer, _ in conv1x1_inputs(model.glow, y):
        eigenvalues = torch.linalg.eigvalsh(layer.reflection.auxiliary_weight().detach())
        margins.append(float(1.5 * eigenvalues[0] - eigenvalues[-1]))
    assert float(metrics["min_invertibility_margin"]) == pytest.approx(min(margins), rel=1e-6)
    assert float(metrics["aux_jacobian_sign_flips"]) == 0.0  # Theorem 2


def test_invertibility_check_sign_flips_of_a_broken_aux_glow_equal_the_autograd_reference(tiny_trainer):
    pl.seed_everything(1)
    model = small_glow("aux")
    first = next(m for m in model.glow.modules() if isinstance(m, AuxConv1x1))
    with torch.no_grad():  # a generic W: its Jacobian determinant changes sign between pixels
        first.reflection.weight.copy_(3 * torch.randn_like(first.reflection.weight))
    seen = FirstGlowInput(model.glow)
    trainer = tiny_trainer(precision="64-true", limit_val_batches=1, callbacks=[GlowInvertibilityCheck(num_images=4)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.validate(model, digits(), verbose=False)
    metrics = trainer.callback_metrics
    y = seen.inputs[0][:4]
    model.glow.eval()
    reference = max(minority_fraction(pixel_jacobian_signs(layer, x)) for layer, x in conv1x1_inputs(model.glow, y))
    assert reference > 0  # the case is the one it should be
    assert float(metrics["aux_jacobian_sign_flips"]) == pytest.approx(reference, rel=1e-6)
    expected_error = brute_force_reconstruction_error(model.glow, y)
    assert float(metrics["val_reconstruction_error"]) == pytest.approx(expected_error, rel=1e-6)
    failed = expected_error == math.inf
    assert (float(metrics["val_newton_failures"]) > 0) == failed
    assert any("does not invert its validation probe" in str(w.message) for w in caught) == failed
    assert "min_invertibility_margin" not in metrics  # no layer is covered by Theorem 2


def test_the_recipes_monitors_log_the_reconstruction_and_sign_flips_of_a_broken_aux_glow(tiny_trainer):
    """The training-time monitors of the Glow recipes: InvertibilityMonitor on the Glow, JacobianDeterminantMonitor on
    the 1x1 convolutions (chosen by class path, as in the YAML); each equals the autograd / explicit reference."""
    pl.seed_everything(1)
    model = small_glow("aux")
    first = next(m for m in model.glow.modules() if isinstance(m, AuxConv1x1))
    with torch.no_grad():  # a generic W: its Jacobian determinant changes sign between pixels
        first.reflection.weight.copy_(3 * torch.randn_like(first.reflection.weight))
    convs = {name: m for name, m in model.named_modules() if isinstance(m, Invertible1x1Conv)}
    seen = {name: FirstGlowInput(conv) for name, conv in convs.items()}
    glow_input = FirstGlowInput(model.glow)
    monitors = [
        InvertibilityMonitor(modules=["glow"], every_n_steps=1, probe_size=4, plot=False),
        JacobianDeterminantMonitor(modules=[Invertible1x1Conv], probe_size=4, plot=False),
    ]
    trainer = tiny_trainer(precision="64-true", max_steps=1, limit_val_batches=0, callbacks=monitors)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, digits(8))
    logged = {**monitors[0].history[-1]["values"], **monitors[1].history[-1]["values"]}
    model.glow.eval()
    y = glow_input.inputs[0][:4]
    expected_error = brute_force_reconstruction_error(model.glow, y)
    assert logged["invertibility/glow/roundtrip_abs_error_max"] == pytest.approx(expected_error, rel=1e-9)
    assert (logged["invertibility/glow/newton_failures"] > 0) == (expected_error == math.inf)
    assert any("'glow' is no longer invertible" in str(w.message) for w in caught) == (expected_error > 1e-4)
    assert "invertibility/glow/theorem2_margin" not in logged  # no layer is covered by Theorem 2
    flips = []
    for name, conv in convs.items():
        x = seen[name].inputs[0][:4]
        negative = float((pixel_jacobian_signs(conv, x) <= 0).double().mean())
        assert logged[f"jacobian/{name}/pixel_negative_fraction"] == pytest.approx(negative, abs=1e-12), name
        log_det = autograd_log_det(conv, x)
        assert logged[f"jacobian/{name}/log_abs_det_mean"] == pytest.approx(float(log_det.mean()), abs=1e-8), name
        assert monitors[1].methods[name] == "flow"  # the log-determinant the flow layer returns (not logged)
        flips.append(min(negative, 1 - negative))
    assert len(convs) == 3 and max(flips) > 0  # the broken layer is seen, as aux_jacobian_sign_flips would say


def test_image_grids_are_the_samples_and_reconstructions_the_test_computes(tmp_path, tiny_trainer):
    pl.seed_everything(0)
    model = small_glow("aux_invertible")
    seen = FirstGlowInput(model.glow)
    grids = GlowImageGrids(num_samples=4, temperature=0.5, num_reconstructions=3, seed=7)
    trainer = tiny_trainer(limit_val_batches=1, callbacks=[grids])
    trainer.validate(model, digits(), verbose=False)
    folder = tmp_path / "images"
    assert sorted(p.name for p in folder.iterdir()) == ["reconstructions-epoch000.png", "samples-epoch000.png"]
    model.glow.eval()
    torch.manual_seed(7)
    samples = (model.glow.sample(4, temperature=0.5) + 0.5).clamp(0, 1)
    y = seen.inputs[0][:3]
    reconstructions = (torch.cat([y, model.glow.reconstruct(y)]) + 0.5).clamp(0, 1)
    for name, images, nrow in (("samples", samples, 6), ("reconstructions", reconstructions, 8)):
        save_image(make_grid(images, nrow=nrow, padding=1), tmp_path / f"expected-{name}.png")
        written = np.asarray(Image.open(folder / f"{name}-epoch000.png"))
        assert np.array_equal(written, np.asarray(Image.open(tmp_path / f"expected-{name}.png"))), name


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: GlowInvertibilityCheck(num_images=0), "num_images must be a positive integer"),
        (lambda: GlowImageGrids(num_samples=-1), "num_samples must be a non-negative integer"),
        (lambda: GlowImageGrids(num_reconstructions=2.5), "num_reconstructions must be a non-negative integer"),
        (lambda: GlowImageGrids(num_samples=0, num_reconstructions=0), "both 0; remove the callback"),
        (lambda: GlowImageGrids(temperature=-0.1), "temperature must be a finite number >= 0"),
        (lambda: GlowImageGrids(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (lambda: GlowImageGrids(seed="0"), "seed must be an integer or None"),
    ],
)
def test_arguments_are_validated_with_a_message_that_says_what_to_do(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("callback", [GlowInvertibilityCheck, GlowImageGrids])
def test_a_model_without_a_glow_is_refused_at_setup(callback, tiny_trainer):
    with pytest.raises(ValueError, match="BoringModel contains no lightning_ortho.flows.Glow"):
        tiny_trainer(limit_val_batches=1, callbacks=[callback()]).validate(BoringModel(), verbose=False)


@pytest.mark.ddp
def test_callbacks_log_on_every_process_under_ddp_without_hanging(tmp_path, tiny_trainer, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    pl.seed_everything(0)
    trainer = tiny_trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        strategy="ddp_spawn",
        devices=2,
        callbacks=[GlowInvertibilityCheck(num_images=4), GlowImageGrids(num_samples=4, num_reconstructions=4)],
    )
    trainer.fit(small_glow("aux_invertible"), digits(16))
    metrics = trainer.callback_metrics
    assert float(metrics["val_newton_failures"]) == 0 and float(metrics["val_reconstruction_error"]) < 1e-3
    assert float(metrics["min_invertibility_margin"]) > 0 and float(metrics["aux_jacobian_sign_flips"]) == 0
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == [
        "reconstructions-epoch000.png",
        "samples-epoch000.png",
    ]


class EncodesOnly(GlowModule):
    """Validates through ``glow.encode``: the Glow's forward (and so the probe's hook) is never called."""

    def validation_step(self, batch, batch_idx):
        y = batch[0] - 0.5
        self.log("val_log_prob", self.glow.encode(y).log_prob.mean())


def test_without_a_probe_the_check_warns_and_logs_nothing(tiny_trainer):
    trainer = tiny_trainer(limit_val_batches=1, callbacks=[GlowInvertibilityCheck()])
    with pytest.warns(UserWarning, match=r"not called as a module .* `glow\(y\)`"):
        trainer.validate(EncodesOnly(image_size=8, levels=3, steps=1, hidden_channels=8), digits(), verbose=False)
    assert set(trainer.callback_metrics) == {"val_log_prob"}
