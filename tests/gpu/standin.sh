#!/bin/bash
# The GPU host's stand-in for an imgfab vLLM image (tests/gpu/test_gpu_vllm_shapes.py).
#
# The GPU machine here reaches no registry, so neither nvidia/cuda nor the real payload can be
# pulled. It has Ubuntu 24.04, a driver, and a Python 3.12 with torch 2.11.0+cu130 (the torch
# vLLM 0.20-0.26 pin). The stand-in keeps what the rendered runtime stage does and replaces
# only what cannot be had there:
#   - the base: the host's own root filesystem (its /usr: bash, python3.12, gcc, g++, the
#     Python headers the runtime stage would apt-get), without /usr/local/cuda (like -base,
#     which has no toolkit), /opt and the driver's /usr/local/nvidia;
#   - the payload: the recipe's lock, less the wheels the host's torch venv already holds at
#     the locked versions (torch, torchvision, torchaudio, triton, the CUDA library wheels),
#     assembled at /opt/venv and copied into the image in place of the payload layers; the
#     host's torch venv is bind-mounted read-only beside it.
# Usage (each a separate step; state lives under $IMGFAB_STANDIN, default /tmp/imgfab-standin):
#   tests/gpu/standin.sh docker-up DOCKER_TAR_XZ   # unpack Debian's dockerd and start it
#   tests/gpu/standin.sh base                      # docker import of the host's root filesystem
#   tests/gpu/standin.sh payload PIECE...          # /opt/venv from the payload tar.xz pieces
#   tests/gpu/standin.sh registry                  # docker-registry on 127.0.0.1:5099 (no auth:
#                                                  # plain http on loopback, for select's fleet)
#   tests/gpu/standin.sh env                       # the exports the GPU tests need
set -euo pipefail
ROOT=${IMGFAB_STANDIN:-/tmp/imgfab-standin}
SOCK="unix://$ROOT/docker.sock"
BASE=imgfab-standin-base:latest
mkdir -p "$ROOT"

docker_path() { echo "$ROOT/docker/usr/bin:$ROOT/docker/usr/sbin:$PATH"; }

case "${1:-}" in
docker-up)
    mkdir -p "$ROOT/docker"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$2" "$ROOT/docker"
    PATH=$(docker_path) LD_LIBRARY_PATH="$ROOT/docker/lib/x86_64-linux-gnu" setsid dockerd \
        --data-root "$ROOT/data" --exec-root "$ROOT/exec" -H "$SOCK" --pidfile "$ROOT/dockerd.pid" \
        --iptables=false --bridge=none >"$ROOT/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 60); do
        if PATH=$(docker_path) docker -H "$SOCK" info >/dev/null 2>&1; then
            PATH=$(docker_path) docker -H "$SOCK" version --format 'dockerd {{.Server.Version}} up'
            exit 0
        fi
        sleep 1
    done
    echo "standin: dockerd did not start" >&2
    tail -n 20 "$ROOT/dockerd.log" >&2
    exit 1
    ;;
base)
    if getent passwd 10001 >/dev/null || getent group 10001 >/dev/null; then
        echo "standin: uid/gid 10001 exists on this host; the runtime stage's useradd would fail" >&2
        exit 1
    fi
    # Contents of the host's virtual and per-machine trees are left out; the directories stay.
    # GNU tar exits 1 when a file changed while it was read (a live host): not fatal here.
    set +e +o pipefail
    tar -C / -cf - --numeric-owner --warning=no-file-changed \
        --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' --exclude='./tmp/*' \
        --exclude='./run/*' --exclude='./opt/*' --exclude='./home/*' --exclude='./root/*' \
        --exclude='./mnt/*' --exclude='./media/*' --exclude='./srv/*' --exclude='./var/cache/*' \
        --exclude='./var/log/*' --exclude='./var/lib/docker' --exclude='./lost+found' \
        --exclude='./usr/local/cuda' --exclude='./usr/local/cuda-*' --exclude='./usr/local/nvidia' \
        --exclude='./usr/share/doc' --exclude='./usr/share/man' --exclude='./work' --exclude='./farm' \
        --exclude="./${ROOT#/}" --exclude="./${PWD#/}" ${OUT:+--exclude="./${OUT#/}"} \
        . 2>"$ROOT/base-tar.log" \
        | PATH=$(docker_path) docker -H "$SOCK" import - "$BASE" >/dev/null
    statuses="${PIPESTATUS[*]}"
    set -e -o pipefail
    read -r tar_rc import_rc <<<"$statuses"
    if [ "$tar_rc" -gt 1 ] || [ "$import_rc" -ne 0 ]; then
        echo "standin: base import failed (tar $tar_rc, docker import $import_rc)" >&2
        tail -n 5 "$ROOT/base-tar.log" >&2
        exit 1
    fi
    PATH=$(docker_path) docker -H "$SOCK" run --rm --network none "$BASE" \
        /bin/sh -c 'mkdir -p /tmp && for t in bash python3 gcc g++; do command -v $t >/dev/null || echo "standin: base lacks $t"; done; ls -d /usr/include/python3*/Python.h 2>/dev/null || echo "standin: base lacks Python.h"'
    PATH=$(docker_path) docker -H "$SOCK" image inspect "$BASE" --format 'base {{.Id}} {{.Size}} bytes'
    ;;
payload)
    shift
    torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    torch_venv=$(python3 -c 'import sys; print(sys.prefix)')
    interpreter=$(python3 -c 'import os, sys; print(os.path.realpath(sys._base_executable))')
    cat "$@" | python3 -c 'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall("/", filter="tar")'
    # One toolkit tree, as the real install makes it: the host's torch venv holds the CUDA
    # wheels left out of the payload (cuRAND's headers, which FlashInfer's sampler includes,
    # among them), so their files are linked into the venv's nvidia/cu13 where missing.
    (cd "$torch_site/nvidia/cu13" && find include lib \( -type f -o -type l \)) | while read -r file; do
        target="/opt/venv/lib/python3.12/site-packages/nvidia/cu13/$file"
        [ -e "$target" ] || { mkdir -p "$(dirname "$target")"; ln -s "$torch_site/nvidia/cu13/$file" "$target"; }
    done
    # Modes as pip and uv install them: a file the wheel marks executable (0744 in NVIDIA's
    # wheels) becomes 0755, so the image's non-root user can run nvcc, ptxas and cicc.
    find /opt/venv -type f -perm -u=x -exec chmod go+rx {} +
    ln -sf "$interpreter" /opt/venv/bin/python3
    ln -sf python3 /opt/venv/bin/python
    ln -sf python3 /opt/venv/bin/python3.12
    printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\n' "$(dirname "$interpreter")" \
        "$(python3 -c 'import platform; print(platform.python_version())')" >/opt/venv/pyvenv.cfg
    # After the venv's own packages: the host's torch, triton and CUDA library wheels.
    echo "$torch_site" >/opt/venv/lib/python3.12/site-packages/zz-standin-host-torch.pth
    # Bytecode as the real image carries it (imgfab-stage compiles unchecked-hash .pyc files
    # beside every source at build time): the payload's, and the host torch venv's, which the
    # real payload would hold. Without it, each process of a start (the probe, the API server,
    # the engine core) compiles all it imports, in memory, every time: the image's non-root
    # user cannot write __pycache__. Not imgfab-stage's one worker per group: its byte-for-byte
    # reproducibility does not matter here, its bytecode does.
    compiled=$SECONDS
    for tree in /opt/venv/lib/python3.12/site-packages "$torch_site"; do
        "$interpreter" -I -c 'import compileall, py_compile, sys
compileall.compile_dir(sys.argv[1], quiet=2, workers=0, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)' "$tree" || true
    done
    echo "payload: bytecode compiled in $((SECONDS - compiled)) s ($(find /opt/venv "$torch_site" -name '*.pyc' | wc -l) .pyc files)"
    base_prefix=$(python3 -c 'import sys; print(sys.base_prefix)')
    torch_root=$(dirname "$torch_venv")  # /opt/torch for /opt/torch/.venv
    {
        echo "$torch_root:$torch_root:ro"
        echo "/usr/local/nvidia:/usr/local/nvidia:ro"
        case "$base_prefix" in  # the interpreter itself, where the base has no copy of it
            /usr|/usr/*|"$torch_root"/*) ;;
            *) echo "$base_prefix:$base_prefix:ro" ;;
        esac
    } >"$ROOT/mounts.txt"
    /opt/venv/bin/python3 -c 'import sys, vllm, flashinfer, torch; print("payload: python", sys.version.split()[0], "vllm", vllm.__version__, "flashinfer", flashinfer.__version__, "torch", torch.__version__)'
    cat "$ROOT/mounts.txt"
    ;;
registry)
    # Debian bookworm's docker-registry 2.8, unpacked with docker.io (tests/gpu/pack.sh).
    mkdir -p "$ROOT/registry"
    cat >"$ROOT/registry.yml" <<YAML
version: 0.1
storage:
  filesystem:
    rootdirectory: $ROOT/registry
http:
  addr: 127.0.0.1:5099
YAML
    setsid "$ROOT/docker/usr/bin/docker-registry" serve "$ROOT/registry.yml" >"$ROOT/registry.log" 2>&1 </dev/null &
    for _ in $(seq 30); do
        if python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:5099/v2/", timeout=2)' 2>/dev/null; then
            echo "registry up on 127.0.0.1:5099"
            exit 0
        fi
        sleep 1
    done
    echo "standin: docker-registry did not start" >&2
    tail -n 20 "$ROOT/registry.log" >&2
    exit 1
    ;;
env)
    echo "export PATH=$(docker_path)"
    echo "export DOCKER_HOST=$SOCK"
    echo "export IMGFAB_STANDIN_BASE=$BASE"
    echo "export IMGFAB_STANDIN_MOUNTS=$ROOT/mounts.txt"
    echo "export IMGFAB_STANDIN_REGISTRY=127.0.0.1:5099"
    ;;
*)
    echo "usage: $0 docker-up DOCKER_TAR_XZ | base | payload PIECE... | registry | env" >&2
    exit 2
    ;;
esac
