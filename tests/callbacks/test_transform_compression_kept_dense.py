"""TransformCompression leaves a layer dense when its compressed form would cost at least as many operations as the
dense one, and says so: in ``kept_dense``, in the info line and in the table, and the state keeps it."""

import warnings

import pytest
from torch import nn

from lightning_ortho.callbacks.compression.transform_compression import TransformCompression
from lightning_ortho.transforms import FactorizedLinear, compress_linear
from tests.callbacks.test_transform_compression import UserMLP, make_data
from tests.callbacks.test_transform_compression_metric import GRURegressor, sequences
from tests.conftest import make_tiny_trainer


def test_a_layer_dearer_than_dense_at_the_given_s_stays_dense_and_the_table_says_so(tmp_path, capsys) -> None:
    train, val = make_data()
    model = UserMLP()
    # s = 8 on the 8 -> 16 layer: every code row full, plus the transform, more than the 16 x 8 product
    callback = TransformCompression(s=8, verbose=True, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(model, train, val)
    first = model.net[0]
    assert type(first) is nn.Linear  # untouched
    assert isinstance(model.net[2], FactorizedLinear)
    assert [row["module"] for row in callback.report] == ["net.2"]
    (kept,) = callback.kept_dense
    with pytest.warns(UserWarning, match="costs 272 operations per sample"):  # the same sizes, any weights
        reference = compress_linear(nn.Linear(8, 16), "b", s=8, progress=False).report
    assert reference.factorized_ops.total >= reference.dense_ops.total == 16 * 8 + 16 * 7
    assert kept["module"] == "net.0" and kept["type"] == "Linear" and kept["ops"] == 16 * 8 + 16 * 7
    assert kept["reason"].startswith(f"dearer than dense ({reference.factorized_ops.total} operations per sample")
    # the layer is not compressed, so compress_linear's "costs more than dense" warning would be a false alarm
    assert not [w for w in caught if "costs" in str(w.message) and "operations per sample" in str(w.message)]
    printed = capsys.readouterr().out
    assert "net.0" in printed and "stays dense: dearer than dense" in printed
    restored = TransformCompression(s=8)
    restored.load_state_dict(callback.state_dict())
    assert restored.kept_dense == callback.kept_dense


def test_the_budget_search_keeps_a_layer_dense_that_no_s_makes_cheaper_and_says_why(tmp_path) -> None:
    train, val = sequences()
    model = GRURegressor()  # its head, 8 -> 1: 8 multiplications and 7 additions, less than any transform of 8
    callback = TransformCompression(max_output_error=50.0, metric=None, verbose=False, progress=False)
    make_tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(model, train, val)
    kept = {row["module"]: row for row in callback.kept_dense}
    assert kept["head"]["reason"].startswith("dearer than dense")
    assert kept["head"]["ops"] == 8 + 7
    assert type(model.head) is nn.Linear
    assert "head" not in {row["module"] for row in callback.report}
