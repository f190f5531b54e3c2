#!/usr/bin/env bash
# Everything a GPU machine checks, in one run (about 10 minutes): the environment, the CUDA tests (every estimator on
# every cell against the CPU, host reads, compiled steps), then the GPU suite. Logs and results go to FOLDER.
#
#   bash benchmarks/gpu_run.sh [FOLDER] [BUDGET_S]     # FOLDER defaults to benchmarks/results, BUDGET_S to 300
#
# Runs from the repository root with $PYTHON (default python3; the package from this tree: PYTHONPATH), which needs
# torch, lightning, pytest and PyYAML, not the test extra (--confcutdir keeps the documentation's conftest, which
# needs Sybil, out). A step that fails or overruns its time is logged and the next one still runs; pytest-timeout,
# where installed, bounds each test.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results}
BUDGET=${2:-300}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$PYTHON" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
  "$PYTHON" -m pip list 2>/dev/null | grep -iE "^(torch|lightning|pytorch-lightning|torchmetrics|numpy|triton) "
} > "$OUT/gpu_environment.txt" 2>&1
timeout_option=$("$PYTHON" -c "import pytest_timeout" 2>/dev/null && echo "--timeout=120")
timeout 180 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" --confcutdir=tests -m "not slow" -k "cuda or gpu" -rfE $timeout_option \
  tests/online/test_devices.py tests/online/test_host_syncs.py tests/online/test_compiled_steps.py \
  tests/models/test_online_rnn_module_compile.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "tests: exit $?" | tee -a "$OUT/gpu_tests.log"
timeout $((BUDGET + 90)) "$PYTHON" -m benchmarks.gpu_suite --budget-s "$BUDGET" --out "$OUT" > "$OUT/gpu_suite.log" 2>&1
echo "suite: exit $?" | tee -a "$OUT/gpu_suite.log"
tail -3 "$OUT/gpu_tests.log"
tail -12 "$OUT/gpu_suite.log"
