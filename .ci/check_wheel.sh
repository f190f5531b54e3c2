#!/usr/bin/env bash
# The package as a user installs it. Build the sdist and the wheel from the sdist (python -m build), check their
# metadata (twine check --strict), install the wheel, not editable, into a fresh environment, and from a directory
# without the repository: list the recipes, run a shipped recipe by name, and run the README's Python examples.
# Usage: bash .ci/check_wheel.sh [PYTHON]   (PYTHON: an interpreter with build and twine; default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf dist
"$python" -m build --sdist --wheel --outdir dist .
"$python" -m twine check --strict dist/*
# the README's Python blocks, each a program of its own (as the README tests run them)
"$python" - README.md "$work/readme" <<'PY'
import pathlib, re, sys
blocks = re.findall(r"^```python\n(.*?)^```$", pathlib.Path(sys.argv[1]).read_text(), re.M | re.S)
assert blocks, "the README has no Python block"
out = pathlib.Path(sys.argv[2])
out.mkdir()
for number, block in enumerate(blocks, 1):
    (out / f"block_{number}.py").write_text(block)
print(f"{len(blocks)} README blocks")
PY

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet dist/*.whl
mkdir "$work/outside"
cd "$work/outside"
"$work/venv/bin/python" - <<'PY'
import pathlib
import lightning_ortho
path = pathlib.Path(lightning_ortho.__file__).resolve()
assert "site-packages" in path.parts, f"lightning_ortho was imported from {path}, not from the installed wheel"
print(f"lightning_ortho {lightning_ortho.__version__} from {path.parent}")
PY
"$work/venv/bin/lightning-ortho" recipes
"$work/venv/bin/lightning-ortho" fit --config fcnn_digits --trainer.fast_dev_run=true
for block in "$work"/readme/block_*.py; do
    echo "README: $(basename "$block")"
    "$work/venv/bin/python" "$block" > /dev/null
done
echo "wheel check passed"
