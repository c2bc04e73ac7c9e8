#!/bin/bash
# Rendered by imgfab 0.1.0: run qwen2-7b-h200 with the settings it was built for.
# Usage: WEIGHTS_DIR=/path/to/weights [IMAGE=ref] [IMGFAB_PRESET=chat|long-context] [HOST_PORT=port]
#        [CACHE_VOLUME=name] (the compiled-kernel cache volume, kept across runs)
#        API_KEY_FILE=/path/to/api-key (the key clients send as Authorization: Bearer KEY, e.g.
#        `openssl rand -hex 32 > api-key`; readable by uid 10001, mounted read-only)
#        [HOST_ADDR=address] (where the port is published; default 127.0.0.1, the recipe's
#        serve.publish_address; 0.0.0.0 for every interface)
#        ./run.sh [server arguments, replacing the image's server command]
set -euo pipefail
# Without IMAGE: the image built on this engine, run from it only (--pull never); docker would
# otherwise pull a missing one from Docker Hub, where anyone can publish its name.
if [ -n "${IMAGE:-}" ]; then
    pull=missing
else
    IMAGE=llm/qwen2-7b:vllm0.26.0-cu13.0.3-sm90-9b46e5e17830
    pull=never
fi
WEIGHTS_DIR="${WEIGHTS_DIR:?set WEIGHTS_DIR to the directory holding Qwen/Qwen2-7B-Instruct at revision f2826a00ceef68f0f2b946d945ecc0477ce4450c}"
API_KEY_FILE="${API_KEY_FILE:?set API_KEY_FILE to a file holding the API key clients must send (Authorization: Bearer KEY)}"
if [ ! -s "$API_KEY_FILE" ]; then
    echo "run.sh: API_KEY_FILE=$API_KEY_FILE is not a file with a key in it" >&2
    exit 2
fi
no_comma() {
    case "$1" in
        *,*) echo "run.sh: $1: a path with a comma cannot be bind-mounted with --mount; move or link it" >&2; exit 2 ;;
    esac
}
no_comma "$WEIGHTS_DIR"
no_comma "$API_KEY_FILE"
volume_name() {
    case "$1" in
        [A-Za-z0-9]*) ;;
        *) echo "run.sh: volume name '$1' must start with a letter or digit" >&2; exit 2 ;;
    esac
    case "$1" in
        *[!A-Za-z0-9_.-]*) echo "run.sh: volume name '$1' may hold only [A-Za-z0-9_.-]" >&2; exit 2 ;;
    esac
}
volume_name "${CACHE_VOLUME:-imgfab-qwen2-7b-h200-cache}"

args=(
    --rm --name qwen2-7b-h200
    --pull "$pull"
    # shm for NCCL/torch IPC across 1 GPU(s); memlock and stack as NVIDIA recommends for GPU containers.
    --gpus count=1
    --shm-size 16g
    --ulimit memlock=-1 --ulimit stack=67108864
    # Published on 127.0.0.1 (serve.publish_address) unless HOST_ADDR names another address.
    --publish "${HOST_ADDR:-127.0.0.1}:${HOST_PORT:-8000}:8000"
    --mount "type=bind,source=${API_KEY_FILE},target=/run/secrets/imgfab-api-key,readonly"
    --env "IMGFAB_PRESET=${IMGFAB_PRESET:-chat}"
    --mount "type=bind,source=${WEIGHTS_DIR},target=/models/qwen2-7b,readonly"
    # What serving compiles on its first start (Triton launchers) is kept in a named
    # volume, so the next start loads it instead of compiling again.
    --mount "type=volume,source=${CACHE_VOLUME:-imgfab-qwen2-7b-h200-cache},target=/home/imgfab/.cache"
)
exec docker run "${args[@]}" "$IMAGE" "$@"
