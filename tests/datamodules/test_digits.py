import torch

from lightning_ortho.datamodules import DigitsDataModule


def test_fixed_seed_split_is_disjoint_complete_and_reproducible():
    a, b = DigitsDataModule(seed=3), DigitsDataModule(seed=3)
    sizes = {name: len(a.split(name)) for name in ("train", "val", "test")}
    assert sum(sizes.values()) == 1797
    assert sizes["val"] == round(1797 * 0.15) and sizes["test"] == round(1797 * 0.15)
    for name in ("train", "val", "test"):
        torch.testing.assert_close(a.split(name).tensors[0], b.split(name).tensors[0])
    rows = {tuple(r.tolist()) for name in ("train", "val", "test") for r in a.split(name).tensors[0]}
    assert len(rows) > 1700  # (a few digits images are exact duplicates in the data itself)
    other = DigitsDataModule(seed=4)
    assert not torch.equal(other.split("val").tensors[1], a.split("val").tensors[1])


def test_shapes_normalisation_and_resize():
    dm = DigitsDataModule(batch_size=16)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 64) and y.dtype == torch.long and dm.num_features == 64
    train = dm.split("train").tensors[0]
    assert abs(float(train.mean())) < 1e-5 and abs(float(train.std()) - 1) < 1e-3
    big = DigitsDataModule(image_size=28, flatten=False)
    x, _ = next(iter(big.val_dataloader()))
    assert x.shape == (64, 1, 28, 28) and big.num_features == 784


def test_state_dict_round_trip():
    dm = DigitsDataModule()
    dm.setup()
    fresh = DigitsDataModule()
    fresh.load_state_dict(dm.state_dict())
    assert fresh.mean == dm.mean and fresh.std == dm.std
