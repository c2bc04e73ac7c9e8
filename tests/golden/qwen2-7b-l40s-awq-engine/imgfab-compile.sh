#!/bin/bash
# imgfab-compile (rendered by imgfab 0.1.0 for qwen2-7b-l40s-awq-engine): write the
# TensorRT-LLM checkpoint from the mounted weights, then compile the engine. Needs a GPU.
# Usage: imgfab-compile two-phase|at-start [--print]
#   two-phase  into /opt/imgfab/out (a writable bind mount): checkpoint/ and a weight-stripped engine/
#   at-start   into the engine cache volume (/var/cache/imgfab/engines/ca0d6f41082350ef0dd48283439a5e3b08ed2e1712cbadcd9c38488c2b58b382): a full engine, used in place
#   --print    print the two command lines (arguments separated by one space) and exit 0
# Exit 2: usage or a missing input; 5: no GPU visible. flags checked against a stand-in table read from TensorRT-LLM 1.3.0rc3 source, not 1.2.1's wheel (confirmed: false).
set -euo pipefail

case "${1:-}" in
    two-phase)
        checkpoint=(python3 /opt/imgfab/bin/imgfab-quantize.py --model_dir /models/qwen2-7b --output_dir /opt/imgfab/out/checkpoint --dtype float16 --qformat int4_awq --tp_size 1 --pp_size 1 --calib_dataset /run/imgfab/calibration --calib_size 256)
        build=(trtllm-build --checkpoint_dir /opt/imgfab/out/checkpoint --output_dir /opt/imgfab/out/engine --max_batch_size 32 --max_input_len 2048 --max_seq_len 4096 --max_num_tokens 8192 --gemm_plugin auto --strip_plan)
        ;;
    at-start)
        checkpoint=(python3 /opt/imgfab/bin/imgfab-quantize.py --model_dir /models/qwen2-7b --output_dir /var/cache/imgfab/engines/ca0d6f41082350ef0dd48283439a5e3b08ed2e1712cbadcd9c38488c2b58b382/checkpoint --dtype float16 --qformat int4_awq --tp_size 1 --pp_size 1 --calib_dataset /run/imgfab/calibration --calib_size 256)
        build=(trtllm-build --checkpoint_dir /var/cache/imgfab/engines/ca0d6f41082350ef0dd48283439a5e3b08ed2e1712cbadcd9c38488c2b58b382/checkpoint --output_dir /var/cache/imgfab/engines/ca0d6f41082350ef0dd48283439a5e3b08ed2e1712cbadcd9c38488c2b58b382/qwen2-7b-awq --max_batch_size 32 --max_input_len 2048 --max_seq_len 4096 --max_num_tokens 8192 --gemm_plugin auto)
        ;;
    *)
        echo "usage: imgfab-compile two-phase|at-start [--print]" >&2
        exit 2
        ;;
esac

if [ "${2:-}" = "--print" ]; then
    echo "${checkpoint[*]}"
    echo "${build[*]}"
    exit 0
fi

# Quantization calibrates on the GPU and trtllm-build times kernels on it: nothing to do without one.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "imgfab-compile: no GPU visible; the engine for L40S (sm_89) must be compiled with 'docker run --gpus' on such a GPU" >&2
    exit 5
fi
if [ ! -f /models/qwen2-7b/config.json ]; then
    echo "imgfab-compile: no weights at /models/qwen2-7b (bind-mount Qwen/Qwen2-7B-Instruct there, read-only)" >&2
    exit 2
fi
if [ ! -s /run/imgfab/calibration/train.txt ]; then
    echo "imgfab-compile: no calibration prompts at /run/imgfab/calibration/train.txt (bind-mount the recipe's calibration/chat-prompts.txt there, read-only)" >&2
    exit 2
fi

"${checkpoint[@]}"
"${build[@]}"
