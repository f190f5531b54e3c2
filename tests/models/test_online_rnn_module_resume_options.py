"""OnlineRNNModule: a resume warns about other estimator_options only when they build another estimator: options
left at their defaults and the same defaults spelt out are the same options."""

import warnings

import pytest

from lightning_ortho._lightning import pl
from lightning_ortho.models.online import estimators as online_estimators
from tests.models.test_online_rnn_module import TinyStreams, model, trainer

OTHER_OPTIONS = "the checkpoint was trained with"


def test_resolved_options_fill_in_the_estimators_defaults():
    # UORO's documented defaults (its noise generator is the model's seed, not an option); TBPTT's k has none.
    uoro = {"projection": "state", "rescaling": "gir", "eps": 1e-7, "closed_form": True, "fused": True}
    assert online_estimators.resolved_options("uoro", {}) == uoro
    assert online_estimators.resolved_options("uoro", {"eps": 1e-3}) == {**uoro, "eps": 1e-3}
    assert online_estimators.resolved_options("tbptt", {"k": 3}) == {"k": 3, "closed_form": True}
    assert online_estimators.resolved_options("rtrl", {}) == {"closed_form": True}


@pytest.mark.parametrize(
    "saved, mine, differ",
    [
        ({}, {"projection": "state"}, ""),
        ({"projection": "state"}, {}, ""),
        ({"projection": "state"}, {"projection": "state", "rescaling": "gir"}, ""),
        ({}, {"eps": 1e-3}, "eps: 1e-07 saved, 0.001 now"),
        ({"projection": "preactivation"}, {}, "projection: 'preactivation' saved, 'state' now"),
    ],
)
def test_only_options_that_resolve_differently_differ(saved, mine, differ):
    assert online_estimators.differing_options("uoro", saved, mine) == differ


def test_a_required_option_set_on_one_side_only_differs():
    assert online_estimators.differing_options("tbptt", {"k": 3}, {}) == "k: 3 saved, (not set) now"


def _checkpoint(root, options):
    pl.seed_everything(0)
    first = model("uoro", update_every=2, estimator_options=options)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=root / "ckpt", save_last=True)
    fit = trainer(root / "first", max_epochs=1, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint])
    fit.fit(first, TinyStreams(streams=3, steps=5, chunks_per_epoch=3))
    return checkpoint.last_model_path


@pytest.mark.parametrize(
    "saved, mine, warned",
    [
        ({"projection": "state"}, {}, None),
        ({"projection": "state"}, {"projection": "state", "rescaling": "gir"}, None),
        ({}, {"projection": "state", "eps": 1e-7}, None),
        ({"projection": "state"}, {"projection": "state", "eps": 1e-3}, "eps: 1e-07 saved, 0.001 now"),
    ],
    ids=["defaults-left-out", "defaults-spelt-out", "all-defaults", "eps-changed"],
)
def test_resuming_with_the_defaults_spelt_out_or_left_out_does_not_warn(saved, mine, warned, tmp_path):
    path = _checkpoint(tmp_path, saved)
    resumed = model("uoro", update_every=2, estimator_options=mine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = trainer(tmp_path / "resumed", max_epochs=2, limit_val_batches=0)
        fit.fit(resumed, TinyStreams(streams=3, steps=5, chunks_per_epoch=3), ckpt_path=path)
    said = [str(w.message) for w in caught if OTHER_OPTIONS in str(w.message)]
    assert resumed.global_step == 15  # the resumed epoch trained: the comparison ran
    if warned is None:
        assert said == []
    else:
        assert len(said) == 1 and warned in said[0]
