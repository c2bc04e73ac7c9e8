#!/usr/bin/env bash
# The main job end to end on the embedded local defaults: install imgfab into .venv, bring up
# the local stack (Docker engine, registry with auth on 127.0.0.1:5000, base-image mirror with
# stand-in bases, cosign and its key pair), then render, build, verify, tag and push one example
# recipe with its real payload, signed with its SBOM and provenance attested, and a deploy
# bundle pinned by the pushed digest; then check it as a host would: cosign verify,
# cosign verify-attestation, imgfab select --verify-key.
# Usage: scripts/demo.sh [RECIPE] (default recipes/qwen2-7b-h100.yaml).
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
REPORT="build/$(basename "$RECIPE" .yaml).report.json"
.venv/bin/imgfab build "$RECIPE" --push --lock "$LOCK" --sign-key "$IMGFAB_SIGN_KEY" --json >"$REPORT"
IMAGE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["images"][0]["pushed"])' "$REPORT")
BUNDLE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["images"][0]["publish"]["bundle"])' "$REPORT")
echo "[demo] pushed and signed $IMAGE; deploy bundle in $BUNDLE:"
ls "$BUNDLE"

# The consumers' own checks. The local stack has no transparency log: its signatures carry
# no Rekor entry, so they are verified with --insecure-ignore-tlog (cosign warns).
"$IMGFAB_COSIGN" verify --key "$IMGFAB_VERIFY_KEY" --insecure-ignore-tlog "$IMAGE" >/dev/null
echo "[demo] cosign verify: ok"
for kind in cyclonedx slsaprovenance1; do
    "$IMGFAB_COSIGN" verify-attestation --key "$IMGFAB_VERIFY_KEY" --insecure-ignore-tlog \
        --type "$kind" "$IMAGE" >/dev/null
    echo "[demo] cosign verify-attestation --type $kind: ok"
done
# What an ops team runs on a host: the newest signed image for its driver and GPU. The recipe's
# fleet is R535, which runs the image's CUDA 13 through forward compatibility (vLLM 0.33.0,
# outside every critical advisory).
.venv/bin/imgfab select --registry "${IMAGE%@*}" --driver 535.104.05 --gpu H100 \
    --verify-key "$IMGFAB_VERIFY_KEY"
