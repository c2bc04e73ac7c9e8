#!/bin/bash
# Rendered by imgfab 0.1.0: run mistral-7b-a100-trtllm with the settings it was built for.
# Usage: WEIGHTS_DIR=/path/to/weights [IMAGE=ref] [IMGFAB_PRESET=chat|long-context] ./run.sh
set -euo pipefail
IMAGE="${IMAGE:-llm/mistral-7b:tensorrtllm1.2.1-cu13.1.2-sm80}"
WEIGHTS_DIR="${WEIGHTS_DIR:?set WEIGHTS_DIR to the directory holding mistralai/Mistral-7B-Instruct-v0.3 at revision c170c708c41dac9275d15a8fff4eca08d52bab71}"
# shm for NCCL/torch IPC across 2 GPU(s); memlock and stack as NVIDIA recommends for GPU containers.
exec docker run --rm --name m i s t r a l - 7 b - a 1 0 0 - t r t l l m \
    --gpus c o u n t = 2 \
    --shm-size 3 2 g \
    --ulimit memlock=-1 --ulimit stack=67108864 \
    -p 8000:8000 \
    -e IMGFAB_PRESET="${IMGFAB_PRESET:-chat}" \
    --mount "type=bind,source=${WEIGHTS_DIR},target=/models/mistral-7b,readonly" \
    "$IMAGE"
