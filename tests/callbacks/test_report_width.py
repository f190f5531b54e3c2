"""End-of-fit tables print whole when output is not a terminal (a pipe, a log file, pytest's capture), where rich
would otherwise assume 80 columns and wrap or cut cells."""

from lightning_ortho.callbacks.compression.report import print_report
from lightning_ortho.callbacks.monitors.report import print_table

LONG = "encoder.blocks.11.attention.output_projection.linear_layer_with_a_long_name"


def test_the_compression_table_keeps_every_row_on_one_line(capsys):
    row = {
        "module": LONG,
        "type": "Linear",
        "in_features": 784,
        "out_features": 784,
        "s": 16,
        "blocks": 12345,
        "error": 12.3456,
        "ops_ratio": 0.123,
    }
    for kind in ("dense_ops", "factorized_ops"):
        row |= {f"{kind}_additions": 614656, f"{kind}_multiplications": 614656, f"{kind}_shifts": 0}
    print_report([row], "val_acc", 0.97412, 0.96123)
    lines = capsys.readouterr().out.splitlines()
    assert any("val_acc: 0.9741 before -> 0.9612 compressed" in line for line in lines), lines
    (row_line,) = [line for line in lines if LONG in line]
    assert "784 -> 784" in row_line and "12.35" in row_line and "0.123" in row_line


def test_the_monitor_table_keeps_every_key_on_one_line(capsys):
    key = f"jacobian/{LONG}/log_abs_det_mean"
    print_table("JacobianDeterminantMonitor", {key: (1.5, -2.25, 3.125)})
    (row_line,) = [line for line in capsys.readouterr().out.splitlines() if key in line]
    assert "1.5" in row_line and "-2.25" in row_line and "3.125" in row_line
