"""Every module's optimizer refuses an eps that underflows in float16 (precision="16-true") before the first step."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ortho.models import GlowModule, OnlineRNNModule, OrthogonalClassifier, OrthogonalRNNClassifier
from lightning_ortho.online import TanhRNNCell
from tests.conftest import make_tiny_trainer
from tests.models.test_online_rnn_module import TinyStreams

UNDERFLOW = r"eps=1e-08 is below the smallest normal number 6.1e-05 \(it rounds to 0\).*precision='16-mixed'"


def classifier_data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8)


def test_16_true_fit_of_a_classifier_with_adam_is_refused_before_it_turns_the_weights_into_nan(tmp_path):
    module = OrthogonalClassifier(in_features=6, num_classes=3, depth=1)
    fit = make_tiny_trainer(tmp_path, precision="16-true", max_steps=2, limit_val_batches=0)
    with pytest.raises(ValueError, match=rf"OrthogonalClassifier: Adam .* torch.float16 .*{UNDERFLOW}"):
        fit.fit(module, classifier_data())


def test_16_true_online_fit_with_adam_is_refused_and_names_sgd(tmp_path):
    module = OnlineRNNModule(TanhRNNCell(3, 5), 4, estimator="rtrl", optimizer="adam")
    fit = make_tiny_trainer(tmp_path, precision="16-true", max_epochs=1, limit_val_batches=0)
    with pytest.raises(ValueError, match=rf"OnlineRNNModule: Adam .*{UNDERFLOW}.*or optimizer='sgd'"):
        fit.fit(module, TinyStreams())


def test_16_true_online_fit_with_sgd_trains_in_float16(tmp_path):
    module = OnlineRNNModule(TanhRNNCell(3, 5), 4, estimator="rtrl", optimizer="sgd", lr=0.05)
    before = [p.detach().clone() for p in module.parameters()]
    fit = make_tiny_trainer(tmp_path, precision="16-true", max_epochs=1, limit_val_batches=0)
    fit.fit(module, TinyStreams())
    assert module.global_step == 15
    for p in module.parameters():
        assert p.dtype == torch.float16 and torch.isfinite(p).all()
    assert max((p.float() - q).abs().max() for p, q in zip(module.parameters(), before, strict=True)) > 1e-3


@pytest.mark.parametrize(
    "make",
    [
        lambda: GlowModule(in_channels=1, image_size=4, levels=1, steps=1, hidden_channels=4),
        lambda: OrthogonalRNNClassifier(in_features=1, num_classes=3, hidden_size=4, transition="aux"),
        lambda: OrthogonalRNNClassifier(hidden_size=4, optimizer="adam", transition_optimizer="rmsprop"),
    ],
    ids=["glow-adam", "rnn-adam+rmsprop", "rnn-rmsprop+adam"],
)
def test_every_module_building_an_eps_optimizer_refuses_float16_weights(make):
    module = make().half()  # what precision="16-true" does before configure_optimizers
    with pytest.raises(ValueError, match=rf"{type(module).__name__}: (Adam|RMSprop) .*{UNDERFLOW}"):
        module.configure_optimizers()
    make().bfloat16().configure_optimizers()  # bfloat16 has float32's range: eps=1e-8 is fine
    make().configure_optimizers()


@pytest.mark.parametrize(
    "optimizer_class, eps, dtype, refused",
    [
        (torch.optim.Adam, 1e-8, torch.float16, True),
        (torch.optim.Adam, 1e-4, torch.float16, False),
        (torch.optim.RMSprop, 1e-8, torch.float16, True),
        (torch.optim.Adam, 1e-8, torch.bfloat16, False),
        (torch.optim.Adam, 1e-8, torch.float32, False),
        (torch.optim.Adam, 1e-40, torch.float32, True),
        (torch.optim.SGD, None, torch.float16, False),
    ],
)
def test_build_optimizer_refuses_eps_below_the_smallest_normal_number_of_the_dtype(
    optimizer_class, eps, dtype, refused
):
    from lightning_ortho.models.optimizers import build_optimizer  # here: the other tests also run on old code

    params = [torch.nn.Parameter(torch.zeros(3, dtype=dtype))]
    options = {"lr": 0.1} if eps is None else {"lr": 0.1, "eps": eps}
    if refused:
        with pytest.raises(ValueError, match=rf"Owner: {optimizer_class.__name__} .* {dtype} .*below the smallest"):
            build_optimizer("Owner", optimizer_class, params, **options)
    else:
        assert isinstance(build_optimizer("Owner", optimizer_class, params, **options), optimizer_class)
