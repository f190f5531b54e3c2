"""benchmarks/gpu_suite.py: the --device cpu --quick run writes every section with its status and figures (the DDP
fit on two processes, both finished with equal parameters); the budget skips sections and rows and says so; the
memory estimates bound the estimators' states; the compiled-chunk section runs once OnlineRNNModule takes
``compile``; the results page says that no GPU figures exist until a CUDA result is committed."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_ortho.models import OnlineRNNModule
from tests.benchmarks.helpers import RESULTS_PAGES, ROOT, load

suite = load("gpu_suite")
renderer = load("gpu_suite_render")
children = load("_gpu_suite_children")
processes = load("_small_processes")


def run_suite(folder: Path, *argv: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m benchmarks.gpu_suite ARGV --out FOLDER`` as a user runs it; its JSON (the one file it wrote)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "benchmarks.gpu_suite", *argv, "--out", str(folder)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    written = sorted(folder.glob("gpu_suite-*.json"))
    assert len(written) == 1, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done, json.loads(written[0].read_text())


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_suite")
    done, data = run_suite(folder, "--device", "cpu", "--quick")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (folder / "gpu_suite-cpu-quick.json").is_file()
    return data


def test_quick_run_on_the_cpu_records_the_device_and_every_section(quick):
    assert quick["benchmark"] == "gpu_suite" and quick["device"] == "cpu" and quick["quick"] is True
    assert quick["device_name"] == quick["hardware_description"] and quick["device_name"]
    assert quick["torch"] == torch.__version__.split("+")[0]
    assert (
        quick["command"] == "python -m benchmarks.gpu_suite --device cpu --quick --out " + quick["command"].split()[-1]
    )
    assert list(quick["sections"]) == list(suite.SECTIONS)
    compiled = "ok" if suite.compile_available() else suite.NOT_AVAILABLE_COMPILE
    expected = {"small": "ok", "orthogonal": "ok", "online_steps": "ok", "compiled_chunk": compiled, "ddp": "ok"}
    assert {name: s["status"] for name, s in quick["sections"].items()} == expected
    for name, section in quick["sections"].items():
        if section["status"].startswith("not available"):  # decided before the budget: nothing ran
            assert set(section) == {"status"} and name == "compiled_chunk"
            continue
        assert section["seconds"] >= 0 and section["allowance_s"] > 0


def test_quick_run_times_the_small_and_orthogonal_rows_on_the_device(quick):
    small = quick["sections"]["small"]
    assert [r["section"] for r in small["rows"]] == list(suite.SMALL_ROWS)
    assert all(r["figure"] > 0 and "skipped" not in r for r in small["rows"])
    assert set(small["not_run"]) == {"compress", "online_recipe"}  # CPU-only rows: said, not silently dropped
    orthogonal = quick["sections"]["orthogonal"]
    maps = [r for r in orthogonal["rows"] if "section" not in r]
    dims, batches = suite.ORTHOGONAL_GRID[1]
    assert {(r["d"], r["batch"]) for r in maps} == {(d, b) for d in dims for b in batches}
    for row in maps:
        if row["method"] in load("_orthogonal_rows").GEOTORCH_METHODS and "skipped" in row:
            assert row["skipped"].startswith("geotorch not available")
            continue
        assert row["both_ms"] > 0 and "skipped" not in row
    fcnn = [r for r in orthogonal["rows"] if r.get("section") == "fcnn_epoch"]
    assert fcnn and all("epoch_s" in r or r["skipped"].startswith("geotorch") for r in fcnn)
    assert orthogonal["fcnn"]["data"].startswith("random uniform pixels")


def test_quick_run_times_every_estimator_at_every_size(quick):
    online = quick["sections"]["online_steps"]
    rows = online["rows"]
    keys = [(r["estimator"], r["B"], r["H"]) for r in rows]
    expected = {(k, b, h) for k in suite.ESTIMATORS for b in suite.STREAMS[1] for h in suite.HIDDEN[1]}
    assert len(keys) == len(expected) and set(keys) == expected
    for row in rows:
        assert "skipped" not in row and "failed" not in row, row
        assert row["ms_per_step"] > 0 and row["best_ms_per_step"] <= row["ms_per_step"]
        assert row["steps"] >= suite.MIN_STEPS and row["dtype"] == "float32"
        assert row["peak_memory_mb"] is None  # CUDA only: the CPU keeps no allocator statistics
        assert 0 < row["state_mb"] <= row["estimated_mb"]
        assert row["P"] == suite.parameter_count(suite.ESTIMATORS[row["estimator"]].cell, row["H"], row["I"])
    assert {r["cell"] for r in rows if r["estimator"] == "diagonal_rtrl"} == {"LinearRecurrentUnit"}


def test_quick_run_fits_on_two_processes(quick):
    ddp = quick["sections"]["ddp"]
    assert ddp["backend"] == "gloo" and ddp["processes"] == 2 and ddp["returncode"] == 0
    assert ddp["both_ranks_finished"] is True and ddp["parameters_equal_across_ranks"] is True
    assert [r["rank"] for r in ddp["ranks"]] == [0, 1] and all(r["world_size"] == 2 for r in ddp["ranks"])
    chunks = children.SIZES[1]["chunks_per_epoch"]
    for rank in ddp["ranks"]:
        assert rank["backend"] == "gloo" and len(rank["chunk_seconds"]) == chunks
        assert rank["global_step"] == chunks * children.SIZES[1]["chunk_length"]  # one update per time step
    assert ddp["ms_per_step"] == max(ddp["ms_per_step_per_rank"]) > 0


def test_quick_run_compiles_a_chunk_where_the_module_can(quick):
    compiled = quick["sections"]["compiled_chunk"]
    if not suite.compile_available():
        assert compiled == {"status": suite.NOT_AVAILABLE_COMPILE}
        return
    assert compiled["compiled"]["ms_per_step"] > 0 and compiled["eager"]["ms_per_step"] > 0
    assert math.isfinite(compiled["max_abs_parameter_difference"])


def test_the_results_page_renders_a_run(quick):
    text = renderer.render(quick)
    assert f"**{quick['device_name']}**" in text and "`python -m benchmarks.gpu_suite --device cpu --quick" in text
    for name, section in quick["sections"].items():
        assert f"| {name} | {section['status']} |" in text
    assert "| UORO (state projection, GIR) | 8 |" in text and "| DiagonalRTRL | 16 |" in text
    assert "DDP (gloo, 2 processes" in text
    assert load("report").renderer("gpu_suite") is renderer.render  # python -m benchmarks.report finds it


def test_the_results_page_renders_a_run_cut_short_by_the_budget(quick):
    spent, cpu = suite.Deadline.after(-1.0), torch.device("cpu")
    sections = {
        "small": suite.run_small(cpu, True, spent, 1),
        "orthogonal": suite.run_orthogonal(cpu, True, spent, 1),
        "online_steps": suite.run_online_steps(cpu, True, spent),
        "compiled_chunk": {
            "status": "ok",
            "eager": {"ms_per_step": 2.0},
            "compiled": {"ms_per_step": 0.5, "first_chunk_s": 30.0, "graph_breaks": 0},
            "compiled_over_eager": 0.25,
            "max_abs_parameter_difference": 1e-7,
        },
        "ddp": {"status": "skipped: budget: stopped after 9 s"},
    }
    text = renderer.render({**quick, "sections": sections})
    assert "Compiled chunk: 0.5 ms per time step against 2 eager (0.25x; the first, compiling chunk 30.0 s)" in text
    assert "| orthogonal | partial: " in text and "| ddp | skipped: budget: stopped after 9 s |" in text
    assert "| uoro_bandwidth | skipped: budget: the section's share was spent | | |" in text
    assert "Skipped for the budget: (d, B) = (16, 8)," in text and "the FCNN epochs." in text
    assert "| RTRL | 16 | skipped (budget) | skipped (budget) |" in text


# -- the budget ----------------------------------------------------------------------------------------------------
def test_a_budget_too_small_for_any_section_skips_them_all_and_says_so(tmp_path):
    path = suite.main(["--device", "cpu", "--quick", "--budget-s", "1", "--out", str(tmp_path)])
    data = json.loads(Path(path).read_text())
    assert list(data["sections"]) == list(suite.SECTIONS)
    for name, section in data["sections"].items():
        if name == "compiled_chunk" and not suite.compile_available():  # not a matter of budget
            assert section == {"status": suite.NOT_AVAILABLE_COMPILE}
            continue
        assert section["status"] == "skipped: budget"
        assert section["allowance_s"] < section["needs_s"] == suite.MIN_SECONDS[name][1]


def test_sections_that_cannot_run_here_say_so_whatever_the_budget_and_pass_their_share_on(monkeypatch):
    monkeypatch.setattr(suite, "compile_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cuda = torch.device("cuda", 0)
    assert suite.unavailable("compiled_chunk", cuda) == suite.NOT_AVAILABLE_COMPILE
    assert suite.unavailable("ddp", cuda).startswith("not available: DDP with nccl needs 2 GPUs (one per process), 1")
    assert suite.unavailable("ddp", torch.device("cpu")) is None  # gloo: two processes on the CPU
    assert suite.unavailable("online_steps", cuda) is None
    ran = []
    monkeypatch.setattr(suite, "run_section", lambda section, *args: ran.append(section) or {"status": "ok"})
    results, _ = suite.run_suite(torch.device("cpu"), True, 60.0, ["compiled_chunk", "ddp"], 1)
    assert ran == ["ddp"] and results["compiled_chunk"] == {"status": suite.NOT_AVAILABLE_COMPILE}
    assert results["ddp"]["allowance_s"] == pytest.approx(60.0, rel=0.01)  # the last section: all that is left


def test_allowances_share_the_time_left_among_the_sections_still_to_run():
    remaining = list(suite.SECTIONS)
    shares = [suite.allowance(100.0, s, remaining[i:]) for i, s in enumerate(remaining)]
    assert shares[0] == pytest.approx(100.0 * suite.WEIGHTS["small"] / sum(suite.WEIGHTS.values()))
    assert shares[-1] == pytest.approx(100.0)  # the last section gets whatever is left


def test_rows_past_the_deadline_are_recorded_as_skipped_for_the_budget():
    spent = suite.Deadline.after(-1.0)
    online = suite.run_online_steps(torch.device("cpu"), True, spent)
    assert online["rows"] and all(r["skipped"].startswith("budget") and "ms_per_step" not in r for r in online["rows"])
    assert online["status"] == f"partial: {len(online['rows'])} of {len(online['rows'])} rows skipped: budget"
    small = suite.run_small(torch.device("cpu"), True, spent, 1)
    assert [r["section"] for r in small["rows"]] == list(suite.SMALL_ROWS)
    assert all(r["skipped"].startswith("budget") for r in small["rows"]) and small["status"].startswith(
        "partial: 5 of 5"
    )


def test_a_row_predicted_to_overrun_the_deadline_is_skipped_before_it_runs(monkeypatch):
    monkeypatch.setattr(suite, "HIDDEN", ((), (8, 4096)))  # 4096: RTRL's prediction from H = 8 is (512)^4 times H=8's
    monkeypatch.setattr(suite, "STREAMS", ((), (1,)))
    monkeypatch.setattr(suite, "ESTIMATORS", {"rtrl": suite.ESTIMATORS["rtrl"]})
    online = suite.run_online_steps(torch.device("cpu"), True, suite.Deadline.after(60.0), limit=1 << 50)
    small, large = online["rows"]
    assert small["ms_per_step"] > 0
    assert large["skipped"].startswith("budget: predicted") and "ms_per_step" not in large


# -- memory --------------------------------------------------------------------------------------------------------
def test_rows_over_the_memory_limit_are_skipped_with_the_estimate():
    limit = suite.estimated_bytes("rtrl", 8, 8, 4)  # RTRL at B = 8 fits at H = 8, not at H = 16
    online = suite.run_online_steps(torch.device("cpu"), True, suite.Deadline.after(300.0), limit=limit)
    for row in online["rows"]:
        over = suite.estimated_bytes(row["estimator"], row["B"], row["H"], row["I"]) > limit
        assert ("skipped" in row) == over, row
        assert ("ms_per_step" in row) != over
        if over:
            assert row["skipped"].startswith("memory: about") and "GiB estimated" in row["skipped"]
    assert any("skipped" in r for r in online["rows"]) and online["status"] == "ok"  # a memory skip is by design
    assert online["memory_limit_mb"] == limit / 2**20


def test_a_row_out_of_memory_is_skipped_with_the_larger_ones_and_an_error_is_recorded_not_raised(monkeypatch):
    def fake(key, streams, hidden, input_size, device, quick, deadline):
        if key == "uoro":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if key == "rflo":
            raise ValueError("RFLO: something else")
        return {"ms_per_step": 1.0, "warm_up_ms_per_step": 1.0}

    monkeypatch.setattr(suite, "time_online_step", fake)
    online = suite.run_online_steps(torch.device("cpu"), True, suite.Deadline.after(60.0), limit=1 << 50)
    rows = {(r["estimator"], r["B"], r["H"]): r for r in online["rows"]}
    for streams in suite.STREAMS[1]:
        small, large = suite.HIDDEN[1]
        assert rows[("uoro", streams, small)]["skipped"] == "memory: out of memory (OutOfMemoryError)"
        assert rows[("uoro", streams, large)]["skipped"] == f"memory: out of memory at H = {small} already"
        assert rows[("rflo", streams, large)]["failed"] == "ValueError: RFLO: something else"
        assert rows[("rtrl", streams, large)]["ms_per_step"] == 1.0
    failed = sum("failed" in r for r in online["rows"])
    assert online["status"] == f"failed: {failed} of {len(online['rows'])} rows failed"


@pytest.mark.parametrize("key", list(suite.ESTIMATORS))
def test_the_memory_estimate_bounds_the_state_after_steps(key):
    """After steps (TruncatedBPTT's window full), the state's tensors are within the estimate it is skipped by."""
    spec = suite.ESTIMATORS[key]
    streams, hidden, inputs = 3, 6, 4
    cell = suite.CELLS[spec.cell](inputs, hidden)
    assert suite.parameter_count(spec.cell, hidden, inputs) == sum(p.numel() for p in cell.parameters())
    estimator = spec.build(cell)
    state = estimator.initial_state(torch.zeros(streams, hidden))
    for _ in range(suite.TBPTT_K + 2):
        _, state = estimator.step(torch.randn(streams, inputs), state)
    assert 0 < suite._state_bytes(state) <= suite.estimated_bytes(key, streams, hidden, inputs)


def test_snap_is_skipped_where_its_pattern_would_not_fit_on_the_host(monkeypatch):
    monkeypatch.setattr(suite, "host_available_bytes", lambda: 2 * suite.snap_probe_bytes(16, 4) - 2)
    assert suite._memory_skip("snap1", 1, 8, 4, 1 << 40) is None
    reason = suite._memory_skip("snap1", 1, 16, 4, 1 << 40)
    assert reason.startswith("memory: deriving SnAp's pattern holds dense (H, P) float64 Jacobians")
    assert suite._memory_skip("rtrl", 1, 16, 4, 1 << 40) is None  # the host's limit is SnAp's probe only


def test_on_cuda_the_limit_is_a_share_of_the_gpus_free_memory_and_the_name_is_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cuda = torch.device("cuda", 0)
    assert suite.memory_limit(cuda) == int(suite.GPU_MEMORY_SHARE * (10 << 30))
    assert suite.device_name(cuda) == "NVIDIA H200"
    assert suite.memory_limit(torch.device("cpu")) <= suite.CPU_MEMORY_LIMIT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
def test_cuda_without_a_gpu_is_refused_with_what_to_run_instead(tmp_path, capsys):
    with pytest.raises(SystemExit):
        suite.main(["--device", "cuda", "--out", str(tmp_path)])
    assert "run with --device cpu --quick" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# -- the child processes -------------------------------------------------------------------------------------------
def test_a_child_past_its_share_is_stopped_and_recorded(tmp_path):
    child = suite.run_child("ddp", torch.device("cpu"), True, tmp_path, 1.0)
    assert child["stopped"] == "budget: stopped after 1 s" and child["returncode"] == -9
    assert not list(tmp_path.glob("ddp-rank*.json"))


def test_the_compiled_section_reads_its_child(monkeypatch):
    monkeypatch.setattr(suite, "compile_available", lambda: True)
    figures = {"compiled_over_eager": 0.5, "max_abs_parameter_difference": 0.0}

    def child(section, device, quick, out, seconds):
        (out / "compiled.json").write_text(json.dumps(figures))
        return {"returncode": 0, "seconds": 1.0, "output": ""}

    monkeypatch.setattr(suite, "run_child", child)
    assert suite.run_compiled_chunk(torch.device("cpu"), True, suite.Deadline.after(60)) == {
        "status": "ok",
        **figures,
        "child_seconds": 1.0,
    }
    stopped = {"returncode": -9, "seconds": 9.0, "output": "", "stopped": "budget: stopped after 9 s"}
    monkeypatch.setattr(suite, "run_child", lambda *args: stopped)
    assert suite.run_compiled_chunk(torch.device("cpu"), True, suite.Deadline.after(9))["status"] == (
        "skipped: budget: stopped after 9 s"
    )
    monkeypatch.setattr(suite, "run_child", lambda *args: {"returncode": 1, "seconds": 1.0, "output": "Traceback"})
    failed = suite.run_compiled_chunk(torch.device("cpu"), True, suite.Deadline.after(9))
    assert failed == {"status": "failed: the child exited with 1", "output": "Traceback"}


def test_without_a_compile_option_the_compiled_section_runs_nothing(monkeypatch):
    monkeypatch.setattr(suite, "compile_available", lambda: False)
    monkeypatch.setattr(suite, "run_child", lambda *args: pytest.fail("no child without the option"))
    assert suite.run_compiled_chunk(torch.device("cpu"), True, suite.Deadline.after(60)) == {
        "status": suite.NOT_AVAILABLE_COMPILE
    }


class CompileOptionModule(OnlineRNNModule):
    """OnlineRNNModule with a ``compile`` argument that changes nothing (records what it was given): the
    compiled-chunk child's plumbing, before the module has the option."""

    given: list = []

    def __init__(self, *args, compile: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        CompileOptionModule.given.append(compile)


def test_the_compiled_child_fits_eager_then_with_compile_from_the_same_seed(tmp_path, monkeypatch):
    config = yaml.safe_load(processes.RECIPE.read_text())
    config["model"]["class_path"] = f"{__name__}.CompileOptionModule"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config))
    monkeypatch.setattr(processes, "RECIPE", recipe)
    monkeypatch.setattr(CompileOptionModule, "given", [])
    result = children.compiled(torch.device("cpu"), True, tmp_path)
    assert CompileOptionModule.given == [False, True]
    assert result["compiled"]["graph_breaks"] == 0  # the compiler's counters, recorded (nothing compiled here)
    assert json.loads((tmp_path / "compiled.json").read_text()) == result
    chunks = children.SIZES[1]["chunks_per_epoch"]
    for name in ("eager", "compiled"):
        assert len(result[name]["chunk_seconds"]) == chunks and result[name]["ms_per_step"] > 0
    # the same seed and data: the two fits' parameters agree to the bit (this module compiles nothing)
    assert result["max_abs_parameter_difference"] == 0.0


# -- the results page ----------------------------------------------------------------------------------------------
def test_the_results_page_says_no_gpu_figures_exist_until_a_cuda_result_is_committed():
    page = (RESULTS_PAGES / "benchmarks.md").read_text()
    assert "python -m benchmarks.gpu_suite" in page
    committed = list((ROOT / "benchmarks" / "results").glob("gpu_suite-cuda*.json"))
    assert ("No GPU figures exist yet" in page) == (not committed)


# -- the longer variant ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_sizes_on_the_cpu_keep_to_a_short_budget(tmp_path):
    """At full sizes a CPU cannot run the suite in 150 s: the budget skips rows and says so, every row is measured or
    skipped with its reason, and the run ends near its budget instead of running for an hour."""
    budget = 150
    done, data = run_suite(tmp_path, "--device", "cpu", "--budget-s", str(budget), "--memory-limit-gb", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert data["quick"] is False and data["total_seconds"] < 3 * budget
    sections = data["sections"]
    assert any(s["status"].startswith(("partial", "skipped: budget")) for s in sections.values())
    online = sections["online_steps"]
    if "rows" in online:
        for row in online["rows"]:
            assert ("ms_per_step" in row) != ("skipped" in row), row
            if "skipped" in row:
                assert row["skipped"].startswith(("budget", "memory"))
    assert sections["ddp"]["status"] == "ok" or sections["ddp"]["status"].startswith("skipped: budget")
