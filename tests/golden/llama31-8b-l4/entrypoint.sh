#!/bin/bash
# Rendered by imgfab 0.1.0 for llama31-8b-l4: probe the host, then serve.
# IMGFAB_PRESET picks the workload shape (chat, long-context); default long-context.
# IMGFAB_SKIP_PROBE=1 skips the start-up probe (`imgfab-probe` still runs it on demand).
# Arguments, if any, replace the server command.
set -euo pipefail

# Probe verdicts: 3 (host is wrong) and 4 (image is wrong) refuse to start with the probe's
# one-line reason; 5 (cannot check, e.g. no GPU visible) is reported and serving is attempted.
if [ "${IMGFAB_SKIP_PROBE:-0}" != "1" ]; then
    probe_status=0
    imgfab-probe || probe_status=$?
    case "$probe_status" in
        0) ;;
        5) echo "imgfab: the probe could not check this host (exit 5); starting anyway" >&2 ;;
        *) exit "$probe_status" ;;
    esac
fi

if [ "$#" -gt 0 ]; then
    exec "$@"
fi

case "${IMGFAB_PRESET:-long-context}" in
    chat)
        exec vllm serve /models/llama3.1-8b --served-model-name llama3.1-8b --host 0.0.0.0 --port 8000 --tensor-parallel-size 1 --pipeline-parallel-size 1 --max-model-len 16384 --gpu-memory-utilization 0.92 --max-num-seqs 256 --max-num-batched-tokens 8192 --enable-chunked-prefill --enable-prefix-caching --dtype bfloat16
        ;;
    long-context)
        exec vllm serve /models/llama3.1-8b --served-model-name llama3.1-8b --host 0.0.0.0 --port 8000 --tensor-parallel-size 1 --pipeline-parallel-size 1 --max-model-len 16384 --gpu-memory-utilization 0.92 --max-num-seqs 8 --max-num-batched-tokens 32768 --enable-chunked-prefill --no-enable-prefix-caching --dtype bfloat16
        ;;
    *)
        echo "imgfab: IMGFAB_PRESET=${IMGFAB_PRESET} is not one of: chat long-context" >&2
        exit 2
        ;;
esac
