#!/usr/bin/env bash
# The main job end to end on the embedded local defaults: install imgfab into .venv, bring up
# the local stack (Docker engine, registry with auth on 127.0.0.1:5000, base-image mirror with
# stand-in bases), then render, build, verify, tag and push one example recipe with its real
# payload. Usage: scripts/demo.sh [RECIPE] (default recipes/qwen2-7b-h100.yaml).
set -euo pipefail
REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO"
RECIPE=${1:-recipes/qwen2-7b-h100.yaml}

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e .

scripts/local-stack.sh up
# shellcheck disable=SC1091
source .stack/env

.venv/bin/imgfab resolve "$RECIPE"
# The committed lock (recipes/<name>.lock) targets the image's own Python and glibc (ubuntu24.04:
# 3.12, 2.39). The local stack's bases are bookworm stand-ins (Python 3.11, glibc 2.36), so the
# demo locks the same recipe for the stand-in's interpreter and builds from that lock.
mkdir -p build
LOCK="build/$(basename "$RECIPE" .yaml).stand-in.lock"
.venv/bin/imgfab lock "$RECIPE" --python-version 3.11 --python-platform x86_64-manylinux_2_36 --output "$LOCK"
exec .venv/bin/imgfab build "$RECIPE" --push --lock "$LOCK"
