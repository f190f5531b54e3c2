# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install (core), train the paper's FCNN on the bundled digits, print validation accuracy
#   make test   create .venv, install with the test extra, run the default test suite
#   make docs   create .venv, install with the docs extra, build the documentation site into site/ (strict)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo docs test test-ddp test-native-off test-pytorch-lightning test-slow test-wheel test-docs-offline test-api bench install install-core clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test]"

# The demo needs only the core install (no extra).
install-core: $(BIN)/python
	$(BIN)/pip install --quiet -e .

demo: install-core
	$(BIN)/lightning-ortho fit --config recipes/fcnn_digits.yaml

test: install
	$(BIN)/python -m pytest -q

# The Lightning-facing tests again, with lightning-ortho built on `pytorch_lightning` instead of `lightning` (which
# the test extra installs, so `make test` uses it): the math packages' tests do not depend on either.
test-pytorch-lightning: install
	LIGHTNING_ORTHO_LIGHTNING=pytorch_lightning $(BIN)/python -m pytest -q tests/callbacks tests/models tests/datamodules \
		tests/benchmarks tests/test_cli.py tests/test_cli_compression.py tests/test_cli_predict.py \
		tests/test_cli_online_stages.py tests/test_scale.py

# The two-process DDP fits (marker ddp, out of the default run for its time), under both Lightning packages, and
# those of the modules that can reach a C kernel again with the kernels off.
test-ddp: install
	$(BIN)/python -m pytest -q -m "ddp and not slow"
	LIGHTNING_ORTHO_LIGHTNING=pytorch_lightning $(BIN)/python -m pytest -q -m "ddp and not slow"
	LIGHTNING_ORTHO_NATIVE=0 $(BIN)/python -m pytest -q -m "ddp and not slow" tests/models

# The tests that can reach a C kernel (lightning_ortho/_native) again with the kernels off: every such path has a
# PyTorch twin that must give the same results and errors.
test-native-off: install
	LIGHTNING_ORTHO_NATIVE=0 $(BIN)/python -m pytest -q tests/nn tests/flows tests/online tests/models \
		tests/test_native.py tests/test_native_tracing.py

# The documentation site (mkdocs.yml, docs/): a broken link, a missing page or an unrenderable docstring fails it.
# The package as a user installs it: sdist and wheel built and checked (twine), the wheel installed into a fresh
# environment, and a shipped recipe, the recipe list and the README's examples run from outside the repository.
test-wheel: $(BIN)/python
	$(BIN)/pip install --quiet "build>=1.2" "twine>=5"
	bash .ci/check_wheel.sh $(BIN)/python

# The site without network, in headless Chromium (tests/test_docs_offline.py): no remote resource, the math as MathML
# with no raw TeX on the concept pages, and no code block of Getting started wider than its column. Playwright drives
# the system's Chromium (Debian's chromium package, installed here when it is missing).
test-docs-offline: $(BIN)/python
	$(BIN)/pip install --quiet -e ".[docs,test]" "playwright>=1.40"
	test -x /usr/bin/chromium || apt-get install -y -q chromium > /dev/null || \
		(apt-get update -q > /dev/null && apt-get install -y -q chromium > /dev/null)
	LIGHTNING_ORTHO_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q tests/test_docs_offline.py

# The public API against the last release (v0.1.0, by its commit): every break listed in .ci/api_changes.txt.
test-api: install
	$(BIN)/python .ci/check_api.py

docs: $(BIN)/python
	$(BIN)/pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test-slow: install
	$(BIN)/python -m pytest -q -m slow

# One benchmark (default: the small-size overhead table; BENCH=bench_orthogonal etc.), then the tables of the
# documentation's results pages (docs/results/*.md) from benchmarks/results/*.json.
BENCH ?= bench_small
bench: install
	$(BIN)/python -m benchmarks.$(BENCH)
	$(BIN)/python -m benchmarks.report

clean:
	rm -rf $(VENV) lightning_logs .pytest_cache *.egg-info site
