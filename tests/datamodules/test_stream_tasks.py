"""The stream tasks: copy, adding, influence balancing and character-level text, checked from their batches."""

import math

import pytest
import torch

from lightning_ortho.datamodules import (
    AddingTaskDataModule,
    CharacterStreamDataModule,
    CopyTaskDataModule,
    DatasetNotFoundError,
    InfluenceBalancingDataModule,
)
from lightning_ortho.datamodules.text_stream import default_corpus


def stream_of(dm, split: str, chunks: int) -> dict:
    """Chunks 0 .. chunks - 1 of every stream of a split, concatenated along time."""
    batches = [dm.batch(split, k) for k in range(chunks)]
    return {key: torch.cat([b[key] for b in batches], dim=1) for key in ("x", "y", "mask")} | {
        "reset": torch.stack([b["reset"] for b in batches], dim=1)
    }


def binary_entropy(p: torch.Tensor) -> torch.Tensor:
    return -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p))


# ---------------------------------------------------------------------------------------------------------------
# copy task


@pytest.mark.parametrize("chunk_length", [7, 16])
def test_copy_targets_are_the_symbols_presented_length_plus_delay_plus_one_steps_before(chunk_length):
    dm = CopyTaskDataModule(symbols=5, length=4, delay=3, streams=3, chunk_length=chunk_length, seed=1)
    assert (dm.input_size, dm.output_size, dm.episode_length, dm.recall_lag) == (7, 6, 12, 8)
    s = stream_of(dm, "train", 60 // chunk_length + 1)
    inputs = s["x"].argmax(-1)  # decode the one-hot inputs
    assert torch.equal(s["x"].sum(-1), torch.ones_like(s["x"][..., 0]))  # exactly one-hot
    steps = inputs.shape[1] // 12 * 12
    episodes = inputs[:, :steps].reshape(3, -1, 12)
    targets, mask = s["y"][:, :steps].reshape(3, -1, 12), s["mask"][:, :steps].reshape(3, -1, 12)
    symbols = episodes[:, :, :4]
    assert int(symbols.max()) < 5  # the presentation shows symbols
    assert bool((episodes[:, :, 4:7] == dm.blank).all()) and bool((episodes[:, :, 7] == dm.go).all())
    assert bool((episodes[:, :, 8:] == dm.blank).all())
    assert torch.equal(targets[:, :, 8:], symbols)  # recall: the symbols, in order, recall_lag steps later
    assert bool((targets[:, :, :8] == dm.blank).all())
    assert bool(mask[:, :, 8:].all()) and not bool(mask[:, :, :8].any())
    assert bool(s["reset"][:, 0].all()) and not bool(s["reset"][:, 1:].any())  # back to back: never restarts
    assert len(set(map(tuple, symbols.reshape(-1, 4).tolist()))) > 5  # episodes differ


def test_copy_episodes_start_at_chunk_boundaries_when_reset_between_episodes():
    dm = CopyTaskDataModule(symbols=4, length=3, delay=2, reset_between_episodes=True, streams=2, chunk_length=5)
    # L = 9 steps: each episode fills 2 chunks of 5 steps, the last step is padding
    s = stream_of(dm, "train", 6)
    assert s["reset"].tolist() == [[True, False] * 3] * 2
    inputs = s["x"].argmax(-1).reshape(2, 3, 10)
    targets, mask = s["y"].reshape(2, 3, 10), s["mask"].reshape(2, 3, 10)
    assert torch.equal(targets[:, :, 6:9], inputs[:, :, 0:3]) and bool(mask[:, :, 6:9].all())
    assert bool((inputs[:, :, 9] == dm.blank).all()) and not bool(mask[:, :, 9].any())  # padding
    assert bool((inputs[:, :, 5] == dm.go).all())


def test_copy_chance_level_and_bad_arguments():
    assert CopyTaskDataModule().chance_loss == pytest.approx(math.log(8))
    with pytest.raises(ValueError, match="symbols must be at least 2"):
        CopyTaskDataModule(symbols=1)
    with pytest.raises(ValueError, match="length must be a positive integer"):
        CopyTaskDataModule(length=0)
    with pytest.raises(ValueError, match="delay must be a non-negative integer"):
        CopyTaskDataModule(delay=-1)


# ---------------------------------------------------------------------------------------------------------------
# adding task


def test_adding_targets_follow_the_formula_recomputed_from_the_inputs():
    dm = AddingTaskDataModule(t1=3, t2=7, streams=4, chunk_length=5, seed=2)
    s = stream_of(dm, "train", 8)  # 40 steps
    x = s["x"][..., 0]
    assert set(x.unique().tolist()) == {0.0, 1.0}
    t = torch.arange(7, 40)
    expected = 0.5 + 0.5 * x[:, t - 3] - 0.25 * x[:, t - 7]
    torch.testing.assert_close(s["y"][:, 7:, 0], expected)
    torch.testing.assert_close(s["y"][..., 1], 1 - s["y"][..., 0])
    assert not bool(s["mask"][:, :7].any()) and bool(s["mask"][:, 7:].all())  # the first max(t1, t2) steps
    assert bool(s["reset"][:, 0].all()) and not bool(s["reset"][:, 1:].any())


def test_adding_loss_floors_in_closed_form_and_against_data():
    dm = AddingTaskDataModule(streams=64, chunk_length=100, seed=5)
    floors = dm.loss_floors()
    h = lambda p: float(binary_entropy(torch.tensor(p, dtype=torch.float64)))  # noqa: E731
    assert floors["constant"] == pytest.approx(h(0.625))
    assert floors["lag_t1_only"] == pytest.approx((h(0.375) + h(0.875)) / 2)
    assert floors["target_entropy"] == pytest.approx((math.log(2) + 2 * h(0.25)) / 4)
    assert floors["constant"] == pytest.approx(0.6616, abs=1e-4) and floors["target_entropy"] == pytest.approx(
        0.4545, abs=1e-4
    )
    # the same floors measured on 64 x 300 steps of data with the three predictors
    s = stream_of(dm, "train", 3)
    m, x, y = s["mask"], s["x"][..., 0].double(), s["y"][..., 0].double()
    ce = lambda q: float((-(torch.xlogy(y, q) + torch.xlogy(1 - y, 1 - q)))[:, 9:].mean())  # noqa: E731
    assert not bool(m[:, :9].any())
    assert ce(torch.full_like(y, 0.625)) == pytest.approx(floors["constant"], abs=0.01)
    from_t1 = torch.cat([torch.zeros(64, 5, dtype=x.dtype), x[:, :-5]], dim=1)
    assert ce(0.375 + 0.5 * from_t1) == pytest.approx(floors["lag_t1_only"], abs=0.01)
    assert ce(y) == pytest.approx(floors["target_entropy"], abs=0.01)


def test_adding_bad_lags():
    with pytest.raises(ValueError, match="t1 must be a positive integer"):
        AddingTaskDataModule(t1=0)
    with pytest.raises(ValueError, match="t2 must be a positive integer"):
        AddingTaskDataModule(t2=2.0)


# ---------------------------------------------------------------------------------------------------------------
# influence balancing


def test_influence_balancing_feeds_zeros_and_asks_for_ones():
    dm = InfluenceBalancingDataModule(streams=2, chunk_length=4, val_streams=2)
    assert (dm.input_size, dm.output_size, dm.loss) == (1, 1, "mse")
    batch = dm.batch("train", 0)
    assert torch.equal(batch["x"], torch.zeros(2, 4, 1)) and torch.equal(batch["y"], torch.ones(2, 4, 1))
    assert bool(batch["mask"].all()) and bool(batch["reset"].all()) and not bool(dm.batch("val", 1)["reset"].any())


# ---------------------------------------------------------------------------------------------------------------
# character stream


def test_text_streams_read_contiguous_pieces_with_the_next_character_as_target():
    dm = CharacterStreamDataModule(streams=4, chunk_length=50, val_streams=2)
    text = default_corpus()
    assert dm.vocab == "".join(sorted(set(text))) and dm.input_size == dm.output_size == len(dm.vocab)
    boundary = int(len(text) * 0.9)
    P = boundary // 4
    cycle = dm.chunks_per_cycle("train")
    assert cycle == math.ceil((P - 1) / 50) and dm.chunks_per_epoch == cycle  # default: one pass
    # the last 3 chunks of the first pass and the first chunk of the second
    batches = [dm.batch("train", k) for k in range(cycle - 3, cycle + 1)]
    x = torch.cat([b["x"] for b in batches[:3]], dim=1)
    y = torch.cat([b["y"] for b in batches[:3]], dim=1)
    mask = torch.cat([b["mask"] for b in batches[:3]], dim=1)
    start = (cycle - 3) * 50
    for j in range(4):
        piece = text[j * P : (j + 1) * P]
        read = dm.decode(x[j][mask[j]].argmax(-1))
        assert read == piece[start : P - 1]  # inputs: the contiguous piece, up to its last character
        assert dm.decode(y[j][mask[j]]) == piece[start + 1 : P]  # targets: the inputs shifted by one
        assert torch.equal(dm.piece("train", j), dm.encode(piece))
    # the last chunk's padded tail is masked: its last step counts only when the piece fills the chunk exactly
    assert torch.equal(mask[:, -1], torch.full((4,), (P - 1) % 50 == 0))
    assert bool((x[~mask] == 0).all())
    assert not bool(batches[0]["reset"].any()) and bool(batches[3]["reset"].all())  # the piece starts again
    assert torch.equal(batches[3]["x"], dm.batch("train", 0)["x"])
    # validation reads the last 10% of the text
    val_P = (len(text) - boundary) // 2
    v = dm.batch("val", 0)
    assert dm.decode(v["x"][1].argmax(-1)) == text[boundary + val_P : boundary + val_P + 50]
    assert dm.val_chunks == dm.chunks_per_cycle("val") == math.ceil((val_P - 1) / 50)


def test_text_from_a_file_and_its_errors(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcdefghij" * 10 + "é", encoding="utf-8")
    dm = CharacterStreamDataModule(path=str(corpus), streams=3, chunk_length=4, val_streams=1)
    assert dm.vocab == "abcdefghijé"
    x = torch.cat([dm.batch("train", k)["x"] for k in range(dm.chunks_per_cycle("train"))], dim=1)
    assert dm.decode(x[1].argmax(-1))[:10] == ("abcdefghij" * 10)[30:40]
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(DatasetNotFoundError, match=f"no text file at '{missing}'.*leave it unset"):
        CharacterStreamDataModule(path=str(missing))
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9" * 50)
    with pytest.raises(ValueError, match="not UTF-8"):
        CharacterStreamDataModule(path=str(tmp_path / "latin1.txt"))
    with pytest.raises(ValueError, match="too short for streams=60"):
        CharacterStreamDataModule(path=str(corpus), streams=60)
    with pytest.raises(ValueError, match="val_fraction must be in"):
        CharacterStreamDataModule(path=str(corpus), val_fraction=1.0)


def test_text_state_carries_the_vocabulary(tmp_path):
    dm = CharacterStreamDataModule(streams=4, chunk_length=20, val_streams=2)
    state = dm.state_dict()
    assert state["vocab"] == dm.vocab and state["next_chunk"] == 0 and len(state["corpus_sha256"]) == 64
    other_text = tmp_path / "other.txt"
    other_text.write_text("xyz" * 100, encoding="utf-8")
    other = CharacterStreamDataModule(path=str(other_text), streams=4, chunk_length=20, val_streams=2)
    with pytest.raises(ValueError, match=f"vocabulary of {len(dm.vocab)} characters, this corpus has 3"):
        other.load_state_dict(state)
    same_vocab = tmp_path / "same.txt"
    same_vocab.write_text("zyx" * 100, encoding="utf-8")
    with pytest.warns(UserWarning, match="another text with the same vocabulary"):
        CharacterStreamDataModule(path=str(same_vocab), streams=4, chunk_length=20, val_streams=2).load_state_dict(
            {**other.state_dict(), "corpus_sha256": "0" * 64, "next_chunk": 7}
        )
