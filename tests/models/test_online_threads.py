"""OnlineRNNModule runs small cells on one CPU thread (num_threads='auto') and gives the count back afterwards."""

import pytest
import torch

from lightning_ortho._lightning import pl
from lightning_ortho.datamodules import AddingTaskDataModule
from lightning_ortho.models import OnlineRNNModule
from lightning_ortho.online import TanhRNNCell, threads

START = 2  # the count the process has before each test: the suite runs with OMP_NUM_THREADS=1


@pytest.fixture(autouse=True)
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(START)
    yield
    torch.set_num_threads(before)


class SeenThreads(pl.Callback):
    """The thread count at every batch of every stage."""

    def __init__(self):
        self.seen = set()

    def _record(self, *args, **kwargs):
        self.seen.add(torch.get_num_threads())

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _record


def module(hidden_size=8, **options):
    return OnlineRNNModule(TanhRNNCell(1, hidden_size), output_size=2, **options)


def data():
    return AddingTaskDataModule(streams=2, chunk_length=4, chunks_per_epoch=2, val_streams=2, val_chunks=1)


def run(tiny_trainer, model, stages=("fit", "validate", "test", "predict")):
    seen = SeenThreads()
    trainer = tiny_trainer(max_epochs=1, callbacks=[seen])
    after = {}
    for stage in stages:
        getattr(trainer, stage)(model, datamodule=data())
        after[stage] = torch.get_num_threads()
    return seen.seen, after


def test_auto_runs_a_small_cell_on_one_thread_and_gives_the_count_back_after_every_stage(tiny_trainer):
    seen, after = run(tiny_trainer, module())
    assert seen == {1}
    assert after == {"fit": START, "validate": START, "test": START, "predict": START}


@pytest.mark.parametrize(
    ("options", "hidden_size", "expected"),
    [({"num_threads": None}, 8, START), ({"num_threads": 3}, 8, 3), ({}, 257, START), ({"num_threads": 1}, 257, 1)],
)
def test_num_threads_none_an_int_and_auto_above_the_small_sizes(tiny_trainer, options, hidden_size, expected):
    seen, after = run(tiny_trainer, module(hidden_size, **options), stages=("fit",))
    assert seen == {expected} and after["fit"] == START


def test_the_count_is_given_back_when_the_run_fails(tiny_trainer):
    class Fails(pl.Callback):
        def on_train_batch_end(self, *args, **kwargs):
            assert torch.get_num_threads() == 1
            raise RuntimeError("stop here")

    trainer = tiny_trainer(max_epochs=1, callbacks=[Fails()])
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.fit(module(), datamodule=data())
    assert torch.get_num_threads() == START


@pytest.mark.parametrize("value", [0, -1, "one", 1.5, True])
def test_a_bad_num_threads_is_refused_naming_the_choices(value):
    with pytest.raises(ValueError, match="num_threads must be 'auto'"):
        module(num_threads=value)


def test_num_threads_none_holds_inside_the_estimators_calls_too(tiny_trainer, monkeypatch):
    # A process where the estimator's own "auto" would act (no OMP_NUM_THREADS, torch's count as at import):
    # the module's None (leave torch's count) must reach it, or the estimator would run its calls on one thread.
    monkeypatch.setattr(threads, "_START_COUNT", START)
    monkeypatch.setattr(threads, "_ENVIRONMENT_CHOSE", False)
    model = module(num_threads=None)
    assert model.estimator.num_threads is None
    seen, inner = [], model.estimator._step

    def recorded(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return inner(*args, **kwargs)

    model.estimator._step = recorded
    tiny_trainer(max_epochs=1).fit(model, datamodule=data())
    assert seen and set(seen) == {START}
