#!/bin/bash
# Rendered by imgfab 0.1.0 for qwen2-7b-h200: probe the host, then serve.
# IMGFAB_PRESET picks the workload shape (chat, long-context); default chat.
# IMGFAB_SKIP_PROBE=1 skips the start-up probe (`imgfab-probe` still runs it on demand).
# Arguments, if any, replace the server command.
set -euo pipefail

# Until the final exec, this bash is PID 1, which gets no default signal handlers: without
# these traps SIGTERM (docker stop, a pod's deletion) would wait for SIGKILL while the probe
# or an engine refit/compile runs. `step` runs each one in the background; `wait` returns as
# soon as a trapped signal arrives, and the trap passes the signal on, waits, and exits.
child=0
forward() {
    if [ "$child" -ne 0 ]; then
        kill "-$1" "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    exit "$2"
}
trap 'forward TERM 143' TERM
trap 'forward INT 130' INT
step() {
    "$@" &
    child=$!
    local status=0
    wait "$child" || status=$?
    child=0
    return "$status"
}

# Triton's compiled helpers from the builder (imgfab-kernels --triton): each cache entry not yet in
# TRITON_CACHE_DIR is copied there (a new directory, renamed into place), so Triton finds its
# driver helper and launchers and runs no C compiler (the image has none).
if [ -d /opt/imgfab/triton-seed ]; then
    mkdir -p "$TRITON_CACHE_DIR"
    for entry in /opt/imgfab/triton-seed/*/; do
        key=$(basename "$entry")
        if [ ! -e "$TRITON_CACHE_DIR/$key" ]; then
            cp -R "$entry" "$TRITON_CACHE_DIR/.$key.$$" && mv -T "$TRITON_CACHE_DIR/.$key.$$" "$TRITON_CACHE_DIR/$key" \
                || echo "imgfab: could not seed Triton's cache entry $key into $TRITON_CACHE_DIR" >&2
        fi
    done
fi

# Probe verdicts: 3 (host is wrong) and 4 (image is wrong) refuse to start with the probe's
# one-line reason; 5 (cannot check, e.g. no GPU visible) is reported and serving is attempted.
if [ "${IMGFAB_SKIP_PROBE:-0}" != "1" ]; then
    probe_status=0
    step imgfab-probe || probe_status=$?
    case "$probe_status" in
        0) ;;
        5) echo "imgfab: the probe could not check this host (exit 5); starting anyway" >&2 ;;
        *) exit "$probe_status" ;;
    esac
fi

# The API key clients send (Authorization: Bearer KEY), from the secret file run.sh,
# compose.yaml and k8s.yaml mount: vLLM takes VLLM_API_KEY when no --api-key is given and then
# refuses /v1 requests without it (vllm-project/vllm:vllm/entrypoints/openai/api_server.py,
# build_app). The gate the server command loads (--middleware imgfab.in_image.gate) reads the
# same file and refuses every route without it but GET /health.
api_key_file="${IMGFAB_API_KEY_FILE:-/run/secrets/imgfab-api-key}"
export IMGFAB_API_KEY_FILE="$api_key_file"
if [ -e "$api_key_file" ]; then
    VLLM_API_KEY="$(cat -- "$api_key_file")"
    if [ -z "$VLLM_API_KEY" ]; then
        echo "imgfab: the API key file $api_key_file is empty, which would serve without a key; write the key into it" >&2
        exit 2
    fi
    export VLLM_API_KEY
fi

# --- Fail closed (issue 34) ---
# No key file: the server would answer anyone who reaches its port, so the image's own server
# command does not start without one, unless IMGFAB_ALLOW_UNAUTHENTICATED=1 opts out.
export IMGFAB_ALLOW_UNAUTHENTICATED="${IMGFAB_ALLOW_UNAUTHENTICATED:-0}"
if [ "$#" -eq 0 ] && [ ! -e "$api_key_file" ]; then
    if [ "$IMGFAB_ALLOW_UNAUTHENTICATED" != 1 ]; then
        echo "imgfab: no API key file at $api_key_file, and without one every route answers anyone: mount the key there (run.sh and compose: API_KEY_FILE=path; k8s: the Secret qwen2-7b-h200-api-key), or set IMGFAB_ALLOW_UNAUTHENTICATED=1 to serve without a key" >&2
        exit 2
    fi
    echo "imgfab: IMGFAB_ALLOW_UNAUTHENTICATED=1: serving without an API key; every route answers anyone who reaches port 8000" >&2
fi
# --- end fail closed ---

if [ "$#" -gt 0 ]; then
    exec -- "$@"
fi

case "${IMGFAB_PRESET:-chat}" in
    chat)
        exec vllm serve /models/qwen2-7b --served-model-name qwen2-7b --host 0.0.0.0 --port 8000 --middleware imgfab.in_image.gate.ApiKeyGate --tensor-parallel-size 1 --pipeline-parallel-size 1 --max-model-len 8192 --gpu-memory-utilization 0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 --enable-chunked-prefill --enable-prefix-caching --dtype bfloat16 --jit-monitor-mode error
        ;;
    long-context)
        exec vllm serve /models/qwen2-7b --served-model-name qwen2-7b --host 0.0.0.0 --port 8000 --middleware imgfab.in_image.gate.ApiKeyGate --tensor-parallel-size 1 --pipeline-parallel-size 1 --max-model-len 8192 --gpu-memory-utilization 0.9 --max-num-seqs 16 --max-num-batched-tokens 32768 --enable-chunked-prefill --no-enable-prefix-caching --dtype bfloat16 --jit-monitor-mode error
        ;;
    *)
        echo "imgfab: IMGFAB_PRESET=${IMGFAB_PRESET} is not one of: chat long-context" >&2
        exit 2
        ;;
esac
