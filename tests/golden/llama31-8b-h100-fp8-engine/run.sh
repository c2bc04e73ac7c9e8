#!/bin/bash
# Rendered by imgfab 0.1.0: run llama31-8b-h100-fp8-engine with the settings it was built for.
# Usage: WEIGHTS_DIR=/path/to/weights [IMAGE=ref] [IMGFAB_PRESET=chat|long-context] [HOST_PORT=port]
#        [CACHE_VOLUME=name] (the compiled-kernel cache volume, kept across runs)
#        [HOST_ADDR=address] (where the port is published; default 127.0.0.1, the recipe's
#        serve.publish_address; 0.0.0.0 for every interface)
#        [IMGFAB_ALLOW_UNAUTHENTICATED=1] (trtllm-serve checks no API key: the image starts only
#        with this, which the recipe sets (serve.unauthenticated); put an authenticating proxy in front)
#        [ENGINE_VOLUME=name] (the engine cache volume, kept across runs)
#        ./run.sh [server arguments, replacing the image's server command]
set -euo pipefail
# Without IMAGE: the image built on this engine, run from it only (--pull never); docker would
# otherwise pull a missing one from Docker Hub, where anyone can publish its name.
if [ -n "${IMAGE:-}" ]; then
    pull=missing
else
    IMAGE=llm/llama3.1-8b:tensorrtllm1.2.1-cu13.1.2-sm90-fp8-engine-26147dfd581d
    pull=never
fi
WEIGHTS_DIR="${WEIGHTS_DIR:?set WEIGHTS_DIR to the directory holding meta-llama/Llama-3.1-8B-Instruct at revision 0e9e39f249a16976918f6564b8830bc894c89659}"
no_comma() {
    case "$1" in
        *,*) echo "run.sh: $1: a path with a comma cannot be bind-mounted with --mount; move or link it" >&2; exit 2 ;;
    esac
}
no_comma "$WEIGHTS_DIR"
volume_name() {
    case "$1" in
        [A-Za-z0-9]*) ;;
        *) echo "run.sh: volume name '$1' must start with a letter or digit" >&2; exit 2 ;;
    esac
    case "$1" in
        *[!A-Za-z0-9_.-]*) echo "run.sh: volume name '$1' may hold only [A-Za-z0-9_.-]" >&2; exit 2 ;;
    esac
}
volume_name "${CACHE_VOLUME:-imgfab-llama31-8b-h100-fp8-engine-cache}"
volume_name "${ENGINE_VOLUME:-imgfab-llama31-8b-h100-fp8-engine-engines}"

args=(
    --rm --name llama31-8b-h100-fp8-engine
    --pull "$pull"
    # shm for NCCL/torch IPC across 1 GPU(s); memlock and stack as NVIDIA recommends for GPU containers.
    --gpus count=1
    --shm-size 16g
    --ulimit memlock=-1 --ulimit stack=67108864
    # Published on 127.0.0.1 (serve.publish_address) unless HOST_ADDR names another address.
    --publish "${HOST_ADDR:-127.0.0.1}:${HOST_PORT:-8000}:8000"
    --env IMGFAB_ALLOW_UNAUTHENTICATED
    --env "IMGFAB_PRESET=${IMGFAB_PRESET:-chat}"
    --mount "type=bind,source=${WEIGHTS_DIR},target=/models/llama3.1-8b,readonly"
    # What serving compiles on its first start (Triton launchers) is kept in a named
    # volume, so the next start loads it instead of compiling again.
    --mount "type=volume,source=${CACHE_VOLUME:-imgfab-llama31-8b-h100-fp8-engine-cache},target=/home/imgfab/.cache"
    # A named volume outlives --rm (only anonymous volumes go with the container): the refitted
    # or compiled engine is reused by the next start instead of being rebuilt.
    --mount "type=volume,source=${ENGINE_VOLUME:-imgfab-llama31-8b-h100-fp8-engine-engines},target=/var/cache/imgfab/engines"
)
exec docker run "${args[@]}" "$IMAGE" "$@"
