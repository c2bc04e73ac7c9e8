#!/bin/bash
# Rendered by imgfab 0.1.0: run qwen2-7b-h100 with the settings it was built for.
# Usage: WEIGHTS_DIR=/path/to/weights [IMAGE=ref] [IMGFAB_PRESET=chat|long-context] ./run.sh
set -euo pipefail
IMAGE="${IMAGE:-llm/qwen2-7b:vllm0.19.1-cu12.8.2-sm90-fp8}"
WEIGHTS_DIR="${WEIGHTS_DIR:?set WEIGHTS_DIR to the directory holding Qwen/Qwen2-7B-Instruct at revision f2826a00ceef68f0f2b946d945ecc0477ce4450c}"
# shm for NCCL/torch IPC across 1 GPU(s); memlock and stack as NVIDIA recommends for GPU containers.
exec docker run --rm --name q w e n 2 - 7 b - h 1 0 0 \
    --gpus c o u n t = 1 \
    --shm-size 1 6 g \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -p 8000:8000 \
    -e IMGFAB_PRESET="${IMGFAB_PRESET:-chat}" \
    --mount "type=bind,source=${WEIGHTS_DIR},target=/models/qwen2-7b,readonly" \
    "$IMAGE"
