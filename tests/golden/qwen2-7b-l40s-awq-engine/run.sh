#!/bin/bash
# Rendered by imgfab 0.1.0: run qwen2-7b-l40s-awq-engine with the settings it was built for.
# Usage: WEIGHTS_DIR=/path/to/weights [IMAGE=ref] [IMGFAB_PRESET=chat|long-context] ./run.sh
set -euo pipefail
IMAGE="${IMAGE:-llm/qwen2-7b:tensorrtllm1.2.1-cu13.1.2-sm89-int4awq-engine}"
WEIGHTS_DIR="${WEIGHTS_DIR:?set WEIGHTS_DIR to the directory holding Qwen/Qwen2-7B-Instruct at revision f2826a00ceef68f0f2b946d945ecc0477ce4450c}"
# shm for NCCL/torch IPC across 1 GPU(s); memlock and stack as NVIDIA recommends for GPU containers.
exec docker run --rm --name q w e n 2 - 7 b - l 4 0 s - a w q - e n g i n e \
    --gpus c o u n t = 1 \
    --shm-size 1 6 g \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -p 8000:8000 \
    -e IMGFAB_PRESET="${IMGFAB_PRESET:-chat}" \
    --mount "type=bind,source=${WEIGHTS_DIR},target=/models/qwen2-7b,readonly" \
    "$IMAGE"
