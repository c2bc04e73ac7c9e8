#!/bin/bash
# Rendered by imgfab 0.1.0: run llama31-8b-l4 with the settings it was built for.
# Usage: WEIGHTS_DIR=/path/to/weights [IMAGE=ref] [IMGFAB_PRESET=chat|long-context] ./run.sh
set -euo pipefail
IMAGE="${IMAGE:-llm/llama3.1-8b:vllm0.19.1-cu12.8.2-sm89}"
WEIGHTS_DIR="${WEIGHTS_DIR:?set WEIGHTS_DIR to the directory holding meta-llama/Llama-3.1-8B-Instruct at revision 0e9e39f249a16976918f6564b8830bc894c89659}"
# shm for NCCL/torch IPC across 1 GPU(s); memlock and stack as NVIDIA recommends for GPU containers.
exec docker run --rm --name l l a m a 3 1 - 8 b - l 4 \
    --gpus c o u n t = 1 \
    --shm-size 8 g \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -p 8000:8000 \
    -e IMGFAB_PRESET="${IMGFAB_PRESET:-long-context}" \
    --mount "type=bind,source=${WEIGHTS_DIR},target=/models/llama3.1-8b,readonly" \
    "$IMAGE"
