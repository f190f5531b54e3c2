"""benchmarks/_common.py: the one timing loop (interleaving, phases, warm-up, budget, statistics), the shared command
line and the result file's name and command."""

import json
import random
import subprocess
import sys

import pytest
import torch

from tests.benchmarks.helpers import ROOT, load

common = load("_common")


class Clock:
    """A fake ``time.perf_counter``: each call of a timed function advances it by that function's cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float):
        def call(*args):
            self.now += seconds
            return seconds

        return call


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(common.time, "perf_counter", fake)
    return fake


def test_interleave_records_seconds_per_call_of_every_round(clock):
    order = []

    def named(name, seconds):
        spend = clock.spend(seconds)
        return lambda: (order.append(name), spend())[1]

    timing = common.interleave(
        {"a": named("a", 0.5), "b": named("b", 2.0)}, rounds=4, warmup=1, order="alternate", number=2
    )
    assert order == ["a", "a", "b", "b"] + ["a", "a", "b", "b", "b", "b", "a", "a"] * 2  # warm-up, then A B / B A
    assert timing.values("a") == [0.5] * 4 and timing.values("b") == [2.0] * 4
    assert timing.best("b") == timing.median("b") == 2.0 and timing.rounds("a") == 4
    assert timing.ratio("b", "a") == 4.0 and timing.paired_ratios("a", "b") == [0.25] * 4
    assert timing.results["a"] == [0.5] * 4  # the last call's result of each round


def test_phases_are_timed_apart_and_chained(clock):
    seen = []

    def forward():
        clock.now += 1.0
        return "y"

    def backward(y):
        seen.append(y)
        clock.now += 3.0
        return "grad"

    timing = common.interleave({"m": {"forward": forward, "backward": backward}}, rounds=2, warmup=0, min_time=7.5)
    # min_time 7.5 s of timed phases: two calls of 4 s per round
    assert seen == ["y"] * 4
    assert timing.values("m", "forward") == [1.0, 1.0] and timing.values("m", "backward") == [3.0, 3.0]
    assert timing.values("m") == [4.0, 4.0] and timing.results["m"] == ["grad", "grad"]


def test_min_time_per_name_and_synchronize(clock):
    calls, syncs = {"a": 0, "b": 0}, []

    def counted(name):
        def call():
            calls[name] += 1
            clock.now += 1.0

        return call

    common.interleave(
        {"a": counted("a"), "b": counted("b")},
        rounds=1,
        warmup=0,
        min_time={"a": 3.0},
        synchronize=lambda: syncs.append(clock.now),
    )
    assert calls == {"a": 3, "b": 1} and len(syncs) == 2 * (3 + 1)  # before and after every timed call


def test_budget_stops_slow_names_after_two_rounds(clock):
    timing = common.interleave(
        {"slow": clock.spend(10.0), "fast": clock.spend(1.0)}, rounds=5, warmup=0, budget=15.0, order="fixed"
    )
    assert timing.rounds("slow") == 2 and timing.rounds("fast") == 5


def test_shuffled_order_follows_the_seeded_generator(clock):
    def run(seed):
        order = []
        calls = {name: (lambda name=name: order.append(name)) for name in "abcdef"}
        common.interleave(calls, rounds=3, warmup=0, rng=random.Random(seed))
        return order

    assert run(0) == run(0) and run(0) != run(1)
    assert sorted(run(0)[:6]) == list("abcdef")  # each round calls every name once


def test_after_round_sees_the_timing_so_far(clock):
    seen = []
    common.interleave(
        {"a": clock.spend(1.0)}, rounds=3, warmup=0, after_round=lambda i, t: seen.append((i, t.rounds("a")))
    )
    assert seen == [(0, 1), (1, 2), (2, 3)]


def test_shared_command_line_records_the_rerun_command_and_output(tmp_path):
    parser = common.benchmark_parser("bench_x", "doc", threads=1)
    parser.add_argument("--size", type=int, default=3)
    args = common.parse_args(parser, ["--quick", "--size", "5", "--output", str(tmp_path)])
    assert args.command == f"python -m benchmarks.bench_x --quick --size 5 --output {tmp_path}"
    assert args.threads == 1 and args.suffix == "-quick" and args.rounds is None and args.device == "cpu"
    previous = torch.get_num_threads()
    with common.configured(args) as device:
        assert torch.get_num_threads() == 1 and device == torch.device("cpu")
        path = common.write_result("bench_x", device, [{"r": 1}], [common.claim("c", 1.5, 1.5 <= 2)], args)
    assert torch.get_num_threads() == previous  # given back: tests run many benchmarks in one process
    assert path == tmp_path / "bench_x-cpu1-quick.json"
    data = json.loads(path.read_text())
    assert data["command"] == args.command and data["hardware"] == "cpu1"
    assert data["claims"] == [{"claim": "c", "figure": 1.5, "holds": True}]
    assert common.parse_args(parser, ["--output-suffix", ""]).suffix == ""


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--threads", "0"]])
def test_shared_options_below_one_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        common.parse_args(common.benchmark_parser("bench_x", None), argv)
    assert "must be at least 1" in capsys.readouterr().err


def test_options_a_script_cannot_honour_are_refused(capsys):
    parser = common.benchmark_parser("reproduce_x", None)
    with pytest.raises(SystemExit):
        common.reject(parser, common.parse_args(parser, ["--rounds", "3"]), rounds="it trains (see --seeds)")
    assert "--rounds does not apply: it trains (see --seeds)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        common.reject(parser, common.parse_args(parser, ["--device", "cuda"]), device="CPU only")
    assert "--device cuda: CPU only" in capsys.readouterr().err
    common.reject(parser, common.parse_args(parser, []), rounds="never", device="never")  # defaults pass


def test_scripts_run_as_modules_of_the_package():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "python -m benchmarks.report --check" in done.stdout
