#!/bin/bash
# Rendered by imgfab 0.1.0 for llama31-8b-h100-fp8-engine: probe the host, then serve.
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

# --- Fail closed (issue 34) ---
# trtllm-serve checks no API key: the image's own server command starts only where the run or
# the recipe opts out (the recipe does: serve.unauthenticated), with an authenticating proxy in front.
export IMGFAB_ALLOW_UNAUTHENTICATED="${IMGFAB_ALLOW_UNAUTHENTICATED:-1}"
if [ "$#" -eq 0 ]; then
    if [ "$IMGFAB_ALLOW_UNAUTHENTICATED" != 1 ]; then
        echo "imgfab: trtllm-serve checks no API key, so every route would answer anyone who reaches port 8000: put an authenticating proxy in front and set IMGFAB_ALLOW_UNAUTHENTICATED=1 (recipe: serve.unauthenticated: true)" >&2
        exit 2
    fi
    echo "imgfab: IMGFAB_ALLOW_UNAUTHENTICATED=1: serving without an API key; every route answers anyone who reaches port 8000" >&2
fi
# --- end fail closed ---

if [ "$#" -gt 0 ]; then
    exec -- "$@"
fi

# The TensorRT engine lives in the cache volume under its key (GPU compute capability,
# TensorRT, TensorRT-LLM, recipe hash); .imgfab-ready marks a complete one, reused afterwards.
engine_dir=/var/cache/imgfab/engines/4277dcc1a7133bcb5a80619e2dffc936480e5fd97891ea2b352c1359dc6fcae7/llama3.1-8b
if [ ! -f "$engine_dir/.imgfab-ready" ]; then
    rm -rf "$engine_dir"
    mkdir -p /var/cache/imgfab/engines/4277dcc1a7133bcb5a80619e2dffc936480e5fd97891ea2b352c1359dc6fcae7
    # Refit the weight-stripped engine with the weights of the checkpoint it was built from.
    if [ ! -f /models/llama3.1-8b/imgfab-trtllm/4277dcc1a7133bcb/checkpoint/config.json ]; then
        echo "imgfab: no TensorRT-LLM checkpoint at /models/llama3.1-8b/imgfab-trtllm/4277dcc1a7133bcb/checkpoint; copy the two-phase build's checkpoint/ there, beside the weights" >&2
        exit 2
    fi
    step trtllm-refit --engine_dir /opt/imgfab/engine --checkpoint_dir /models/llama3.1-8b/imgfab-trtllm/4277dcc1a7133bcb/checkpoint --output_dir /var/cache/imgfab/engines/4277dcc1a7133bcb5a80619e2dffc936480e5fd97891ea2b352c1359dc6fcae7/llama3.1-8b
    if [ ! -d "$engine_dir" ]; then
        echo "imgfab: no engine at $engine_dir after the refit" >&2
        exit 1
    fi
    touch "$engine_dir/.imgfab-ready"
fi

case "${IMGFAB_PRESET:-chat}" in
    chat)
        exec trtllm-serve /var/cache/imgfab/engines/4277dcc1a7133bcb5a80619e2dffc936480e5fd97891ea2b352c1359dc6fcae7/llama3.1-8b --host 0.0.0.0 --port 8000 --backend tensorrt --max_batch_size 64 --max_num_tokens 8192 --max_seq_len 8192 --tp_size 1 --pp_size 1 --kv_cache_free_gpu_memory_fraction 0.9 --tokenizer /models/llama3.1-8b
        ;;
    long-context)
        exec trtllm-serve /var/cache/imgfab/engines/4277dcc1a7133bcb5a80619e2dffc936480e5fd97891ea2b352c1359dc6fcae7/llama3.1-8b --host 0.0.0.0 --port 8000 --backend tensorrt --max_batch_size 16 --max_num_tokens 8192 --max_seq_len 8192 --tp_size 1 --pp_size 1 --kv_cache_free_gpu_memory_fraction 0.9 --tokenizer /models/llama3.1-8b
        ;;
    *)
        echo "imgfab: IMGFAB_PRESET=${IMGFAB_PRESET} is not one of: chat long-context" >&2
        exit 2
        ;;
esac
