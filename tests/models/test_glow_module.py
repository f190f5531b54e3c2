import math

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_ortho._lightning import pl
from lightning_ortho.callbacks import GlowImageGrids, GlowInvertibilityCheck
from lightning_ortho.callbacks.invertibility_monitor import InvertibilityMonitor
from lightning_ortho.callbacks.jacobian_monitor import JacobianDeterminantMonitor
from lightning_ortho.datamodules import DigitsDataModule
from lightning_ortho.flows import Invertible1x1Conv
from lightning_ortho.models import GlowModule


def small_glow(conv1x1: str) -> GlowModule:
    return GlowModule(
        image_size=8, levels=3, steps=2, hidden_channels=16, conv1x1=conv1x1, num_levels=17, warmup_steps=5
    )


def test_training_lowers_bits_per_dim_and_the_callbacks_check_inversion_and_write_image_grids(tmp_path, tiny_trainer):
    pl.seed_everything(0)
    model = small_glow("aux_invertible")
    data = DigitsDataModule(batch_size=64, flatten=False, standardize=False)
    monitors = [  # as the Glow recipes watch training
        InvertibilityMonitor(modules=["glow"], probe_size=16, plot=True),
        JacobianDeterminantMonitor(modules=[Invertible1x1Conv], probe_size=16, plot=True),
    ]
    callbacks = [GlowInvertibilityCheck(), GlowImageGrids(), *monitors]
    trainer = tiny_trainer(max_epochs=2, gradient_clip_val=50.0, callbacks=callbacks)
    before = trainer.validate(model, data, verbose=False)[0]["val_bpd"]
    trainer.fit(model, data)
    metrics = trainer.callback_metrics
    assert float(metrics["val_bpd"]) < before - 0.5
    assert float(metrics["min_invertibility_margin"]) > 0 and float(metrics["aux_jacobian_sign_flips"]) == 0
    assert float(metrics["val_newton_failures"]) == 0 and float(metrics["val_reconstruction_error"]) < 1e-3
    steps = [record["step"] for record in monitors[0].history]
    assert steps == [record["step"] for record in monitors[1].history] and steps[-1] == trainer.global_step
    assert (
        float(metrics["invertibility/glow/roundtrip_error_max"]) < 1e-4
        and float(metrics["invertibility/glow/newton_failures"]) == 0
    )
    assert float(metrics["invertibility/glow/theorem2_margin"]) > 0
    fractions = [float(v) for k, v in metrics.items() if k.endswith("/pixel_negative_fraction")]
    assert len(fractions) == 2 * 3 and set(fractions) <= {0.0, 1.0}  # Theorem 2: no sign changes between pixels
    assert (tmp_path / "InvertibilityMonitor.png").exists() and (tmp_path / "JacobianDeterminantMonitor.png").exists()
    images = sorted(p.name for p in (tmp_path / "images").glob("*.png"))
    assert images == [f"{name}-epoch{epoch:03d}.png" for name in ("reconstructions", "samples") for epoch in (0, 1)]
    for name in ("samples-epoch001.png", "reconstructions-epoch001.png"):
        grid = np.asarray(Image.open(tmp_path / "images" / name))
        assert grid.shape[:2] == ((6 * 9 + 1, 6 * 9 + 1) if name.startswith("samples") else (4 * 9 + 1, 8 * 9 + 1))
        assert grid.std() > 0  # not a blank image


def test_without_callbacks_the_module_logs_bits_per_dim_only(tmp_path, tiny_trainer):
    model = small_glow("aux")
    data = DigitsDataModule(batch_size=64, flatten=False, standardize=False)
    trainer = tiny_trainer(fast_dev_run=True)
    trainer.fit(model, data)
    assert set(trainer.callback_metrics) == {"train_bpd", "train_bpd_step", "train_bpd_epoch", "val_bpd"}
    assert not (tmp_path / "images").exists()


def test_warmup_schedule():
    model = small_glow("lu")
    config = model.configure_optimizers()
    schedule = config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(7):
        lrs.append(config["optimizer"].param_groups[0]["lr"])
        config["optimizer"].step()
        schedule.step()
    assert lrs[0] == model.hparams.lr / 5 and lrs[4] == lrs[6] == model.hparams.lr


def test_standardised_data_is_refused_with_a_clear_message(tiny_trainer):
    model = small_glow("lu")
    data = DigitsDataModule(batch_size=16, flatten=False)  # standardised: values outside [0, 1]
    trainer = tiny_trainer(fast_dev_run=True)
    with pytest.raises(ValueError, match="standardisation"):
        trainer.fit(model, data)
    assert torch.isfinite(next(model.parameters())).all()


@pytest.mark.parametrize("batch_size", [1, 2])
def test_tiny_first_batches_do_not_ruin_the_actnorm_initialisation(batch_size, tiny_trainer):
    # Issue 9.5: glow_digits with batch_size=1 reported validation bits/dim 5e11 (1e14 with batch_size=2).
    pl.seed_everything(0)
    model = small_glow("aux_invertible")
    data = DigitsDataModule(batch_size=batch_size, flatten=False, standardize=False)
    with pytest.warns(UserWarning, match="no reliable statistics"):
        tiny_trainer(max_steps=1, limit_val_batches=4).fit(model, data)
    uniform = math.log2(17)  # bits/dim of a uniform model over 17 levels, what an untrained flow is near
    assert float(tiny_trainer(limit_val_batches=4).validate(model, data, verbose=False)[0]["val_bpd"]) < 2 * uniform
