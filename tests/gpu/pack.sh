#!/bin/bash
# Packs, on this (networked) machine, what tests/gpu/proof.sh needs on the GPU machine, which
# reaches no network, into .gpu/ (git-ignored; the device tool carries it):
#   .gpu/docker.tar.xz       Debian bookworm's docker.io, containerd, runc, tini,
#                            libdevmapper1.02.1 and docker-registry, unpacked with dpkg -x, less
#                            the tools nothing here runs (ctr, dnet, ovrouter, the v1 shims), so
#                            that it travels with the tree in one call (64 MiB)
#   .gpu/hostwheels/*.whl    imgfab's own dependencies the payload lacks, and pytest (Python
#                            3.12 wheels)
#   .gpu/payload.tar.xz.NN   /opt/venv: the recipe's lock less the wheels the GPU host's torch
#                            venv holds (torch, torchvision, torchaudio, triton and torch's
#                            CUDA library wheels), installed by uv for Python 3.12 with the
#                            lock's hashes, in pieces of 56 MiB (one piece per device call,
#                            with the tree)
# Usage: tests/gpu/pack.sh [LOCK]      (default recipes/qwen2-7b-h200.lock)
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."
LOCK=${1:-recipes/qwen2-7b-h200.lock}
UV=${UV:-.venv/bin/uv}
WORK=$(mktemp -d /tmp/imgfab-pack.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p .gpu

if [ ! -s .gpu/docker.tar.xz ]; then
    (cd "$WORK" && apt-get download docker.io containerd runc tini libdevmapper1.02.1 \
        docker-registry >/dev/null)
    mkdir -p "$WORK/docker"
    for deb in "$WORK"/*.deb; do dpkg -x "$deb" "$WORK/docker"; done
    (cd "$WORK/docker" && rm -rf usr/share usr/sbin/ovrouter usr/bin/dnet usr/bin/ctr \
        usr/bin/containerd-shim usr/bin/containerd-shim-runc-v1 usr/bin/tini-static)
    tar -C "$WORK/docker" -cf - usr lib | xz -T0 -6 >.gpu/docker.tar.xz.part
    mv .gpu/docker.tar.xz.part .gpu/docker.tar.xz
    rm -f "$WORK"/*.deb
fi

# The host's torch venv holds these (at the versions torch 2.11.0 pins, which the lock has).
HOST_HELD='^(torch|torchvision|torchaudio|triton|nvidia-(cublas|cuda-cupti|cuda-nvrtc|cuda-runtime|cudnn-cu13|cufft|cufile|curand|cusolver|cusparse|cusparselt-cu13|nccl-cu13|nvjitlink|nvshmem-cu13|nvtx))$'
python3 - "$LOCK" "$HOST_HELD" >"$WORK/payload.txt" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
held = re.compile(sys.argv[2])
for entry in re.split(r"\n(?=[a-z0-9])", text.split("\n\n", 1)[1].strip()):
    name = entry.split("==", 1)[0].strip()
    if not held.match(name):
        print(entry)
EOF
site="$WORK/root/opt/venv/lib/python3.12/site-packages"
"$UV" pip install --quiet --no-deps --require-hashes --only-binary :all: --link-mode copy \
    --python-version 3.12 --python-platform x86_64-manylinux_2_39 \
    --target "$site" -r "$WORK/payload.txt"
mkdir -p "$WORK/root/opt/venv/bin"
if [ -d "$site/bin" ]; then
    for script in "$site"/bin/*; do
        sed '1s|^#!.*python.*$|#!/opt/venv/bin/python3|' "$script" >"$WORK/root/opt/venv/bin/$(basename "$script")"
        chmod 0755 "$WORK/root/opt/venv/bin/$(basename "$script")"
    done
    rm -rf "$site/bin"
fi
rm -f .gpu/payload.tar.xz.*
tar -C "$WORK/root" --owner=0 --group=0 -cf - opt | xz -T0 -3 | split -b 56M -d - .gpu/payload.tar.xz.
du -sh "$WORK/root/opt/venv"

rm -rf .gpu/hostwheels && mkdir -p .gpu/hostwheels
.venv/bin/pip download --quiet --disable-pip-version-check --dest .gpu/hostwheels --only-binary :all: \
    --python-version 3.12 --platform manylinux_2_39_x86_64 --platform manylinux2014_x86_64 \
    --platform any docker zstandard 'cyclonedx-python-lib[json-validation]' pytest >/dev/null
# what the payload already has at its locked version stays the payload's
for wheel in .gpu/hostwheels/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1 | tr '_' '-' | tr 'A-Z' 'a-z')
    if grep -q "^$name==" "$WORK/payload.txt"; then rm -f "$wheel"; fi
done
ls -la .gpu .gpu/hostwheels
