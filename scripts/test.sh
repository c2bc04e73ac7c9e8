#!/usr/bin/env bash
# The test command (README, .ci/run): install imgfab with its test extras into .venv, bring up
# the local stack (Docker engine, registry with auth, stand-in base images), then run every
# test but the `gpu` ones, which need an NVIDIA GPU and run on the GPU machine
# (`python -m pytest -m gpu tests/gpu`), and the planted-bug harness and the fuzz campaign
# (`-m mutation`, `-m fuzz`), which take minutes. Extra arguments go to pytest.
set -euo pipefail
REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO"

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'

scripts/local-stack.sh up
# shellcheck disable=SC1091
source .stack/env
export PATH="$REPO/.venv/bin:$PATH"

echo "[test] gpu-marked tests are deselected here: they run on the GPU machine (pytest -m gpu tests/gpu)"
echo "[test] mutation/fuzz campaigns are deselected here (minutes each): pytest -m mutation tests/mutation; pytest -m fuzz tests/fuzz"
exec .venv/bin/python -m pytest -m "not gpu and not mutation and not fuzz" "$@"
